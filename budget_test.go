package pipeline_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// failIf is a stage function that dead-letters (Permanent) the items bad reports.
func failIf(bad func(int) bool) func(context.Context, int) (int, error) {
	return func(_ context.Context, v int) (int, error) {
		if bad(v) {
			return 0, pipeline.Permanent(errBoom)
		}
		return v, nil
	}
}

func nopSink() *pipeline.Stage[int, struct{}] {
	return pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil })
}

// TestBudgetAbort checks that a budget in abort mode stops a run whose items all fail
// soon after MinSample items, with a *BudgetError carrying the counts.
func TestBudgetAbort(t *testing.T) {
	t.Parallel()
	const n = 20000
	p := pipeline.New()
	st := pipeline.NewStage("work", 4, failIf(func(int) bool { return true }), discardDead[int](),
		pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.2, MinSample: 200}))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), nopSink())

	err := p.Run(t.Context())

	require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
	be, ok := errors.AsType[*pipeline.BudgetError](err)
	require.True(t, ok)
	assert.Equal(t, int64(200), be.Failed)
	assert.Equal(t, int64(200), be.Seen)
	assert.InDelta(t, 0.2, be.MaxRatio, 0)
	assert.False(t, be.Drained)
	se, ok := errors.AsType[*pipeline.StageError](err)
	require.True(t, ok)
	assert.Equal(t, "work", se.Stage)
	rep := p.Report()
	checkReport(t, rep)
	assert.Less(t, row(t, rep, "work").Processed(), int64(n/4), "far fewer than all items were processed\n%v", rep)
}

// TestBudgetDrain checks drain mode in virtual time: when the budget trips, the items
// in flight finish and reach the sink (Run waits for them), the tripping stage starts
// no new item, Run returns the budget error, and every source item is accounted for.
func TestBudgetDrain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n, slow = 1000, time.Second
		start := time.Now()
		p := pipeline.New(pipeline.WithBuffer(8))
		// Items 0..2 take a second each and succeed; they hold 3 of the 4 workers
		// while the fourth fails items 3, 4, ... until the budget trips at t=0. The
		// failures wait until the three slow items have started, so that those are in
		// flight when it trips.
		var slowStarted atomic.Int64
		inFlight := make(chan struct{})
		st := pipeline.NewStage("work", 4, func(_ context.Context, v int) (int, error) {
			if v < 3 {
				if slowStarted.Add(1) == 3 {
					close(inFlight)
				}
				time.Sleep(slow) // virtual time
				return v, nil
			}
			<-inFlight
			return 0, pipeline.Permanent(errBoom)
		}, discardDead[int](), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.5, MinSample: 10, Drain: true}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), nopSink())

		err := p.Run(t.Context())

		require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
		be, ok := errors.AsType[*pipeline.BudgetError](err)
		require.True(t, ok)
		assert.True(t, be.Drained)
		assert.Equal(t, int64(10), be.Failed)
		assert.Equal(t, int64(10), be.Seen)
		se, ok := errors.AsType[*pipeline.StageError](err)
		require.True(t, ok)
		assert.Equal(t, "work", se.Stage)
		assert.Equal(t, slow, time.Since(start), "Run waited for the items in flight")

		rep := p.Report()
		assert.Equal(t, err, rep.Err)
		checkReport(t, rep)
		w := row(t, rep, "work")
		assert.Equal(t, int64(3), w.Succeeded, "the items in flight finished\n%v", rep)
		assert.Equal(t, int64(10), w.DeadLettered, "no item started after the trip\n%v", rep)
		assert.Equal(t, int64(3), row(t, rep, "sink").Succeeded, "the items in flight reached the sink\n%v", rep)
		assert.Positive(t, rep.NotStarted())
	})
}

// TestBudgetWindow checks that a windowed budget judges the last Window items only: a
// burst of failures trips it, exactly when the window holds more than MaxRatio
// failures, while a budget over all items tolerates the same input.
func TestBudgetWindow(t *testing.T) {
	t.Parallel()
	// Items below 2000 fail one in 20; 2000..2029 all fail; the rest succeed.
	bad := func(v int) bool { return v < 2000 && v%20 == 0 || v >= 2000 && v < 2030 }
	run := func(t *testing.T, b pipeline.Budget) (*pipeline.Pipeline, error) {
		t.Helper()
		p := pipeline.New()
		st := pipeline.NewStage("work", 1, failIf(bad), discardDead[int](), pipeline.WithErrorBudget(b))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(3000)), st), nopSink())
		return p, p.Run(t.Context())
	}
	t.Run("window", func(t *testing.T) {
		t.Parallel()
		p, err := run(t, pipeline.Budget{MaxRatio: 0.1, MinSample: 100, Window: 100})
		be, ok := errors.AsType[*pipeline.BudgetError](err)
		require.True(t, ok, "the burst trips a windowed budget: %v", err)
		// At item 2006 the window (items 1907..2006) holds 1920, 1940, 1960, 1980 and
		// the seven items of the burst.
		assert.Equal(t, pipeline.BudgetError{Failed: 11, Seen: 100, MaxRatio: 0.1, Window: 100}, *be)
		assert.Equal(t, int64(2007), row(t, p.Report(), "work").Processed())
		checkReport(t, p.Report())
	})
	t.Run("all items", func(t *testing.T) {
		t.Parallel()
		p, err := run(t, pipeline.Budget{MaxRatio: 0.1, MinSample: 100})
		require.NoError(t, err)
		assert.Equal(t, int64(130), p.Report().DeadLettered())
	})
}

// TestBudgetShared checks that a budget given to New is shared by all stages (the
// successes of one stage offset the failures of another), and that a stage with its
// own budget uses its own.
func TestBudgetShared(t *testing.T) {
	t.Parallel()
	budget := pipeline.Budget{MaxRatio: 0.6, MinSample: 100}
	build := func(bOpts ...pipeline.StageOption) *pipeline.Pipeline {
		p := pipeline.New(pipeline.WithErrorBudget(budget), pipeline.WithBuffer(1))
		s := pipeline.Then(pipeline.FromSlice(p, ints(1000)), pipeline.NewStage("a", 1, identity))
		s = pipeline.Then(s, pipeline.NewStage("b", 1, failIf(func(int) bool { return true }), append(bOpts, discardDead[int]())...))
		pipeline.To(s, nopSink())
		return p
	}
	t.Run("shared", func(t *testing.T) {
		t.Parallel()
		p := build()
		// b fails every item, but with a's successes about half of the outcomes fail.
		require.NoError(t, p.Run(t.Context()))
		assert.Equal(t, int64(1000), p.Report().DeadLettered())
		checkReport(t, p.Report())
	})
	t.Run("own", func(t *testing.T) {
		t.Parallel()
		p := build(pipeline.WithErrorBudget(budget))
		err := p.Run(t.Context())
		require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
		se, ok := errors.AsType[*pipeline.StageError](err)
		require.True(t, ok)
		assert.Equal(t, "b", se.Stage)
		be, ok := errors.AsType[*pipeline.BudgetError](err)
		require.True(t, ok)
		assert.Equal(t, int64(100), be.Seen, "b's own budget counts b's items only")
		checkReport(t, p.Report())
	})
}

// TestBudgetNotTripped checks that a budget does not trip below its ratio: 2 % failures
// under a 5 % budget, and the dead letters are counted.
func TestBudgetNotTripped(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 4} {
		p := pipeline.New()
		st := pipeline.NewStage("work", workers, failIf(func(v int) bool { return v%50 == 0 }), discardDead[int](),
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.05, MinSample: 50}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(1000)), st), nopSink())
		require.NoError(t, p.Run(t.Context()))
		rep := p.Report()
		checkReport(t, rep)
		assert.Equal(t, int64(20), rep.DeadLettered())
		assert.Equal(t, int64(980), row(t, rep, "sink").Succeeded)
	}
}

// TestBudgetIgnoresSuccessfulRetries checks that an item that fails and then succeeds
// on retry does not count as a failure.
func TestBudgetIgnoresSuccessfulRetries(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	tried := map[int]bool{}
	st := pipeline.NewStage("work", 1, func(_ context.Context, v int) (int, error) {
		if !tried[v] {
			tried[v] = true
			return 0, pipeline.Transient(errBoom)
		}
		return v, nil
	}, pipeline.WithRetry(2, nil), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.01, MinSample: 1}))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(100)), st), nopSink())
	require.NoError(t, p.Run(t.Context()))
	assert.Equal(t, int64(100), row(t, p.Report(), "work").Retried)
}

// A drained error budget on a stage behind Tee stops an endless source. It never reached
// the source, which was not in the stage's upstream rows (Tee opens its upstream only from
// the LAST branch): with a finite source every item still went through; with an endless
// Generate the run never ended.
func TestBudgetDrainBehindTeeStopsSource(t *testing.T) {
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

// TestBudgetDrainStopsEveryInput drains a budget in one input of a Merge whose other
// input never ends, and in one of two chains of a pipeline whose other never ends: the
// run stops taking new items there too, lets what it holds finish, and returns the
// budget's error, and the report adds up. The drain reached only the tripping stage and
// its upstream, and the run went on for ever.
func TestBudgetDrainStopsEveryInput(t *testing.T) {
	t.Parallel()
	for _, shape := range []string{"merge", "two chains"} {
		t.Run(shape, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				p := pipeline.New(pipeline.WithBuffer(4))
				tripping := pipeline.Then(pipeline.FromSlice(p, ints(1000)), pipeline.NewStage("s0", 1, func(_ context.Context, v int) (int, error) {
					if v > 50 {
						return 0, pipeline.Permanent(errBoom)
					}
					return v, nil
				}, discardDead[int](), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 10, Drain: true})))
				endless := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
					for i := 0; ; i++ {
						if err := emit(i); err != nil {
							return err
						}
						time.Sleep(10 * time.Millisecond) // a ticker's pace, in the bubble's time
					}
				}, pipeline.WithName("ticker"))
				sink := func(name string) *pipeline.Stage[int, struct{}] {
					return pipeline.NewSink(name, 1, func(context.Context, int) error { return nil })
				}
				if shape == "merge" {
					pipeline.To(pipeline.Merge(tripping, endless), sink("sink"))
				} else {
					pipeline.To(tripping, sink("sink"))
					pipeline.To(endless, sink("other"))
				}
				err := runWithin(t, p, time.Hour)
				require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
				checkAccounting(t, p.Report())
			})
		})
	}
}

// The same graph with the drained stage first in line stops promptly: the control for
// TestBudgetDrainBehindTeeStopsSource.
func TestBudgetDrainStopsSource(t *testing.T) {
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

// drainAtThree ends src in a stage "a" under budget that dead-letters item 3, and a sink.
func drainAtThree(src *pipeline.Stream[int], budget pipeline.StageOption) {
	s := pipeline.Then(src, pipeline.NewStage("a", 1, func(_ context.Context, i int) (int, error) {
		if i == 3 {
			return 0, pipeline.Permanent(errBoom)
		}
		return i, nil
	}, discardDead[int](), budget))
	pipeline.To(s, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
}

// A drained budget while the tracked source waits for room: the items the drained stage
// discards settle, so the source wakes (they never settled, and the source never woke).
func TestBudgetDrainWakesWaitingSource(t *testing.T) {
	budget := pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 1, Drain: true})
	for _, pend := range []int{1, 2, 3, 5} {
		t.Run("ack", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newAckCounter()
				var emitted atomic.Int64
				p := pipeline.New()
				src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
					for i := range 100 {
						emitted.Add(1)
						if err := emit(i, c.settle(i)); err != nil {
							return err
						}
					}
					return nil
				}, pipeline.WithMaxPending(pend))
				drainAtThree(src, budget)
				err := runWithin(t, p, time.Hour)
				t.Log(pend, err)
				c.check(t, int(emitted.Load()))
				checkAccounting(t, p.Report())
			})
		})
		t.Run("checkpoint", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &memStore{}
				p := pipeline.New()
				src := pipeline.FromCheckpoint(p, st, from(100), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(pend+1))
				drainAtThree(src, budget)
				err := runWithin(t, p, time.Hour)
				t.Log(pend, err, st.pos)
				checkAccounting(t, p.Report())
			})
		})
	}
}

// A slow observer of the budget's event does not hang a drained run. The event was emitted
// before the drain flag was set: the source refilled its pending items into the drained
// stage's queue and waited for room; those items were discarded without settling, and the
// source waited for ever.
func TestBudgetDrainSlowObserverDoesNotHang(t *testing.T) {
	budget := pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 1, Drain: true})
	slowObserver := pipeline.WithObserver(func(e pipeline.Event) {
		if e.Kind == pipeline.EventBudget {
			time.Sleep(time.Millisecond) // a logger writing somewhere slow
		}
	})
	t.Run("ack", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newAckCounter()
			p := pipeline.New(slowObserver)
			src := pipeline.FromAcked(p, ackBody(100, c.settle), pipeline.WithMaxPending(3))
			drainAtThree(src, budget)
			err := runWithin(t, p, time.Hour)
			t.Log(err)
		})
	})
	t.Run("checkpoint", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := &memStore{}
			p := pipeline.New(slowObserver)
			src := pipeline.FromCheckpoint(p, st, from(100), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(3))
			drainAtThree(src, budget)
			err := runWithin(t, p, time.Hour)
			t.Log(err, st.pos)
		})
	})
}
