package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

func ackBody(n int, settle func(i int) func(pipeline.Settlement)) func(context.Context, func(int, func(pipeline.Settlement)) error) error {
	return func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		for i := range n {
			if err := emit(i, settle(i)); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestFromAckedMisuse(t *testing.T) {
	t.Parallel()
	body := ackBody(1, func(int) func(pipeline.Settlement) { return nil })
	assertPanicsPipeline(t, func() { pipeline.FromAcked[int](nil, body) })
	assertPanicsPipeline(t, func() { pipeline.FromAcked[int](pipeline.New(), nil) })
	assertPanicsPipeline(t, func() { pipeline.WithMaxPending(0) })
	assertPanicsPipeline(t, func() { pipeline.FromAcked(pipeline.New(), body, nil) })
	p := pipeline.New()
	pipeline.FromAcked(p, body)
	msg := assertPanicsPipeline(t, func() { pipeline.FromAcked(p, body) })
	assert.Contains(t, msg, "tracked source")
	assertPanicsPipeline(t, func() { pipeline.FromCheckpoint(p, &memStore{}, from(3)) })
	q := pipeline.New()
	pipeline.FromCheckpoint(q, &memStore{}, from(3))
	assertPanicsPipeline(t, func() { pipeline.FromAcked(q, body) })
}

// TestFromAckedOutcomes: a Tee whose branches commit, filter and dead-letter the copies
// of one item settles it once, with the outcome of the worst copy; a nil callback is
// allowed; the report has no checkpoint.
func TestFromAckedOutcomes(t *testing.T) {
	t.Parallel()
	got := make([]pipeline.Settlement, 6)
	var calls atomic.Int64
	p := pipeline.New()
	src := pipeline.FromAcked(p, ackBody(7, func(i int) func(pipeline.Settlement) {
		if i == 6 {
			return nil
		}
		return func(s pipeline.Settlement) {
			calls.Add(1)
			got[i] = s
		}
	}))
	br := pipeline.Tee(src, 2)
	pipeline.To(pipeline.Filter(br[0], func(i int) bool { return i%2 == 0 }), pipeline.NewSink("even", 2, func(context.Context, int) error { return nil }))
	pipeline.ToBatches(br[1], 2, pipeline.NewSink("batches", 1, func(_ context.Context, b []int) error {
		if slices.Contains(b, 3) {
			return pipeline.Permanent(errBoom) // the whole batch is set aside
		}
		return nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[[]int])))
	require.NoError(t, p.Run(t.Context()))
	assert.Equal(t, int64(6), calls.Load())
	for i, s := range got {
		if i == 2 || i == 3 { // batch [2 3]
			assert.Equal(t, pipeline.DeadLettered, s.Outcome, "item %d", i)
			assert.Equal(t, "batches", s.DeadLetter.Stage)
		} else {
			assert.Equal(t, pipeline.Committed, s.Outcome, "item %d", i)
		}
	}
	assert.Equal(t, int64(-1), p.Report().Checkpoint)
}

// TestFromAckedSettlePanics: a panic in a settle callback fails the run like a stage's
// panic, and every other item is still settled once.
func TestFromAckedSettlePanics(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	p := pipeline.New()
	src := pipeline.FromAcked(p, ackBody(20, func(i int) func(pipeline.Settlement) {
		return func(pipeline.Settlement) {
			calls.Add(1)
			if i == 5 {
				panic("settle")
			}
		}
	}))
	pipeline.To(src, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
	err := p.Run(t.Context())
	_, ok := errors.AsType[*pipeline.PanicError](err)
	require.True(t, ok, "want a panic error, got %v", err)
	assert.LessOrEqual(t, calls.Load(), int64(20))
	assert.GreaterOrEqual(t, calls.Load(), int64(6))
	checkAccounting(t, p.Report())
}

// TestFromAckedEmitRefused: once the run stops (canceled, or a budget drained it),
// emit refuses items, and each item offered is settled once all the same: a refused
// one as not processed.
func TestFromAckedEmitRefused(t *testing.T) {
	t.Parallel()
	for _, drain := range []bool{false, true} {
		outcomes := map[pipeline.Outcome]int{}
		var mu sync.Mutex
		settle := func(s pipeline.Settlement) {
			mu.Lock()
			outcomes[s.Outcome]++
			mu.Unlock()
		}
		offered, refused := 0, 0
		p := pipeline.New()
		ctx, cancel := context.WithCancel(t.Context())
		src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
			for i := range 100 {
				offered++
				if err := emit(i, settle); err != nil {
					refused++
					offered++
					if err := emit(i+100, settle); err == nil { // a source may go on offering
						return errors.New("emit took an item after refusing one")
					}
					return err
				}
			}
			return nil
		})
		var opts []pipeline.StageOption
		if drain {
			opts = append(opts, pipeline.WithErrorBudget(pipeline.Budget{MinSample: 1, Drain: true}), pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]))
		}
		pipeline.To(src, pipeline.NewSink("s", 1, func(_ context.Context, i int) error {
			if i == 10 {
				if drain {
					return pipeline.Permanent(errBoom)
				}
				cancel()
			}
			return nil
		}, opts...))
		err := p.Run(ctx)
		cancel()
		require.Error(t, err)
		assert.Equal(t, 1, refused, "drain=%v", drain)
		total := 0
		for _, c := range outcomes {
			total += c
		}
		assert.Equal(t, offered, total, "drain=%v: every item offered is settled once", drain)
		assert.Positive(t, outcomes[pipeline.NotProcessed], "drain=%v", drain)
		assert.Positive(t, outcomes[pipeline.Committed], "drain=%v", drain)
		checkAccounting(t, p.Report())
	}
}

// TestHandBackDelay: the delay of a handed-back item is the stage's backoff, or the
// longer one a RetryAfter error asks; Commit in a sink of an acknowledged run settles
// nothing itself, and the item is committed when the sink returns.
func TestHandBackDelay(t *testing.T) {
	t.Parallel()
	got := make([]pipeline.Settlement, 3)
	p := pipeline.New()
	src := pipeline.FromAcked(p, ackBody(3, func(i int) func(pipeline.Settlement) {
		return func(s pipeline.Settlement) { got[i] = s }
	}))
	pipeline.To(src, pipeline.NewSink("s", 1, func(ctx context.Context, i int) error {
		switch i {
		case 0:
			return pipeline.Transient(errBoom)
		case 1:
			return pipeline.RetryAfter(errBoom, time.Minute)
		}
		return pipeline.Commit(ctx, func(context.Context, pipeline.Progress) error { return nil })
	}, pipeline.WithHandBack(), pipeline.WithRetry(1, pipeline.ConstantBackoff(time.Second))))
	require.NoError(t, p.Run(t.Context()))
	assert.Equal(t, pipeline.HandedBack, got[0].Outcome)
	assert.Equal(t, time.Second, got[0].Delay)
	assert.Equal(t, pipeline.HandedBack, got[1].Outcome)
	assert.Equal(t, time.Minute, got[1].Delay)
	assert.Equal(t, pipeline.Committed, got[2].Outcome)
	rep := p.Report()
	assert.Equal(t, int64(2), rep.Stages[1].DeadLettered)
	checkAccounting(t, rep)
}

// TestFromAckedWrappedDrainingError: a FromAcked function that wraps emit's error under
// a drained budget made Run return the source's internal draining error, not the
// *BudgetError.
func TestFromAckedWrappedDrainingError(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	outcomes := map[pipeline.Outcome]int{}
	settle := func(s pipeline.Settlement) {
		mu.Lock()
		outcomes[s.Outcome]++
		mu.Unlock()
	}
	offered := 0
	p := pipeline.New()
	src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		for i := range 1000 {
			offered++
			if err := emit(i, settle); err != nil {
				return fmt.Errorf("read %d: %w", i, err)
			}
		}
		return nil
	})
	pipeline.To(src, pipeline.NewSink("s", 1, func(context.Context, int) error {
		return pipeline.Permanent(errBoom) // every item: the budget trips at the first
	}, pipeline.WithErrorBudget(pipeline.Budget{MinSample: 1, Drain: true}), discardDead[int]()))

	err := p.Run(t.Context())

	require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
	be, ok := errors.AsType[*pipeline.BudgetError](err)
	require.Truef(t, ok, "want a *BudgetError, got %v", err)
	assert.True(t, be.Drained)
	se, ok := errors.AsType[*pipeline.StageError](err)
	require.True(t, ok)
	assert.Equal(t, "s", se.Stage, "the stage whose budget drained, not the source")
	total := 0
	for _, c := range outcomes {
		total += c
	}
	assert.Equal(t, offered, total, "every item offered is settled once")
	assert.Positive(t, outcomes[pipeline.NotProcessed])
	checkAccounting(t, p.Report())
}
