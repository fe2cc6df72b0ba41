package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// mergeSources returns three sources of one pipeline, a slice, a Generate and a
// FromChan, holding 0..99, 100..199 and 200..299.
func mergeSources(p *pipeline.Pipeline) []*pipeline.Stream[int] {
	gen := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
		for i := 100; i < 200; i++ {
			if err := emit(i); err != nil {
				return err
			}
		}
		return nil
	})
	ch := make(chan int, 100)
	for i := 200; i < 300; i++ {
		ch <- i
	}
	close(ch)
	return []*pipeline.Stream[int]{pipeline.FromSlice(p, ints(100)), gen, pipeline.FromChan(p, ch)}
}

// TestMergeThreeSources checks that Merge of a slice, a Generate and a FromChan source
// delivers every item exactly once, each source's items in that source's order, both
// straight to the caller and through a concurrent stage.
func TestMergeThreeSources(t *testing.T) {
	t.Parallel()
	t.Run("collect", func(t *testing.T) {
		t.Parallel()
		p := pipeline.New(pipeline.WithBuffer(4))
		got, err := pipeline.Collect(t.Context(), pipeline.Merge(mergeSources(p)...))
		require.NoError(t, err)
		assert.ElementsMatch(t, ints(300), got)
		var per [3][]int
		for _, v := range got {
			per[v/100] = append(per[v/100], v)
		}
		for k, vs := range per {
			assert.Truef(t, slices.IsSorted(vs), "source %d's items out of its order", k)
		}
		rep := p.Report()
		checkAccounting(t, rep)
		for _, name := range []string{"FromSlice", "Generate", "FromChan"} {
			assert.Equal(t, int64(100), row(t, rep, name).Out, "items sent by %s", name)
		}
		assert.Equal(t, int64(300), row(t, rep, "Collect").In)
	})
	t.Run("into a stage", func(t *testing.T) {
		t.Parallel()
		p := pipeline.New(pipeline.WithBuffer(2))
		s := pipeline.Then(pipeline.Merge(mergeSources(p)...), pipeline.NewStage("work", 4, identity))
		var c collector[int]
		pipeline.To(s, pipeline.NewSink("sink", 2, c.add))
		require.NoError(t, p.Run(t.Context()))
		assert.ElementsMatch(t, ints(300), c.got())
		rep := p.Report()
		checkAccounting(t, rep)
		assert.Equal(t, int64(300), row(t, rep, "work").In)
		assert.Equal(t, int64(300), row(t, rep, "sink").Succeeded)
	})
}

// TestMergeFailingSource merges a Generate that emits without end, one that fails and a
// FromChan whose channel never delivers, into a sink that blocks. Once everything is
// blocked, the failing source returns its error: it becomes the run's error, as a
// *StageError naming that source; the Generate blocked in emit sees emit return the
// run's cause; the FromChan source stops; and no goroutine is left (the synctest bubble
// fails otherwise).
func TestMergeFailingSource(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var (
			emitErr error
			emitted atomic.Int64
		)
		p := pipeline.New(pipeline.WithBuffer(1))
		endless := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
			for i := 0; ; i++ {
				if err := emit(i); err != nil {
					emitErr = err
					return err
				}
				emitted.Add(1)
			}
		})
		fail := make(chan struct{})
		failing := pipeline.Generate(p, func(ctx context.Context, _ func(int) error) error {
			select {
			case <-fail:
				return errBoom
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		never := make(chan int) // never sent on, never closed
		silent := pipeline.FromChan(p, never)
		pipeline.To(pipeline.Merge(endless, failing, silent), pipeline.NewSink("sink", 1, func(ctx context.Context, _ int) error {
			<-ctx.Done()
			return ctx.Err()
		}))
		errc := runAsync(t.Context(), p)

		synctest.Wait() // the sink holds one item, its queue another: endless waits in emit
		assert.Equal(t, int64(2), emitted.Load(), "items emitted before emit blocked")
		close(fail)
		err := <-errc
		require.ErrorIs(t, err, errBoom)
		serr, ok := errors.AsType[*pipeline.StageError](err)
		require.True(t, ok, "want a *StageError, got %T", err)
		assert.Equal(t, "Generate#2", serr.Stage, "the failing source is named")
		require.Error(t, emitErr, "the blocked emit returned no error")
		require.ErrorIs(t, emitErr, errBoom, "emit returns the run's cause")
		rep := p.Report()
		checkAccounting(t, rep)
		assert.Equal(t, int64(1), row(t, rep, "sink").Failed, "the sink's item in flight")
	})
}

// TestMergeBreakClosesSources breaks out of a loop over All of merged Generates (two
// that emit without end, one that only waits for its context): by the time the loop
// statement returns, every source's deferred cleanup has run.
func TestMergeBreakClosesSources(t *testing.T) {
	t.Parallel()
	var closed [3]atomic.Bool
	gen := func(k int) func(context.Context, func(int) error) error {
		return func(ctx context.Context, emit func(int) error) error {
			defer closed[k].Store(true)
			if k == 2 {
				<-ctx.Done()
				return ctx.Err()
			}
			for i := 0; ; i++ {
				if err := emit(k*1_000_000 + i); err != nil {
					return err
				}
			}
		}
	}
	p := pipeline.New(pipeline.WithBuffer(2))
	m := pipeline.Merge(pipeline.Generate(p, gen(0)), pipeline.Generate(p, gen(1)), pipeline.Generate(p, gen(2)))
	seen := 0
	for _, err := range pipeline.All(t.Context(), m) {
		require.NoError(t, err)
		if seen++; seen == 50 {
			break
		}
	}
	for k := range closed {
		assert.Truef(t, closed[k].Load(), "source %d still open after the loop returned", k)
	}
	rep := p.Report()
	require.NoError(t, rep.Err)
	checkAccounting(t, rep)
}

// TestMergeMisuse checks that Merge panics when given no stream or streams of different
// pipelines.
func TestMergeMisuse(t *testing.T) {
	t.Parallel()
	msg := assertPanicsPipeline(t, func() { pipeline.Merge[int]() })
	assert.Contains(t, msg, "Merge")
	p1, p2 := pipeline.New(), pipeline.New()
	a, b := pipeline.FromSlice(p1, ints(3)), pipeline.FromSlice(p2, ints(3))
	msg = assertPanicsPipeline(t, func() { pipeline.Merge(a, b) })
	assert.Contains(t, msg, "different pipelines")
	assertPanicsPipeline(t, func() { pipeline.Tee(pipeline.FromSlice(p1, ints(3)), 0) })
}

// TestTeeEveryBranch checks that each of three branches of a Tee gets every item, with
// branches of different shapes (a one-worker sink, which keeps the order, and stages
// with several workers).
func TestTeeEveryBranch(t *testing.T) {
	t.Parallel()
	const n = 500
	p := pipeline.New(pipeline.WithBuffer(4))
	br := pipeline.Tee(pipeline.FromSlice(p, ints(n)), 3)
	require.Len(t, br, 3)
	var c [3]collector[int]
	pipeline.To(br[0], pipeline.NewSink("sink0", 1, c[0].add))
	pipeline.To(pipeline.Then(br[1], pipeline.NewStage("work1", 3, identity)), pipeline.NewSink("sink1", 2, c[1].add))
	pipeline.To(br[2], pipeline.NewSink("sink2", 4, c[2].add, pipeline.WithBuffer(0)))
	require.NoError(t, p.Run(t.Context()))
	assert.Equal(t, ints(n), c[0].got(), "a one-worker branch keeps the order")
	assert.ElementsMatch(t, ints(n), c[1].got())
	assert.ElementsMatch(t, ints(n), c[2].got())
	rep := p.Report()
	checkAccounting(t, rep)
	for _, name := range []string{"sink0", "work1", "sink1", "sink2"} {
		assert.Equal(t, int64(n), row(t, rep, name).In, "items that reached %s", name)
	}
}

// TestTeeSlowestSetsPace blocks one branch of a three-way Tee and lets the other two run
// freely until everything is blocked. The blocked branch holds slowWorkers + slowBuffer
// items (one per worker, the rest queued); the source's next item is offered to the
// branches one after the other, so it reaches the branch offered before the blocked one
// and not the one after, and the source then waits. A fast branch has therefore
// received at most slowWorkers + slowBuffer + 1 items, whatever its own buffer and
// workers, and with the blocked branch in the middle the two fast ones received
// 2 × (slowWorkers + slowBuffer) + 1 together. Once released, every branch gets all.
func TestTeeSlowestSetsPace(t *testing.T) {
	t.Parallel()
	const n = 1000
	for _, slowWorkers := range []int{1, 3} {
		for _, slowBuffer := range []int{0, 2, 5} {
			t.Run(fmt.Sprintf("workers=%d/buf=%d", slowWorkers, slowBuffer), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					var taken atomic.Int64
					src := counted(n, &taken)
					release := make(chan struct{})
					var fast [2]atomic.Int64
					var slow atomic.Int64
					p := pipeline.New()
					br := pipeline.Tee(pipeline.FromSeq(p, src), 3)
					fastSink := func(k int) func(context.Context, int) error {
						return func(context.Context, int) error { fast[k].Add(1); return nil }
					}
					pipeline.To(br[0], pipeline.NewSink("fast0", 2, fastSink(0), pipeline.WithBuffer(8)))
					pipeline.To(br[1], pipeline.NewSink("slow", slowWorkers, countReleased(release, &slow), pipeline.WithBuffer(slowBuffer)))
					pipeline.To(br[2], pipeline.NewSink("fast2", 3, fastSink(1), pipeline.WithBuffer(1)))
					errc := runAsync(t.Context(), p)

					synctest.Wait() // everything waits for the slow branch
					hold := int64(slowWorkers + slowBuffer)
					for k := range fast {
						assert.LessOrEqualf(t, fast[k].Load(), hold+1, "fast branch %d ran ahead of the slow one", k)
						assert.GreaterOrEqualf(t, fast[k].Load(), hold, "fast branch %d", k)
					}
					assert.Equal(t, 2*hold+1, fast[0].Load()+fast[1].Load(), "items the fast branches received")
					assert.Equal(t, hold+1, taken.Load(), "items the source gave up")
					assert.Zero(t, slow.Load())

					close(release)
					require.NoError(t, <-errc)
					assert.Equal(t, int64(n), fast[0].Load())
					assert.Equal(t, int64(n), fast[1].Load())
					assert.Equal(t, int64(n), slow.Load())
					rep := p.Report()
					checkAccounting(t, rep)
					assert.LessOrEqual(t, row(t, rep, "slow").PeakQueue, slowBuffer)
				})
			})
		}
	}
}

// TestTeeInlinePanicNamesItsRow: a panic in an inline operator on a Tee branch was
// reported under the first row feeding the branch's consumer, which can be a source
// merged in after the operator that never saw the item; it names the row the item came
// from (the Tee's upstream, a source or a stage).
func TestTeeInlinePanicNamesItsRow(t *testing.T) {
	t.Parallel()
	for _, upstream := range []string{"src", "up", "ord"} {
		t.Run(upstream, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			other := pipeline.FromSlice(p, ints(5), pipeline.WithName("other")) // first in wiring order
			s := pipeline.FromSlice(p, ints(20), pipeline.WithName("src"))
			switch upstream {
			case "up":
				s = pipeline.Then(s, pipeline.NewStage("up", 2, identity))
			case "ord":
				s = pipeline.Then(s, pipeline.NewStage("ord", 2, identity, pipeline.WithOrdered(0)))
			}
			br := pipeline.Tee(s, 2)
			m := pipeline.Map(br[0], func(i int) int {
				if i == 7 {
					panic("map")
				}
				return i
			})
			pipeline.To(pipeline.Merge(other, m), pipeline.NewSink("x", 1, func(context.Context, int) error { return nil }))
			pipeline.To(br[1], pipeline.NewSink("y", 1, func(context.Context, int) error { return nil }))

			err := p.Run(t.Context())

			_, isPanic := errors.AsType[*pipeline.PanicError](err)
			require.Truef(t, isPanic, "want a panic, got %v", err)
			se, ok := errors.AsType[*pipeline.StageError](err)
			require.True(t, ok)
			assert.Equal(t, upstream, se.Stage, "the row the item came from: %v", err)
			rep := p.Report()
			checkAccounting(t, rep)
			assert.Equal(t, int64(1), row(t, rep, "x").Failed, "the panicking item failed in the branch\n%v", rep)
		})
	}
}

// A Tee branch read by All, with another branch ending in To, runs when ranged; Run on such
// a pipeline panics instead of waiting for its context; a second All panics.
func TestTeeBranchReadByAllRunsWhenRanged(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	b := pipeline.Tee(pipeline.FromSlice(p, ints(50)), 2)
	var sunk atomic.Int64
	pipeline.To(b[0], pipeline.NewSink("sink", 2, func(context.Context, int) error { sunk.Add(1); return nil }))
	out, err := pipeline.Collect(t.Context(), b[1])
	require.NoError(t, err)
	assert.ElementsMatch(t, ints(50), out)
	assert.Equal(t, int64(50), sunk.Load())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a hang fails, not waits
	defer cancel()
	msg := assertPanicsPipeline(t, func() { _ = p.Run(ctx) })
	assert.Contains(t, msg, "Collect")
	out, err = pipeline.Collect(t.Context(), b[1]) // and again: a pipeline runs any number of times
	require.NoError(t, err)
	assert.Len(t, out, 50)
	assertPanicsPipeline(t, func() { pipeline.All(t.Context(), b[0]) })
}

// An inline operator panicking on one Tee branch after another branch took the item: the
// upstream counts it as sent, the failing branch's row as failed.
func TestTeeInlinePanicAfterOtherBranchTookItem(t *testing.T) {
	t.Parallel()
	for _, filter := range []bool{false, true} {
		p := pipeline.New()
		b := pipeline.Tee(pipeline.FromSlice(p, ints(3)), 2)
		pipeline.To(b[0], pipeline.NewSink("a", 1, func(context.Context, int) error { return nil }))
		s := b[1]
		if filter {
			s = pipeline.Filter(s, func(int) bool { return true }, pipeline.WithName("keep"))
		}
		s = pipeline.Map(s, func(i int) int {
			if i == 0 {
				panic("boom")
			}
			return i
		})
		pipeline.To(s, pipeline.NewSink("b", 1, func(context.Context, int) error { return nil }))
		err := p.Run(t.Context())
		_, isPanic := errors.AsType[*pipeline.PanicError](err)
		require.True(t, isPanic, "want a panic, got %v", err)
		rep := p.Report()
		checkAccounting(t, rep)
		src, a := row(t, rep, "FromSlice"), row(t, rep, "a")
		assert.Equal(t, src.Out, a.In, "what the source sent reached branch a\n%v", rep)
		first := "b"
		if filter {
			first = "keep"
		}
		fb := row(t, rep, first)
		assert.Equal(t, src.Out, fb.In, "what the source sent reached branch b\n%v", rep)
		assert.Equal(t, int64(1), fb.Failed, "the panicking item failed on branch b\n%v", rep)
		assert.GreaterOrEqual(t, fb.Out, int64(0))
	}
}

// The report lists rows upstream first across a Tee, and Next names every row a row feeds.
func TestTeeReportRowsUpstreamFirst(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	b := pipeline.Tee(pipeline.FromSlice(p, ints(5), pipeline.WithName("src")), 2)
	pipeline.To(b[0], pipeline.NewSink("a", 1, func(context.Context, int) error { return nil }))
	mid := pipeline.Then(b[1], pipeline.NewStage("mid", 1, identity))
	pipeline.To(mid, pipeline.NewSink("b", 1, func(context.Context, int) error { return nil }))
	require.NoError(t, p.Run(t.Context()))
	rep := p.Report()
	var names []string
	for _, s := range rep.Stages {
		names = append(names, s.Name)
	}
	assert.Equal(t, []string{"src", "a", "mid", "b"}, names)
	assert.ElementsMatch(t, []string{"a", "mid"}, row(t, rep, "src").Next)
	assert.Equal(t, []string{"b"}, row(t, rep, "mid").Next)
	assert.Empty(t, row(t, rep, "a").Next)
}

// A panic in an inline operator of a nested Tee's branch, when the outer Tee's other branch
// is wired last: the StageError names the source (it named no stage).
func TestNestedTeeInlinePanicNamesSource(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, ints(3))
	a := pipeline.Tee(src, 2)
	b := pipeline.Tee(a[0], 2)
	sink := func(n string) *pipeline.Stage[int, struct{}] {
		return pipeline.NewSink(n, 1, func(context.Context, int) error { return nil })
	}
	pipeline.To(pipeline.Map(b[0], func(int) int { panic("map") }), sink("b0"))
	pipeline.To(b[1], sink("b1"))
	pipeline.To(a[1], sink("a1"))
	err := p.Run(context.Background())
	var se *pipeline.StageError
	if assert.ErrorAs(t, err, &se) {
		assert.Equal(t, "FromSlice", se.Stage, "err: %v", err)
	}
	rep := p.Report()
	t.Log("\n", rep)
	for _, s := range rep.Stages {
		t.Logf("%s next=%v", s.Name, s.Next)
	}
	checkAccounting(t, rep)
}

// A Tee whose branches Merge back into one sink: the source row's Next names that sink once.
func TestTeeMergedBackNamesNextOnce(t *testing.T) {
	p := pipeline.New()
	br := pipeline.Tee(pipeline.FromSlice(p, ints(3)), 2)
	pipeline.To(pipeline.Merge(br[0], br[1]), pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
	require.NoError(t, p.Run(context.Background()))
	rep := p.Report()
	t.Log("\n", rep)
	assert.Equal(t, []string{"s"}, row(t, rep, "FromSlice").Next)
}

// TestTeeMergeRunsAgain runs one graph of nested Tees merged back together three times
// (a pipeline may run again once a run has returned), one run stopped by a failure
// first: wiring keeps nothing of a run in the graph's definitions, so each later run
// delivers every item to every branch and reports the same rows and edges.
func TestTeeMergeRunsAgain(t *testing.T) {
	t.Parallel()
	const n = 200
	var fail atomic.Bool
	fail.Store(true)
	p := pipeline.New(pipeline.WithBuffer(4))
	outer := pipeline.Tee(pipeline.FromSlice(p, ints(n), pipeline.WithName("src")), 2)
	inner := pipeline.Tee(pipeline.Then(outer[1], pipeline.NewStage("mid", 2, func(_ context.Context, v int) (int, error) {
		if v == n/2 && fail.Load() {
			return 0, errors.New("boom")
		}
		return v, nil
	})), 2)
	var c collector[int]
	pipeline.To(pipeline.Merge(outer[0], inner[0], inner[1]), pipeline.NewSink("sink", 2, c.add))
	require.Error(t, p.Run(t.Context()))
	fail.Store(false)
	var first pipeline.Report
	for i := range 2 {
		c.mu.Lock()
		c.items = nil
		c.mu.Unlock()
		require.NoError(t, p.Run(t.Context()), "run %d", i+2)
		want := slices.Concat(ints(n), ints(n), ints(n))
		assert.ElementsMatch(t, want, c.got(), "run %d", i+2)
		rep := p.Report()
		checkAccounting(t, rep)
		assert.Equal(t, int64(3*n), row(t, rep, "sink").In, "run %d", i+2)
		assert.ElementsMatch(t, []string{"mid", "sink"}, row(t, rep, "src").Next, "run %d", i+2)
		assert.Equal(t, []string{"sink"}, row(t, rep, "mid").Next, "run %d", i+2)
		if i == 0 {
			first = rep
			continue
		}
		var a, b []string
		for _, s := range first.Stages {
			a = append(a, s.Name)
		}
		for _, s := range rep.Stages {
			b = append(b, s.Name)
		}
		assert.Equal(t, a, b, "the rows of the third run")
	}
}
