package scenario

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/gopipeline/pipeline"
)

// Start runs p in a goroutine; the channel gives Run's error.
func Start(ctx context.Context, p *pipeline.Pipeline) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	return errc
}

// Await waits until ch is closed (nil) or ctx is done (its error), as a stage function
// held at a test's gate does.
func Await(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// HoldHead returns a stage's function that returns its item at once, but item 0 only
// once release is closed (or its context's error when that is done first).
func HoldHead(release <-chan struct{}) func(context.Context, int) (int, error) {
	return func(ctx context.Context, i int) (int, error) {
		if i == 0 {
			if err := Await(ctx, release); err != nil {
				return 0, err
			}
		}
		return i, nil
	}
}

// OrderedHeadHeld builds a pipeline whose ordered stage "ordered" (4 workers) holds the
// head item 0 until release is closed (or its context is done), so that items 1..3
// finish and wait in the reorder window; a sink "sink" takes them after it. During the
// run the window holds 3 items and 1 is in flight; at the end all 4 have succeeded.
func OrderedHeadHeld(release <-chan struct{}) *pipeline.Pipeline {
	p := pipeline.New()
	ordered := pipeline.Then(pipeline.FromSlice(p, []int{0, 1, 2, 3}), pipeline.NewStage("ordered", 4,
		HoldHead(release), pipeline.WithOrdered(0)))
	pipeline.To(ordered, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	return p
}

// StoreBlocked builds a pipeline (WithBuffer(4)) of 100 items through a stage "double"
// of 2 workers into a sink "store" of 1 worker that holds each item until release is
// closed (or its context is done). Until then the run fills up and blocks: store's
// worker is busy, the queues in front of it are full, and the source waits with an
// item in hand. (The Map, inline, keeps the source a goroutine that hands its items
// on: a FromSlice straight into a stage has its items taken in place, none in hand.)
func StoreBlocked(release <-chan struct{}) *pipeline.Pipeline {
	p := pipeline.New(pipeline.WithBuffer(4))
	ids := pipeline.Map(pipeline.FromSlice(p, make([]int, 100)), func(i int) int { return i + 1 })
	doubled := pipeline.Then(ids, pipeline.NewStage("double", 2,
		func(_ context.Context, i int) (int, error) { return 2 * i, nil }))
	pipeline.To(doubled, pipeline.NewSink("store", 1, func(ctx context.Context, _ int) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	return p
}

// ItemsPerRun builds a pipeline of a source into a sink "sink" whose runs each take
// *n items, 0 ... *n-1, read when the run starts.
func ItemsPerRun(n *int) *pipeline.Pipeline {
	p := pipeline.New()
	pipeline.To(pipeline.FromSeq(p, func(yield func(int) bool) {
		for i := range *n {
			if !yield(i) {
				return
			}
		}
	}), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	return p
}

// StuckAttempt builds a pipeline of 1 item into a sink "wait" with a timeout of 100 ms
// whose function ignores its context: its attempt is stuck until release is closed.
func StuckAttempt(release <-chan struct{}) *pipeline.Pipeline {
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []int{1}), pipeline.NewSink("wait", 1, func(context.Context, int) error {
		<-release
		return nil
	}, pipeline.WithTimeout(100*time.Millisecond)))
	return p
}

// FilterBatch builds a pipeline of 1..6 through a Filter of the odd ones (3 dropped),
// a stage "square" of 2 workers, and batches of 2 into a sink "save": 2 batches, one
// flushed by size and one at the end. opts go to pipeline.New.
func FilterBatch(opts ...pipeline.PipelineOption) *pipeline.Pipeline {
	p := pipeline.New(opts...)
	odd := pipeline.Filter(pipeline.FromSlice(p, []int{1, 2, 3, 4, 5, 6}), func(i int) bool { return i%2 == 1 })
	squares := pipeline.Then(odd, pipeline.NewStage("square", 2, func(_ context.Context, i int) (int, error) { return i * i, nil }))
	pipeline.ToBatches(squares, 2, pipeline.NewSink("save", 1, func(context.Context, []int) error { return nil }))
	return p
}

// RowName returns the name of the first row of the given kind in p's snapshot (the
// pipeline names the rows it adds itself: sources, filters, batches), and fails tb when
// there is none.
func RowName(tb testing.TB, p *pipeline.Pipeline, kind pipeline.Kind) string {
	tb.Helper()
	for _, s := range p.Snapshot().Stages {
		if s.Kind == kind {
			return s.Name
		}
	}
	tb.Fatalf("no row of kind %s in\n%v", kind, p.Snapshot())
	return ""
}

// KeyOneDown builds a pipeline of 20 items into a sink "call" of 2 workers with a
// breaker per key (v % 2; one failure opens it, for a minute): while down is true,
// key 1's calls fail (transient), so that its breaker opens and holds key 1's items,
// while key 0's go through. Once down is false, the probe at a minute closes it.
func KeyOneDown(down *atomic.Bool) *pipeline.Pipeline {
	p := pipeline.New()
	call := pipeline.NewSink("call", 2, func(_ context.Context, v int) error {
		if v%2 == 1 && down.Load() {
			return pipeline.Transient(errors.New("503"))
		}
		return nil
	}, pipeline.WithRetry(2, nil), pipeline.WithBreakerPerKey(func(v int) int { return v % 2 },
		pipeline.Breaker{Failures: 1, OpenFor: time.Minute}, pipeline.KeyBounds{}))
	items := make([]int, 20)
	for i := range items {
		items[i] = i
	}
	pipeline.To(pipeline.FromSlice(p, items), call)
	return p
}

// ClientDownThree builds a pipeline of 100 items through a stage "call" of 4 workers
// with the client options (3 attempts; a breaker that 3 failures open for 2 s; a rate
// limit of 1,000/s; adaptive workers from 1) whose service fails its first 3 calls
// (transient) and then takes 1 ms, into a sink "plain" with none of them. In virtual
// time the breaker opens once, for OpenFor and the successful probe's 1 ms.
func ClientDownThree() *pipeline.Pipeline {
	var calls atomic.Int64
	p := pipeline.New()
	call := pipeline.NewStage("call", 4, func(_ context.Context, v int) (int, error) {
		if calls.Add(1) <= 3 {
			return 0, pipeline.Transient(errors.New("503"))
		}
		time.Sleep(time.Millisecond)
		return v, nil
	}, pipeline.WithRetry(3, nil), pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 3, OpenFor: 2 * time.Second}),
		pipeline.WithRateLimit(rate.NewLimiter(1000, 1)), pipeline.WithAdaptiveWorkers(1))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, make([]int, 100)), call), pipeline.NewSink("plain", 1, func(context.Context, int) error { return nil }))
	return p
}

// HandBack builds a pipeline of an acknowledged source of 5 items into a stage "call"
// (WithHandBack, 2 attempts) whose odd items fail transiently, so that 1 and 3 are
// handed back, and a sink "sink" that dead-letters item 4 into its own destination,
// which counts it in kept.
func HandBack(kept *atomic.Int64) *pipeline.Pipeline {
	p := pipeline.New()
	msgs := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		for i := range 5 {
			if err := emit(i, func(pipeline.Settlement) {}); err != nil {
				return err
			}
		}
		return nil
	})
	call := pipeline.NewStage("call", 2, func(_ context.Context, v int) (int, error) {
		if v%2 == 1 {
			return 0, pipeline.Transient(errors.New("503"))
		}
		return v, nil
	}, pipeline.WithHandBack(), pipeline.WithRetry(1, nil))
	pipeline.To(pipeline.Then(msgs, call), pipeline.NewSink("sink", 1, func(_ context.Context, v int) error {
		if v == 4 {
			return pipeline.Permanent(errors.New("bad record"))
		}
		return nil
	}, pipeline.WithDeadLetter(func(context.Context, pipeline.DeadLetter[int]) error { kept.Add(1); return nil })))
	return p
}
