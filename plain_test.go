package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// TestPlainPathAgrees runs one workload of successes, retried failures and dead letters
// through stages that take the engine's plain path (a worker calls the function and
// hands on its output itself) and through the same stages kept off it by a circuit
// breaker that never opens: the outputs, the dead letters and every count agree, for
// unordered and ordered stages, buffered, rendezvous and keyed queues, with and without
// a timeout and an error budget.
func TestPlainPathAgrees(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	// outcome of attempt a (1, 2, ...) of item v: by a fixed hash of both.
	fn := func(_ context.Context, v int) (int, error) { return v * 3, nil }
	outcome := func(v, a int) error {
		switch h := (uint64(v)*2654435761 + uint64(a)*40503) % 97; {
		case h < 8:
			return pipeline.Transient(fmt.Errorf("item %d attempt %d: %w", v, a, errBoom))
		case h < 12:
			return pipeline.Permanent(fmt.Errorf("item %d: %w", v, errBoom))
		}
		return nil
	}
	type result struct {
		out, dead []int
		rows      []pipeline.StageReport
	}
	run := func(t *testing.T, queue string, ordered, timeout, budget, offPlain bool) result {
		t.Helper()
		const n = 3000
		items := make([]int, n)
		for i := range items {
			items[i] = i
		}
		var mu sync.Mutex
		var res result
		attempts := make([]int, n) // per item: touched by one worker at a time
		opts := []pipeline.StageOption{
			pipeline.WithRetry(3, pipeline.ConstantBackoff(0)),
			pipeline.WithDeadLetter(func(_ context.Context, dl pipeline.DeadLetter[int]) error {
				mu.Lock()
				defer mu.Unlock()
				res.dead = append(res.dead, dl.Item)
				return nil
			}),
		}
		if ordered {
			opts = append(opts, pipeline.WithOrdered(0))
		}
		if timeout {
			opts = append(opts, pipeline.WithTimeout(time.Hour))
		}
		buf := 16
		switch queue {
		case "rendezvous":
			buf = 0
		case "keyed":
			opts = append(opts, pipeline.WithKey(func(v int) int { return v % 5 }))
		}
		if budget { // it sees every settled item, and never trips here
			opts = append(opts, pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.9, MinSample: 10, Window: 100}))
		}
		if offPlain {
			opts = append(opts, pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 1 << 30}))
		}
		p := pipeline.New(pipeline.WithBuffer(buf))
		s := pipeline.Then(pipeline.FromSlice(p, items), pipeline.NewStage("work", 3, func(ctx context.Context, v int) (int, error) {
			attempts[v]++
			if err := outcome(v, attempts[v]); err != nil {
				return 0, err
			}
			return fn(ctx, v)
		}, opts...))
		pipeline.To(s, pipeline.NewSink("sink", 1, func(_ context.Context, v int) error {
			res.out = append(res.out, v)
			return nil
		}))
		require.NoError(t, p.Run(t.Context()))
		rep := p.Report()
		for _, name := range []string{"work", "sink"} {
			r := row(t, rep, name)
			r.Rate, r.QueueCap, r.PeakQueue = 0, 0, 0 // timing, not outcomes
			r.Latency = pipeline.Latency{}
			r.Breaker = nil
			res.rows = append(res.rows, r)
		}
		if !ordered {
			slices.Sort(res.out)
		}
		slices.Sort(res.dead)
		return res
	}
	for _, queue := range []string{"buffered", "rendezvous", "keyed"} {
		for _, ordered := range []bool{false, true} {
			for _, timeout := range []bool{false, true} {
				for _, budget := range []bool{false, true} {
					if queue == "keyed" && ordered {
						continue // a keyed stage keeps each key's order already
					}
					t.Run(fmt.Sprintf("queue=%s/ordered=%v/timeout=%v/budget=%v", queue, ordered, timeout, budget), func(t *testing.T) {
						t.Parallel()
						plain := run(t, queue, ordered, timeout, budget, false)
						off := run(t, queue, ordered, timeout, budget, true)
						assert.NotEmpty(t, plain.dead, "the workload dead-letters some items")
						assert.Equal(t, off.out, plain.out, "outputs")
						assert.Equal(t, off.dead, plain.dead, "dead letters")
						assert.Equal(t, off.rows, plain.rows, "counts")
					})
				}
			}
		}
	}
}
