// Regression tests for bugs an independent review found (and that are fixed): each
// comment describes the bug as it was. Everything timed runs in testing/synctest.
package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// R2: a WithTimeout attempt context that a goroutine first looks at after the attempt
// returned is reused for the worker's next attempt; its timer (armed with the OLD
// deadline) then cancels the next attempt, which starts already "deadline exceeded".
func TestRegressionAttemptCtxReusedAfterEscape(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		var bg sync.WaitGroup
		src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
			if err := emit(0); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond) // longer than the timeout: item 0's ctx expires
			return emit(1)
		})
		var errAt1 error
		st := pipeline.NewStage("s", 1, func(ctx context.Context, v int) (int, error) {
			if v == 0 {
				bg.Go(func() { // fire-and-forget work that watches ctx, started a little later
					time.Sleep(5 * time.Millisecond)
					<-ctx.Done()
				})
				return v, nil
			}
			errAt1 = ctx.Err() // a brand-new attempt: its 20ms have not started to run
			return v, ctx.Err()
		}, pipeline.WithTimeout(20*time.Millisecond))
		pipeline.To(pipeline.Then(src, st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		err := p.Run(context.Background())
		bg.Wait()
		assert.NoError(t, errAt1, "item 1's fresh attempt context is already done")
		assert.NoError(t, err)
	})
}

var (
	_ = errors.New
	_ = require.NoError
	_ atomic.Int64
)

// R3: an observer that panics on EventDeadLetter: the doc says the panic fails the run
// like a stage panic. It does, but the item is counted both DeadLettered and Failed.
func TestRegressionObserverPanicDoubleCounts(t *testing.T) {
	p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
		if e.Kind == pipeline.EventDeadLetter {
			panic("observer")
		}
	}))
	src := pipeline.FromSlice(p, []int{1})
	pipeline.To(src, pipeline.NewSink("sink", 1, func(context.Context, int) error {
		return pipeline.Permanent(errBoom)
	}, discardDead[int]()))
	err := p.Run(context.Background())
	var pe *pipeline.PanicError
	require.ErrorAs(t, err, &pe)
	s := row(t, p.Report(), "sink")
	assert.Equal(t, s.In, s.Succeeded+s.DeadLettered+s.Failed+s.NotStarted, "%v", p.Report())
}

// R5: a panicking WithMaxBytes size function is recovered (good), but the items of the
// partial batch and the item being sized vanish from the accounting.
func TestRegressionBatchSizerPanicLosesItems(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, []int{1, 2, 3})
	size := func(v int) int {
		if v == 3 {
			panic("sizer")
		}
		return 1
	}
	pipeline.ToBatches(src, 10, pipeline.NewSink("sink", 1, func(context.Context, []int) error { return nil }),
		pipeline.WithMaxBytes(100, size))
	err := p.Run(context.Background())
	var pe *pipeline.PanicError
	require.ErrorAs(t, err, &pe)
	rep := p.Report()
	b := row(t, rep, "Batch")
	assert.Equal(t, row(t, rep, "FromSlice").Out, b.In, "batch In != what the source sent\n%v", rep)
	assert.Equal(t, b.In, b.Succeeded+b.DeadLettered+b.Failed+b.NotStarted, "%v", rep)
}

// R6: a drained error budget on a stage behind Tee never reaches the source: the source
// is not in the stage's upstream rows (Tee opens its upstream only from the LAST branch).
// With a finite source every item still goes through; with an endless Generate the run
// never ends.
func TestRegressionTeeDrainDoesNotStopSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		var produced atomic.Int64
		src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
			for i := 0; ; i++ {
				if err := emit(i); err != nil {
					return err
				}
				produced.Add(1)
			}
		})
		br := pipeline.Tee(src, 2)
		bad := pipeline.NewSink("bad", 1, func(context.Context, int) error { return pipeline.Permanent(errBoom) },
			discardDead[int](), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 5, Drain: true}))
		pipeline.To(br[0], bad)
		pipeline.To(br[1], pipeline.NewSink("good", 1, func(context.Context, int) error { return nil }))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := p.Run(ctx)
		require.ErrorIs(t, err, pipeline.ErrBudgetExceeded, "produced %d items; report:\n%v", produced.Load(), p.Report())
	})
}

// R6b: the same graph with the drained stage first in line stops promptly (control).
func TestRegressionNoTeeDrainStopsSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
			for i := 0; ; i++ {
				if err := emit(i); err != nil {
					return err
				}
			}
		})
		bad := pipeline.NewSink("bad", 1, func(context.Context, int) error { return pipeline.Permanent(errBoom) },
			discardDead[int](), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 5, Drain: true}))
		pipeline.To(src, bad)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		require.ErrorIs(t, p.Run(ctx), pipeline.ErrBudgetExceeded)
	})
}

// R7: the parent context is canceled (with a cause) while a dead-letter destination
// runs; the destination gives up with ctx.Err(). Run must return context.Cause(parent)
// (doc: "the run's context is done: the item counts as failed, Run returns the cause").
func TestRegressionDeadLetterErrorHidesParentCause(t *testing.T) {
	errShutdown := errors.New("shutdown")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	p := pipeline.New()
	src := pipeline.FromSlice(p, []int{1})
	pipeline.To(src, pipeline.NewSink("sink", 1, func(context.Context, int) error { return pipeline.Permanent(errBoom) },
		pipeline.WithDeadLetter(func(ctx context.Context, _ pipeline.DeadLetter[int]) error {
			cancel(errShutdown) // e.g. SIGINT while the dead letter is being written
			<-ctx.Done()
			return ctx.Err()
		})))
	err := p.Run(ctx)
	assert.ErrorIs(t, err, errShutdown, "got %v", err)
}

// R4: an observer that panics on EventStageDone (or EventCheckpoint) crashes the whole
// process: the event is emitted outside any recover. Doc of WithObserver: "A panic in fn
// fails the run like a panic in a stage".
func TestRegressionObserverPanicCrashesProcess(t *testing.T) {
	for _, kind := range []string{"stage-done", "checkpoint"} {
		t.Run(kind, func(t *testing.T) {
			if os.Getenv("REVIEW_CHILD") == kind {
				childObserverPanic(kind)
				return
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestRegressionObserverPanicCrashesProcess$/^"+kind+"$", "-test.v")
			cmd.Env = append(os.Environ(), "REVIEW_CHILD="+kind)
			out, err := cmd.CombinedOutput()
			assert.NoError(t, err, "the child process crashed:\n%s", tail(out))
		})
	}
}

func childObserverPanic(kind string) {
	p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
		if e.Kind.String() == kind {
			panic("observer")
		}
	}))
	var src *pipeline.Stream[int]
	if kind == "checkpoint" {
		store := pipeline.NewFileCheckpoint(filepath.Join(os.TempDir(), fmt.Sprintf("review-ck-%d", os.Getpid())))
		defer func() { _ = os.Remove(filepath.Join(os.TempDir(), fmt.Sprintf("review-ck-%d", os.Getpid()))) }()
		src = pipeline.FromCheckpoint(p, store, func(ctx context.Context, pos int64) iter.Seq2[int, error] {
			return func(yield func(int, error) bool) {
				for i := pos; i < 5000; i++ {
					if !yield(int(i), nil) {
						return
					}
				}
			}
		}, pipeline.WithSaveEvery(10))
	} else {
		src = pipeline.FromSlice(p, []int{1, 2, 3})
	}
	pipeline.To(src, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	err := p.Run(context.Background())
	if _, ok := errors.AsType[*pipeline.PanicError](err); !ok {
		fmt.Println("run returned", err, "- want a *PanicError")
		os.Exit(3)
	}
}

func tail(b []byte) string {
	if len(b) > 1500 {
		b = b[:1500]
	}
	return string(b)
}

// R8: a panic in an inline operator after an ORDERED stage: the item is counted failed by
// its worker AND, still being "held" in the reorder window, moved again from Succeeded to
// Failed by the final report: Succeeded goes negative.
func TestRegressionOrderedInlinePanicAccounting(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, []int{1})
	st := pipeline.Then(src, pipeline.NewStage("ord", 1, func(_ context.Context, v int) (int, error) { return v, nil },
		pipeline.WithOrdered(0)))
	m := pipeline.Map(st, func(int) int { panic("map") })
	pipeline.To(m, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	err := p.Run(context.Background())
	var pe *pipeline.PanicError
	require.ErrorAs(t, err, &pe)
	checkAccounting(t, p.Report())
}

// R9: a panic in the loop body of All: the report's "All" row keeps the item in neither
// Succeeded nor Failed (In != Succeeded+DeadLettered+Failed+NotStarted).
func TestRegressionAllBodyPanicAccounting(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, []int{1, 2, 3})
	seq := pipeline.All(context.Background(), src)
	func() {
		defer func() { _ = recover() }()
		for _, err := range seq {
			panic(fmt.Sprint("body ", err))
		}
	}()
	checkAccounting(t, p.Report())
}
