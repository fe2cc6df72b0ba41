package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gopipeline/pipeline"
)

// collector is a sink function that keeps every item it gets.
type collector[T any] struct {
	mu    sync.Mutex
	items []T
}

func (c *collector[T]) add(_ context.Context, v T) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.items = append(c.items, v)
	return nil
}

func (c *collector[T]) got() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.items)
}

// TestEveryItemOnce checks, for 1 and several workers per stage, that every item
// reaches the end exactly once (as a multiset), whichever way the pipeline ends.
func TestEveryItemOnce(t *testing.T) {
	t.Parallel()
	const n = 500
	double := func(_ context.Context, v int) (int, error) { return 2 * v, nil }
	want := make([]int, n)
	for i := range want {
		want[i] = 2 * i
	}
	cases := []struct {
		name string
		run  func(t *testing.T, workers int) ([]int, pipeline.Report)
	}{
		{"Collect", func(t *testing.T, workers int) ([]int, pipeline.Report) {
			p := pipeline.New()
			s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("double", workers, double))
			got, err := pipeline.Collect(t.Context(), s)
			require.NoError(t, err)
			return got, p.Report()
		}},
		{"All", func(t *testing.T, workers int) ([]int, pipeline.Report) {
			p := pipeline.New()
			s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("double", workers, double))
			var got []int
			for v, err := range pipeline.All(t.Context(), s) {
				require.NoError(t, err)
				got = append(got, v)
			}
			return got, p.Report()
		}},
		{"To", func(t *testing.T, workers int) ([]int, pipeline.Report) {
			p := pipeline.New()
			s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("double", workers, double))
			var c collector[int]
			pipeline.To(s, pipeline.NewSink("sink", workers, c.add))
			require.NoError(t, p.Run(t.Context()))
			return c.got(), p.Report()
		}},
		{"three stages and small queues", func(t *testing.T, workers int) ([]int, pipeline.Report) {
			p := pipeline.New(pipeline.WithBuffer(1))
			s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("a", workers, identity))
			s = pipeline.Then(s, pipeline.NewStage("b", workers, double, pipeline.WithBuffer(0)))
			s = pipeline.Then(s, pipeline.NewStage("c", workers, identity))
			var c collector[int]
			pipeline.To(s, pipeline.NewSink("sink", workers, c.add))
			require.NoError(t, p.Run(t.Context()))
			return c.got(), p.Report()
		}},
		{"Generate and FromSeq2 sources", func(t *testing.T, workers int) ([]int, pipeline.Report) {
			p := pipeline.New()
			src := pipeline.FromSeq2(p, func(yield func(int, error) bool) {
				for i := range n {
					if !yield(i, nil) {
						return
					}
				}
			})
			s := pipeline.Then(src, pipeline.NewStage("double", workers, double))
			got, err := pipeline.Collect(t.Context(), s)
			require.NoError(t, err)
			return got, p.Report()
		}},
	}
	for _, tc := range cases {
		for _, workers := range []int{1, 8} {
			t.Run(fmt.Sprintf("%s/workers=%d", tc.name, workers), func(t *testing.T) {
				t.Parallel()
				got, rep := tc.run(t, workers)
				assert.ElementsMatch(t, want, got)
				require.NoError(t, rep.Err)
				checkReport(t, rep)
				last := rep.Stages[len(rep.Stages)-1]
				assert.Equal(t, pipeline.KindSink, last.Kind)
				assert.Equal(t, int64(n), last.Succeeded)
				assert.Zero(t, rep.NotStarted())
				assert.Zero(t, rep.DeadLettered())
			})
		}
	}
}

// TestOneWorkerKeepsOrder checks that a chain of one-worker stages delivers items in
// source order (the Examples rely on it).
func TestOneWorkerKeepsOrder(t *testing.T) {
	t.Parallel()
	p := pipeline.New(pipeline.WithBuffer(3))
	s := pipeline.Then(pipeline.FromSlice(p, ints(200)), pipeline.NewStage("a", 1, identity))
	s = pipeline.Then(s, pipeline.NewStage("b", 1, identity))
	got, err := pipeline.Collect(t.Context(), s)
	require.NoError(t, err)
	assert.Equal(t, ints(200), got)
}

// TestFlatStage checks a stage that emits zero, one or several outputs per input.
func TestFlatStage(t *testing.T) {
	t.Parallel()
	const n = 300
	var want []string
	for i := range n {
		for j := range i % 3 { // 0, 1 or 2 outputs
			want = append(want, fmt.Sprintf("%d.%d", i, j))
		}
	}
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			split := pipeline.NewFlatStage("split", workers, func(_ context.Context, v int, emit func(string)) error {
				for j := range v % 3 {
					emit(fmt.Sprintf("%d.%d", v, j))
				}
				return nil
			})
			s := pipeline.Then(pipeline.FromSlice(p, ints(n)), split)
			var c collector[string]
			pipeline.To(s, pipeline.NewSink("sink", workers, c.add))
			require.NoError(t, p.Run(t.Context()))

			assert.ElementsMatch(t, want, c.got())
			rep := p.Report()
			checkAccounting(t, rep)
			checkChain(t, rep)
			sr := row(t, rep, "split")
			assert.Equal(t, int64(n), sr.In)
			assert.Equal(t, int64(n), sr.Succeeded)
			assert.Equal(t, int64(len(want)), sr.Out)
		})
	}
}

// TestFlatStageRetrySendsNothingFromFailedAttempts checks that the outputs of a failed
// attempt are dropped: only the successful attempt's outputs go downstream.
func TestFlatStageRetrySendsNothingFromFailedAttempts(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	var calls atomic.Int64
	st := pipeline.NewFlatStage("split", 1, func(_ context.Context, v int, emit func(string)) error {
		emit(fmt.Sprintf("%d-a", v))
		if calls.Add(1) == 1 {
			emit("from a failed attempt")
			return pipeline.Transient(errBoom)
		}
		emit(fmt.Sprintf("%d-b", v))
		return nil
	}, pipeline.WithRetry(2, nil))
	got, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, []int{7}), st))
	require.NoError(t, err)
	assert.Equal(t, []string{"7-a", "7-b"}, got)
	assert.Equal(t, int64(1), row(t, p.Report(), "split").Retried)
}

// TestFlatStageEmitAfterReturnPanics checks that a flat stage's emit called after the
// function returned panics with a "pipeline:" message instead of recording an output
// that goes nowhere (or with another item), and that emit called from goroutines the
// function starts, taking turns and waited for, records every output.
func TestFlatStageEmitAfterReturnPanics(t *testing.T) {
	t.Parallel()
	var kept func(int)
	p := pipeline.New()
	s := pipeline.Then(pipeline.FromSlice(p, ints(10)), pipeline.NewFlatStage("split", 2, func(_ context.Context, v int, emit func(int)) error {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for k := range 3 {
			wg.Go(func() {
				mu.Lock()
				defer mu.Unlock()
				emit(10*v + k)
			})
		}
		wg.Wait()
		if v == 0 {
			kept = emit
		}
		return nil
	}))
	got, err := pipeline.Collect(t.Context(), s)
	require.NoError(t, err)
	assert.Len(t, got, 30)
	require.NotNil(t, kept)
	msg := assertPanicsPipeline(t, func() { kept(-1) })
	assert.Contains(t, msg, "after the stage's function returned")
}

// TestGenerateEmitAfterReturnPanics checks that Generate's emit called after the
// source's function returned panics with a "pipeline:" message instead of returning an
// error or sending an item after the source's end, and that emit called from goroutines
// the function starts, taking turns and waited for, sends every item.
func TestGenerateEmitAfterReturnPanics(t *testing.T) {
	t.Parallel()
	var kept func(int) error
	p := pipeline.New()
	s := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for k := range 4 {
			wg.Go(func() {
				for i := range 25 {
					mu.Lock()
					err := emit(100*k + i)
					mu.Unlock()
					if err != nil {
						errs[k] = err
						return
					}
				}
			})
		}
		wg.Wait()
		kept = emit
		return errors.Join(errs...)
	})
	got, err := pipeline.Collect(t.Context(), s)
	require.NoError(t, err)
	assert.Len(t, got, 100)
	require.NotNil(t, kept)
	msg := assertPanicsPipeline(t, func() { _ = kept(-1) })
	assert.Contains(t, msg, "after the source's function returned")
}

// TestMapFilter checks the inline operators: Map transforms every item, Filter drops
// some, and the report counts what the filter dropped.
func TestMapFilter(t *testing.T) {
	t.Parallel()
	const n = 400
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			s := pipeline.Map(pipeline.FromSlice(p, ints(n)), func(v int) int { return v * 10 })
			s = pipeline.Then(s, pipeline.NewStage("work", workers, identity))
			s = pipeline.Filter(s, func(v int) bool { return v%20 == 0 })
			strs := pipeline.Map(s, func(v int) string { return fmt.Sprint(v) })
			got, err := pipeline.Collect(t.Context(), strs)
			require.NoError(t, err)

			var want []string
			for i := 0; i < n; i += 2 {
				want = append(want, fmt.Sprint(i*10))
			}
			assert.ElementsMatch(t, want, got)
			rep := p.Report()
			checkReport(t, rep)
			var filters []pipeline.StageReport
			for _, s := range rep.Stages {
				if s.Kind == pipeline.KindFilter {
					filters = append(filters, s)
				}
			}
			require.Len(t, filters, 1, "one filter row\n%v", rep)
			assert.Equal(t, int64(n/2), filters[0].Filtered)
		})
	}
}

// TestAutoNamesDoNotTakeStageNames checks that the names the report gives to sources
// and filters (their constructor's: "FromSlice", "Generate", "Filter", ...) leave the
// natural stage names to the user: a stage may be called "slice", "generate" or "filter".
func TestAutoNamesDoNotTakeStageNames(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		build func(p *pipeline.Pipeline) *pipeline.Stream[int]
	}{
		{"filter", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.Filter(pipeline.FromSlice(p, ints(10)), func(v int) bool { return v > 2 })
		}},
		{"slice", func(p *pipeline.Pipeline) *pipeline.Stream[int] { return pipeline.FromSlice(p, ints(7)) }},
		{"generate", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
				return emitInts(emit, 7)
			})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			s := tc.build(p)
			assert.NotPanics(t, func() {
				got, err := pipeline.Collect(t.Context(), pipeline.Then(s, pipeline.NewStage(tc.name, 1, identity)))
				assert.NoError(t, err)
				assert.Len(t, got, 7)
			})
		})
	}
}

// TestAllBreakStopsRun checks that breaking out of a loop over All cancels the run,
// that the loop statement returns only after the run's goroutines have exited, and
// that the report is consistent (and without error: breaking is not a failure).
func TestAllBreakStopsRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			p := pipeline.New(pipeline.WithBuffer(4))
			var sourceDone atomic.Bool
			src := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
				defer sourceDone.Store(true)
				for i := 0; ; i++ { // endless: only the break can end this run
					if err := emit(i); err != nil {
						return err
					}
				}
			})
			var active atomic.Int64
			s := pipeline.Then(src, pipeline.NewStage("work", workers, func(_ context.Context, v int) (int, error) {
				active.Add(1)
				defer active.Add(-1)
				return v, nil
			}))
			var got []int
			for v, err := range pipeline.All(t.Context(), s) {
				require.NoError(t, err)
				got = append(got, v)
				if len(got) == 5 {
					break
				}
			}
			assert.True(t, sourceDone.Load(), "the source has returned when the loop ends")
			assert.Zero(t, active.Load(), "no stage function is running when the loop ends")
			assert.Len(t, got, 5)
			rep := p.Report()
			require.NoError(t, rep.Err)
			checkReport(t, rep)
			end := rep.Stages[len(rep.Stages)-1]
			assert.Equal(t, int64(4), end.Succeeded, "the item broken on does not settle")
			assert.Equal(t, int64(1), end.Failed, "the item broken on: in flight when the run stopped")
		})
	}
}

// TestAllLoopBodyPanic checks that a panic in the body of a loop over All leaves the
// pipeline usable: the run is stopped and waited for, so the next range is a new run.
func TestAllLoopBodyPanic(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	seq := pipeline.All(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(100)), pipeline.NewStage("work", 2, identity)))
	assert.PanicsWithValue(t, "loop body", func() {
		for _, err := range seq {
			if err == nil {
				panic("loop body")
			}
		}
	})
	assert.NotPanics(t, func() {
		n := 0
		for _, err := range seq {
			assert.NoError(t, err)
			n++
		}
		assert.Equal(t, 100, n)
	})
}

// TestParentCancel checks that canceling the parent context with a cause stops a run
// whose stage waits on its context, promptly, and that Run (or Collect, or All)
// returns exactly that cause. The test synchronizes on channels only: if the run did
// not stop, the test would time out.
func TestParentCancel(t *testing.T) {
	t.Parallel()
	modes := []string{"Run", "Collect", "All"}
	blockers := []string{"stage", "source"}
	for _, mode := range modes {
		for _, blocker := range blockers {
			for _, workers := range []int{1, 4} {
				t.Run(fmt.Sprintf("%s/%s/workers=%d", mode, blocker, workers), func(t *testing.T) {
					t.Parallel()
					testParentCancel(t, mode, blocker, workers)
				})
			}
		}
	}
}

func testParentCancel(t *testing.T, mode, blocker string, workers int) {
	cause := errors.New("operator pressed stop")
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	started := make(chan struct{})
	var once sync.Once
	// wait is how the blocked function waits: until the run stops.
	var seenCause atomic.Value
	wait := func(ctx context.Context) error {
		once.Do(func() { close(started) })
		<-ctx.Done()
		seenCause.Store(context.Cause(ctx))
		return ctx.Err()
	}

	p := pipeline.New()
	var src *pipeline.Stream[int]
	if blocker == "source" {
		src = pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
			if err := emitInts(emit, 10); err != nil {
				return err
			}
			return wait(ctx)
		})
	} else {
		src = pipeline.FromSlice(p, ints(100))
	}
	s := pipeline.Then(src, pipeline.NewStage("work", workers, func(ctx context.Context, v int) (int, error) {
		if blocker == "stage" {
			return 0, wait(ctx)
		}
		return v, nil
	}))

	errc := make(chan error, 1)
	switch mode {
	case "Run":
		var c collector[int]
		pipeline.To(s, pipeline.NewSink("sink", workers, c.add))
		go func() { errc <- p.Run(ctx) }()
	case "Collect":
		go func() {
			_, err := pipeline.Collect(ctx, s)
			errc <- err
		}()
	case "All":
		go func() {
			var last error
			for _, err := range pipeline.All(ctx, s) {
				last = err
			}
			errc <- last
		}()
	}
	<-started
	cancel(cause)
	err := <-errc

	require.ErrorIs(t, err, cause)
	assert.Same(t, cause, err, "Run returns the parent's cause itself")
	assert.Same(t, cause, seenCause.Load(), "the stage function's context carries the cause")
	rep := p.Report()
	assert.Same(t, cause, rep.Err)
	checkReport(t, rep)
	if blocker == "stage" {
		assert.Positive(t, row(t, rep, "work").Failed, "the items in flight count as failed\n%v", rep)
	}
}

// TestCanceledParentBeforeRun checks that a run whose parent context is already
// canceled returns the parent's cause, every time. (On the bug, about half of the runs
// return nil under -race, a few in a thousand without.)
func TestCanceledParentBeforeRun(t *testing.T) {
	t.Parallel()
	cause := errors.New("canceled before the run")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	var calls atomic.Int64
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []int{1}), pipeline.NewSink("sink", 1, func(context.Context, int) error {
		calls.Add(1)
		return nil
	}))
	var nils int
	for range 500 {
		if err := p.Run(ctx); err == nil {
			nils++
		} else {
			assert.Same(t, cause, err)
		}
		checkReport(t, p.Report())
	}
	assert.Zero(t, nils, "runs with a canceled parent that returned nil (the sink was called %d times)", calls.Load())
}

// TestNoNewItemsAfterFailure checks that once a run has failed, no stage starts an
// item it had not started yet: queued items stay not started.
func TestNoNewItemsAfterFailure(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	// s1 sends items 0..4 to the sink, then fails on item 5 once the sink has item 0.
	sinkStarted := make(chan struct{})
	s := pipeline.Then(pipeline.FromSlice(p, ints(10)), pipeline.NewStage("s1", 1, func(_ context.Context, v int) (int, error) {
		if v == 5 {
			<-sinkStarted
			return 0, errBoom
		}
		return v, nil
	}))
	// The sink holds item 0 until the run has stopped, then finishes it; items 1..4
	// are queued behind it by then.
	var calls atomic.Int64
	pipeline.To(s, pipeline.NewSink("sink", 1, func(ctx context.Context, _ int) error {
		if calls.Add(1) == 1 {
			close(sinkStarted)
			<-ctx.Done()
		}
		return nil
	}))
	err := p.Run(t.Context())
	require.ErrorIs(t, err, errBoom)
	assert.Equal(t, int64(1), calls.Load(), "the sink was called for items queued after the run had failed")
	rep := p.Report()
	checkReport(t, rep)
	assert.Equal(t, int64(4), row(t, rep, "sink").NotStarted)
}

// TestRunAgain checks that a pipeline can be run again, with fresh counters, and that
// one Stage definition can serve several pipelines.
func TestRunAgain(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	st := pipeline.NewStage("count", 3, func(_ context.Context, v int) (int, error) {
		calls.Add(1)
		return v, nil
	})
	p := pipeline.New()
	var c collector[int]
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(50)), st), pipeline.NewSink("sink", 1, c.add))
	for range 3 {
		require.NoError(t, p.Run(t.Context()))
		rep := p.Report()
		checkReport(t, rep)
		assert.Equal(t, int64(50), row(t, rep, "count").In, "counters start from zero at each run")
	}
	assert.Len(t, c.got(), 150)

	p2 := pipeline.New()
	got, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p2, ints(20)), st))
	require.NoError(t, err)
	assert.ElementsMatch(t, ints(20), got)
	assert.Equal(t, int64(170), calls.Load())

	// The same Stage in pipelines that run at the same time (the race detector checks
	// that a Stage is not mutated by its runs).
	var wg sync.WaitGroup
	lens, errs := make(chan int, 4), make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			p := pipeline.New()
			got, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(100)), st))
			lens <- len(got)
			errs <- err
		})
	}
	wg.Wait()
	for range 4 {
		require.NoError(t, <-errs)
		assert.Equal(t, 100, <-lens)
	}
}

// TestCollectPartialOnFailure checks that Collect returns the items collected before a
// failure together with the run's error.
func TestCollectPartialOnFailure(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	s := pipeline.Then(pipeline.FromSlice(p, ints(10)), pipeline.NewStage("work", 1, func(_ context.Context, v int) (int, error) {
		if v == 4 {
			return 0, errBoom
		}
		return v, nil
	}))
	got, err := pipeline.Collect(t.Context(), s)
	require.ErrorIs(t, err, errBoom)
	assert.Subset(t, []int{0, 1, 2, 3}, got)
	checkReport(t, p.Report())
}

// TestFromSeqCleanupOnStop checks that a stopped run breaks the loop over the
// sequence, so that the sequence's cleanup runs.
func TestFromSeqCleanupOnStop(t *testing.T) {
	t.Parallel()
	var cleaned atomic.Bool
	p := pipeline.New()
	src := pipeline.FromSeq(p, func(yield func(int) bool) {
		defer cleaned.Store(true)
		for i := 0; ; i++ {
			if !yield(i) {
				return
			}
		}
	})
	s := pipeline.Then(src, pipeline.NewStage("work", 1, func(context.Context, int) (int, error) { return 0, errBoom }))
	_, err := pipeline.Collect(t.Context(), s)
	require.ErrorIs(t, err, errBoom)
	assert.True(t, cleaned.Load())
	checkReport(t, p.Report())
}

// TestFromChan checks a channel source: every value is delivered, and when the run
// stops early the values not taken stay in the channel.
func TestFromChan(t *testing.T) {
	t.Parallel()
	t.Run("all values", func(t *testing.T) {
		t.Parallel()
		ch := make(chan int)
		go func() {
			defer close(ch)
			for i := range 100 {
				ch <- i
			}
		}()
		p := pipeline.New()
		got, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromChan(p, ch), pipeline.NewStage("work", 4, identity)))
		require.NoError(t, err)
		assert.ElementsMatch(t, ints(100), got)
		checkReport(t, p.Report())
	})
	t.Run("stopped early", func(t *testing.T) {
		t.Parallel()
		ch := make(chan int, 10)
		for i := range 10 {
			ch <- i
		}
		close(ch)
		p := pipeline.New()
		st := pipeline.NewStage("work", 1, func(context.Context, int) (int, error) { return 0, errBoom }, pipeline.WithBuffer(0))
		_, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromChan(p, ch), st))
		require.ErrorIs(t, err, errBoom)
		// Item 0 failed; item 1 is still in the channel, or was taken before the run
		// stopped and could not be sent (not started, by the source or by the stage,
		// depending on when the source saw the failure); 2..9 are still in the channel.
		rep := p.Report()
		checkReport(t, rep)
		notStarted := row(t, rep, "work").NotStarted + row(t, rep, "FromChan").NotStarted
		assert.LessOrEqual(t, notStarted, int64(1))
		assert.Equal(t, 9, len(ch)+int(notStarted), "every value not failed is in ch or counted")
	})
	t.Run("stopped before it began", func(t *testing.T) {
		t.Parallel()
		// A run whose context is done already takes nothing out of ch: the source's
		// first receive took a value (a select with one ready takes it), and dropped it.
		ch := make(chan int, 5)
		for i := range 5 {
			ch <- i
		}
		p := pipeline.New()
		pipeline.To(pipeline.FromChan(p, ch), nopSink())
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.ErrorIs(t, p.Run(ctx), context.Canceled)
		assert.Len(t, ch, 5)
		checkReport(t, p.Report())
	})
}

// TestWorkersBoundConcurrency checks with an in-flight gauge that a stage never runs
// more than its workers at once, and does run that many when it has the work.
func TestWorkersBoundConcurrency(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 3, 8} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var active, peak atomic.Int64
				p := pipeline.New()
				st := pipeline.NewStage("work", workers, func(_ context.Context, v int) (int, error) {
					n := active.Add(1)
					for {
						m := peak.Load()
						if n <= m || peak.CompareAndSwap(m, n) {
							break
						}
					}
					time.Sleep(time.Second) // virtual time: lets the other workers start
					active.Add(-1)
					return v, nil
				})
				got, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(50)), st))
				require.NoError(t, err)
				assert.Len(t, got, 50)
				assert.Equal(t, int64(workers), peak.Load())
			})
		})
	}
}

// TestRunWhileRunningReturnsErrRunning checks that a second Run of a pipeline that is
// running returns ErrRunning at once, and leaves the run in progress and its report alone.
func TestRunWhileRunningReturnsErrRunning(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []int{1}), pipeline.NewSink("sink", 1, func(context.Context, int) error {
		first.Do(func() {
			close(started)
			<-release
		})
		return nil
	}))
	errc := runAsync(t.Context(), p)
	<-started
	var err error
	assert.NotPanics(t, func() { err = p.Run(t.Context()) })
	require.ErrorIs(t, err, pipeline.ErrRunning)
	assert.Empty(t, p.Report().Stages, "during the first run, Report is the zero Report")
	close(release)
	require.NoError(t, <-errc)
	assert.Len(t, p.Report().Stages, 2)
	require.NoError(t, p.Run(t.Context()), "once the first run is over, the pipeline runs again")
}

// TestCollectAndAllWhileRunningReturnErrRunning checks that Collect, and a loop over
// All, of a pipeline that is running (from the body of a loop over All of the same
// stream) return ErrRunning and leave the run in progress alone.
func TestCollectAndAllWhileRunningReturnErrRunning(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	s := pipeline.Then(pipeline.FromSlice(p, ints(3)), pipeline.NewStage("s", 1, func(_ context.Context, v int) (int, error) { return v, nil }))
	var got []int
	for v, err := range pipeline.All(t.Context(), s) {
		require.NoError(t, err)
		got = append(got, v)
		var out []int
		assert.NotPanics(t, func() { out, err = pipeline.Collect(t.Context(), s) })
		require.ErrorIs(t, err, pipeline.ErrRunning)
		assert.Empty(t, out)
		var errs []error
		assert.NotPanics(t, func() {
			for _, err := range pipeline.All(t.Context(), s) {
				errs = append(errs, err)
			}
		})
		require.Len(t, errs, 1)
		require.ErrorIs(t, errs[0], pipeline.ErrRunning)
	}
	assert.Equal(t, []int{0, 1, 2}, got)
	checkReport(t, p.Report())
}

// TestCollectAgainWithOtherOptionsPanics checks that a later Collect or All of the same
// stream with options other than the first call's panics instead of ignoring them, and
// that the same options, or none, run again.
func TestCollectAgainWithOtherOptionsPanics(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	s := pipeline.Then(pipeline.FromSlice(p, ints(3)), pipeline.NewStage("s", 1, func(_ context.Context, v int) (int, error) { return v, nil }))
	got, err := pipeline.Collect(t.Context(), s, pipeline.WithName("end"), pipeline.WithBuffer(4))
	require.NoError(t, err)
	assert.Len(t, got, 3)
	for name, opts := range map[string][]pipeline.CollectOption{
		"another name":                  {pipeline.WithName("other")},
		"another buffer":                {pipeline.WithName("end"), pipeline.WithBuffer(8)},
		"part of the options":           {pipeline.WithName("end")},
		"the same buffer, another name": {pipeline.WithBuffer(4), pipeline.WithName("other")},
	} {
		msg := assertPanicsPipeline(t, func() { _, _ = pipeline.Collect(t.Context(), s, opts...) })
		assert.Contains(t, msg, `WithName("end"), WithBuffer(4)`, name)
		assertPanicsPipeline(t, func() { pipeline.All(t.Context(), s, opts...) })
	}
	for _, opts := range [][]pipeline.CollectOption{nil, {pipeline.WithBuffer(4), pipeline.WithName("end")}} {
		got, err := pipeline.Collect(t.Context(), s, opts...)
		require.NoError(t, err)
		assert.Len(t, got, 3)
		n := 0
		for _, err := range pipeline.All(t.Context(), s, opts...) {
			require.NoError(t, err)
			n++
		}
		assert.Equal(t, 3, n)
		end, ok := p.Report().Stage("end")
		require.True(t, ok)
		assert.Equal(t, 4, end.QueueCap)
	}
}

// TestAllCanceledParentBeforeRun checks that a loop over All with an already canceled
// parent ends at once, with the parent's cause, and starts no item.
func TestAllCanceledParentBeforeRun(t *testing.T) {
	t.Parallel()
	cause := errors.New("canceled before the loop")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	p := pipeline.New()
	var calls atomic.Int64
	s := pipeline.Then(pipeline.FromSlice(p, ints(100)), pipeline.NewStage("s", 2, func(_ context.Context, v int) (int, error) {
		calls.Add(1)
		return v, nil
	}))
	var errs []error
	for _, err := range pipeline.All(ctx, s) {
		errs = append(errs, err)
	}
	require.Len(t, errs, 1)
	assert.Same(t, cause, errs[0])
	assert.Zero(t, calls.Load())
	checkReport(t, p.Report())
}

// Every row a user creates can be named, and the names must be unique.
func TestRowNamesSettableAndUnique(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	a := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error { return emit(1) }, pipeline.WithName("gen-a"))
	b := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error { return emit(2) }, pipeline.WithName("gen-b"))
	m := pipeline.Filter(pipeline.Merge(a, b), func(int) bool { return true }, pipeline.WithName("keep"))
	batches := pipeline.Batch(m, 5, pipeline.WithName("group"), pipeline.WithLinger(time.Second))
	got, err := pipeline.Collect(t.Context(), batches, pipeline.WithName("out"))
	require.NoError(t, err)
	assert.Len(t, got, 1)
	var names []string
	for _, s := range p.Report().Stages {
		names = append(names, s.Name)
	}
	assert.ElementsMatch(t, []string{"gen-a", "gen-b", "keep", "group", "out"}, names)
	msg := assertPanicsPipeline(t, func() { pipeline.FromSlice(p, ints(1), pipeline.WithName("keep")) })
	assert.Contains(t, msg, `"keep"`)
}
