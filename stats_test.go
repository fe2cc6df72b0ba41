package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
)

// TestSnapshotNamesBottleneck builds the seed's staged pipeline (a slow fetch stage
// feeding a fast write stage) in virtual time, takes a snapshot mid-run, and checks that
// the bottleneck report names the fetch stage, with a worker suggestion from Little's
// law.
func TestSnapshotNamesBottleneck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New(pipeline.WithBuffer(100))
		fetch := pipeline.Then(pipeline.FromSlice(p, ints(2000)), pipeline.NewStage("fetch", 16,
			func(ctx context.Context, v int) (int, error) {
				time.Sleep(20 * time.Millisecond)
				return v, nil
			}, pipeline.WithTimeout(22*time.Millisecond)))
		pipeline.To(fetch, pipeline.NewSink("write", 4, func(ctx context.Context, v int) error {
			time.Sleep(2 * time.Millisecond)
			return nil
		}))
		done := runAsync(context.Background(), p)
		time.Sleep(time.Second + time.Millisecond) // virtual: 50 rounds of fetches
		synctest.Wait()
		snap := p.Snapshot()
		require.True(t, snap.Running)
		f := row(t, snap, "fetch")
		assert.Equal(t, 100, f.QueueLen, "the fetch stage's queue is full")
		assert.Equal(t, 16, f.Busy)
		assert.InDelta(t, 800, f.Rate, 20, "16 workers at 20 ms")
		assert.Equal(t, 20*time.Millisecond, f.Latency.P50.Truncate(time.Millisecond))
		b := snap.Bottleneck(1500)
		assert.Equal(t, "fetch", b.Stage, b.String())
		assert.Equal(t, pipeline.WorkersNeeded(1500, f.Latency.P50, 1.25), b.Suggested)
		require.Len(t, b.Warnings, 1, "p99 20 ms is within 80 %% of the 22 ms timeout")
		assert.Contains(t, b.Warnings[0], `"fetch"`)
		assert.Contains(t, b.String(), `bottleneck: stage "fetch"`)
		require.NoError(t, <-done)
		final := p.Snapshot()
		assert.False(t, final.Running)
		assert.Equal(t, "fetch", final.Bottleneck(0).Stage, "the final report uses peak queue lengths")
	})
}

// TestSnapshotRecentLatency: after the stage's latency shifts from 10 ms to 40 ms, a
// Snapshot's Recent percentiles show the new latency while the whole run's still show
// the old one; a final report has no Recent.
func TestSnapshotRecentLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New(pipeline.WithBuffer(8))
		start := time.Now()
		slow := pipeline.Then(pipeline.FromSlice(p, ints(12000)), pipeline.NewStage("call", 4,
			func(ctx context.Context, v int) (int, error) {
				d := 10 * time.Millisecond
				if time.Since(start) >= 20*time.Second {
					d = 40 * time.Millisecond
				}
				time.Sleep(d)
				return v, nil
			}))
		pipeline.To(slow, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		done := runAsync(context.Background(), p)
		var snap pipeline.Report
		for range 35 { // a Snapshot a second, as the dashboard takes them
			time.Sleep(time.Second)
			synctest.Wait()
			snap = p.Snapshot()
		}
		require.True(t, snap.Running)
		c := row(t, snap, "call")
		assert.Equal(t, 10*time.Millisecond, c.Latency.P50.Truncate(time.Millisecond), "the run's: mostly 10 ms")
		assert.Equal(t, 40*time.Millisecond, c.Recent.P50.Truncate(time.Millisecond), "the last 10 s: 40 ms")
		assert.Equal(t, 40*time.Millisecond, c.Recent.P99.Truncate(time.Millisecond))
		assert.InDelta(t, 1000, c.Recent.Count, 12, "10 s at 4 workers × 25/s")
		assert.LessOrEqual(t, c.Recent.Max, c.Latency.Max)
		assert.Equal(t, int64(12000), row(t, snap, "FromSlice").Total)
		require.NoError(t, <-done)
		final := p.Report()
		assert.Zero(t, row(t, final, "call").Recent)
		assert.Equal(t, int64(12000), row(t, final, "FromSlice").Total)
		assert.Zero(t, row(t, final, "call").Total)
	})
}

// TestSnapshotRecentWithNoAttempts: when no attempt ended in the last 10 s (the worker
// waits in its item), Recent has no count and no maximum either; it showed the whole
// run's maximum with a count of 0.
func TestSnapshotRecentWithNoAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New(pipeline.WithBuffer(8))
		release := make(chan struct{})
		slow := pipeline.Then(pipeline.FromSlice(p, ints(6)), pipeline.NewStage("call", 1,
			func(_ context.Context, v int) (int, error) {
				if v == 5 {
					<-release
				}
				time.Sleep(5 * time.Millisecond)
				return v, nil
			}))
		pipeline.To(slow, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		done := runAsync(context.Background(), p)
		time.Sleep(time.Second)
		synctest.Wait()
		first := row(t, p.Snapshot(), "call") // the baseline of the next one
		require.Equal(t, int64(5), first.Latency.Count)
		time.Sleep(11 * time.Second)
		synctest.Wait()
		c := row(t, p.Snapshot(), "call")
		assert.Zero(t, c.Recent.Count, "no attempt ended in the last 10 s")
		assert.Zero(t, c.Recent.Max, "%+v", c.Recent)
		assert.Positive(t, c.Latency.Max, "the run's")
		close(release)
		require.NoError(t, <-done)
	})
}

// TestCausesAreBounded dead-letters items whose messages name them with letters (a
// hex id): the stage keeps 100 cause groups, and counts the rest in their type's
// "(other messages)" group; every dead letter is counted once. It kept a group per item.
func TestCausesAreBounded(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	s := pipeline.Then(pipeline.FromSlice(p, ints(2000)), pipeline.NewStage("lookup", 2,
		func(_ context.Context, v int) (int, error) {
			return 0, pipeline.Permanent(fmt.Errorf("user %x not found", v*0xabcdef))
		}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int])))
	pipeline.To(s, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	require.NoError(t, p.Run(t.Context()))
	c := row(t, p.Report(), "lookup")
	assert.LessOrEqual(t, len(c.Causes), 101, "groups kept")
	var n int64
	var other bool
	for _, g := range c.Causes {
		n += g.Count
		other = other || g.Message == "(other messages)"
	}
	assert.Equal(t, int64(2000), n, "each dead letter counted once")
	assert.True(t, other)
	assert.Equal(t, "(other messages)", c.Causes[0].Message, "the largest group")
}

// TestS1RetryCounts runs scenario S1 with the retry policy in virtual time (instant and
// exact) and checks that the seed's counts, 9,895 processed, 105 dead-lettered and 200
// retried, appear in the snapshot, in the report, in the errors by type and in the
// events.
func TestS1RetryCounts(t *testing.T) {
	fx := scenario.LoadS1(t, "bench/testdata/items.json")
	synctest.Test(t, func(t *testing.T) {
		var events sync.Map // kind -> *atomic.Int64
		count := func(e pipeline.Event) {
			n, _ := events.LoadOrStore(e.Kind, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		}
		var sunk atomic.Int64
		p := scenario.S1Retry(fx, &sunk, pipeline.WithObserver(count))
		done := runAsync(context.Background(), p)
		time.Sleep(900 * time.Millisecond) // everything but the hanging items is done; none timed out yet
		synctest.Wait()
		live := p.Snapshot()
		e := row(t, live, "enrich")
		assert.Equal(t, int64(9895), e.Succeeded)
		assert.Equal(t, int64(100), e.DeadLettered, "only the permanent ones so far")
		assert.Equal(t, int64(200), e.Retried)
		assert.Equal(t, int64(5), e.InFlight, "the hanging items")
		require.NoError(t, <-done)

		rep := p.Report()
		e = row(t, rep, "enrich")
		assert.Equal(t, int64(9895), e.Succeeded)
		assert.Equal(t, int64(105), e.DeadLettered)
		assert.Equal(t, int64(200), e.Retried)
		assert.Equal(t, int64(9895), sunk.Load())
		assert.Equal(t, []pipeline.ErrorCount{
			{Type: "error", Retried: 200, DeadLettered: 100},
			{Type: "timeout", DeadLettered: 5},
		}, e.Errors)
		assert.Equal(t, []pipeline.Cause{
			{Type: "error", Message: "bad record", Count: 100},
			{Type: "timeout", Message: "context deadline exceeded", Count: 5},
		}, e.Causes)
		for kind, want := range map[pipeline.EventKind]int64{pipeline.EventRetry: 200, pipeline.EventDeadLetter: 105, pipeline.EventStageDone: 2} {
			n, ok := events.Load(kind)
			require.True(t, ok, kind.String())
			assert.Equal(t, want, n.(*atomic.Int64).Load(), kind.String())
		}
		checkReport(t, rep)
	})
}

// loggedStage returns the stage "st" of the logger tests: item 1 fails once and is
// retried, items from 2 on are dead-lettered (into a buffer of 10).
func loggedStage() *pipeline.Stage[int, int] {
	tries := map[int]int{}
	return pipeline.NewStage("st", 1, func(_ context.Context, v int) (int, error) {
		tries[v]++
		if v == 1 && tries[v] == 1 {
			return 0, pipeline.Transient(errBoom)
		}
		if v >= 2 {
			return 0, pipeline.Permanent(errBoom)
		}
		return v, nil
	}, pipeline.WithRetry(2, nil), pipeline.WithDeadLetter(pipeline.NewDeadLetterBuffer[int](10).Add))
}

func TestWithLogger(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	var mu sync.Mutex
	l := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := pipeline.New(pipeline.WithLogger(l), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.5, MinSample: 4}))
	st := loggedStage()
	_, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(10)), st))
	require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, want := range []string{
		`level=DEBUG msg="pipeline: retrying item" stage=st attempt=1 error=boom`,
		`level=WARN msg="pipeline: item dead-lettered" stage=st attempts=1 error=boom`,
		`level=ERROR msg="pipeline: error budget tripped" stage=st`,
		`level=INFO msg="pipeline: stage done" stage=st`,
	} {
		assert.Contains(t, out, want)
	}
	assert.Equal(t, 3, strings.Count(out, "dead-lettered"), "items 2, 3 and 4 fail; the budget trips at 3/5 > 0.5")
}

// ctxKey is the key of the value TestWithLoggerLogsWithItsContext puts in the run's
// context.
type ctxKey struct{}

// ctxHandler is a slog.Handler that records, for each message, the ctxKey value of the
// context it was given.
type ctxHandler struct {
	mu   *sync.Mutex
	seen map[string][]any
}

func (h ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h ctxHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h ctxHandler) WithGroup(string) slog.Handler            { return h }
func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[r.Message] = append(h.seen[r.Message], ctx.Value(ctxKey{}))
	return nil
}

// TestWithLoggerLogsWithItsContext checks that WithLogger logs each event with a context
// that carries the values of the run's context (a trace's span, say), for the events of
// an item (retry, dead letter, budget) and of the run (checkpoint, stage done).
func TestWithLoggerLogsWithItsContext(t *testing.T) {
	t.Parallel()
	h := ctxHandler{mu: new(sync.Mutex), seen: map[string][]any{}}
	// Drain: the items before the budget trips settle, so the final save moves.
	p := pipeline.New(pipeline.WithLogger(slog.New(h)), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.5, MinSample: 4, Drain: true}))
	src := pipeline.FromCheckpoint(p, newTxStore(), from(10), pipeline.WithSaveEvery(1))
	st := loggedStage()
	pipeline.To(pipeline.Then(src, st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	ctx := context.WithValue(t.Context(), ctxKey{}, "trace-42")
	require.ErrorIs(t, p.Run(ctx), pipeline.ErrBudgetExceeded)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, msg := range []string{
		"pipeline: retrying item", "pipeline: item dead-lettered", "pipeline: error budget tripped",
		"pipeline: checkpoint saved", "pipeline: stage done",
	} {
		require.NotEmpty(t, h.seen[msg], msg)
		for _, v := range h.seen[msg] {
			assert.Equal(t, "trace-42", v, msg)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func TestObserverMisuse(t *testing.T) {
	t.Parallel()
	assertPanicsPipeline(t, func() { pipeline.WithObserver(nil) })
	assertPanicsPipeline(t, func() { pipeline.WithLogger(nil) })
}

// TestEnumNames pins the names of every value of the exported enumerations, and the
// form fmt gives a value without one (EventKind's start at 1: 0 has none).
func TestEnumNames(t *testing.T) {
	t.Parallel()
	names := func(vs ...fmt.Stringer) string {
		var b strings.Builder
		for i, v := range vs {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(v.String())
		}
		return b.String()
	}
	assert.Equal(t, "not processed, committed, dead-lettered, handed back, Outcome(4)",
		names(pipeline.NotProcessed, pipeline.Committed, pipeline.DeadLettered, pipeline.HandedBack, pipeline.HandedBack+1))
	assert.Equal(t, "closed, open, half-open, BreakerState(3)",
		names(pipeline.BreakerClosed, pipeline.BreakerOpen, pipeline.BreakerHalfOpen, pipeline.BreakerHalfOpen+1))
	assert.Equal(t, "fatal, item, transient, Class(3)",
		names(pipeline.ClassFatal, pipeline.ClassItem, pipeline.ClassTransient, pipeline.ClassTransient+1))
	assert.Equal(t, "EventKind(0), retry, dead-letter, budget, checkpoint, stage-done, breaker-open, "+
		"breaker-half-open, breaker-closed, limit, stuck, EventKind(11), EventKind(255)",
		names(pipeline.EventKind(0), pipeline.EventRetry, pipeline.EventDeadLetter, pipeline.EventBudget, pipeline.EventCheckpoint,
			pipeline.EventStageDone, pipeline.EventBreakerOpen, pipeline.EventBreakerHalfOpen, pipeline.EventBreakerClosed,
			pipeline.EventLimit, pipeline.EventStuck, pipeline.EventStuck+1, pipeline.EventKind(255)))
}

// TestSnapshotInFlightCountsStartedItems: a Snapshot's InFlight counted the items a
// worker had taken in its run but not started (about 60 for one worker blocked in its
// 6th item), and those a Batch had taken and not yet put in a batch; it counts the items
// started and not settled: one per busy worker, a batch's items.
func TestSnapshotInFlightCountsStartedItems(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"plain", "ordered", "flat", "sink"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const n, blockAt = 300, 5
				gate, block := make(chan struct{}), make(chan struct{})
				wait := func(i int) {
					switch i {
					case 0: // until the queue is full: the next run is long
						<-gate
					case blockAt:
						<-block
					}
				}
				p := pipeline.New()
				src := pipeline.FromSlice(p, ints(n))
				switch kind {
				case "plain", "ordered":
					var opts []pipeline.StageOption
					if kind == "ordered" {
						opts = append(opts, pipeline.WithOrdered(0))
					}
					s := pipeline.Then(src, pipeline.NewStage("work", 1, func(_ context.Context, i int) (int, error) {
						wait(i)
						return i, nil
					}, opts...))
					pipeline.To(s, nopSink())
				case "flat":
					s := pipeline.Then(src, pipeline.NewFlatStage("work", 1, func(_ context.Context, i int, emit func(int)) error {
						wait(i)
						emit(i)
						return nil
					}))
					pipeline.To(s, nopSink())
				case "sink":
					pipeline.To(src, pipeline.NewSink("work", 1, func(_ context.Context, i int) error {
						wait(i)
						return nil
					}))
				}
				errc := runAsync(t.Context(), p)
				synctest.Wait() // the source waits for room
				close(gate)
				synctest.Wait() // the worker waits in item blockAt, its run's other items in hand
				w := row(t, p.Snapshot(), "work")
				assert.Equal(t, 1, w.Busy)
				assert.Equal(t, int64(1), w.InFlight, "items started and not settled\n%+v", w)
				close(block)
				require.NoError(t, <-errc)
				rep := p.Report()
				checkReport(t, rep)
				assert.Zero(t, row(t, rep, "work").InFlight)
			})
		})
	}
	t.Run("batch", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			const n, size = 300, 2
			block := make(chan struct{})
			p := pipeline.New()
			b := pipeline.Batch(pipeline.FromSlice(p, ints(n)), size)
			first := true
			pipeline.To(b, pipeline.NewSink("sink", 1, func(context.Context, []int) error {
				if first { // the batcher waits to hand the second batch over
					first = false
					<-block
				}
				return nil
			}, pipeline.WithBuffer(0)))
			errc := runAsync(t.Context(), p)
			synctest.Wait()
			bt := row(t, p.Snapshot(), "Batch")
			assert.Equal(t, int64(size), bt.InFlight, "the batch being handed over\n%+v", bt)
			assert.Equal(t, bt.In, bt.Succeeded+bt.Failed+bt.NotStarted+bt.InFlight,
				"the items taken and not in a batch are not started\n%+v", bt)
			close(block)
			require.NoError(t, <-errc)
			rep := p.Report()
			checkAccounting(t, rep)
			assert.Zero(t, row(t, rep, "Batch").InFlight)
		})
	})
}

// An observer that panics on EventDeadLetter fails the run like a stage panic, and the item
// is counted once (it was counted both DeadLettered and Failed).
func TestObserverPanicOnDeadLetterCountsItemOnce(t *testing.T) {
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

// An observer that panics on EventStageDone (or EventCheckpoint) fails the run like a panic
// in a stage, as WithObserver's doc says; it crashed the whole process (the event was
// emitted outside any recover).
func TestObserverPanicFailsRunNotProcess(t *testing.T) {
	for _, kind := range []string{"stage-done", "checkpoint"} {
		t.Run(kind, func(t *testing.T) {
			if os.Getenv("OBSERVER_PANIC_CHILD") == kind {
				childObserverPanic(kind)
				return
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestObserverPanicFailsRunNotProcess$/^"+kind+"$", "-test.v")
			cmd.Env = append(os.Environ(), "OBSERVER_PANIC_CHILD="+kind)
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
		store := pipeline.NewFileCheckpoint(filepath.Join(os.TempDir(), fmt.Sprintf("observer-panic-ck-%d", os.Getpid())))
		defer func() { _ = os.Remove(filepath.Join(os.TempDir(), fmt.Sprintf("observer-panic-ck-%d", os.Getpid()))) }()
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

// During a run, every row's In only grows between two Snapshots.
func TestSnapshotInOnlyGrows(t *testing.T) {
	t.Parallel()
	for range 15 { // a race: one run in three showed it
		snapshotInGrows(t)
	}
}

func snapshotInGrows(t *testing.T) {
	t.Helper()
	p := pipeline.New(pipeline.WithBuffer(4))
	s := pipeline.Then(pipeline.FromSlice(p, ints(5000)), pipeline.NewStage("a", 2, identity))
	s = pipeline.Then(s, pipeline.NewStage("b", 3, identity, pipeline.WithKey(func(i int) int { return i % 5 })))
	s = pipeline.Then(s, pipeline.NewStage("c", 2, identity, pipeline.WithOrdered(8)))
	pipeline.To(s, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	done := runAsync(t.Context(), p)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			last := map[string]int64{}
			for range 500 {
				for _, r := range p.Snapshot().Stages {
					if !assert.GreaterOrEqual(t, r.In, last[r.Name], "row %q: In went down", r.Name) {
						return
					}
					last[r.Name] = r.In
				}
			}
		})
	}
	require.NoError(t, <-done)
	wg.Wait()
}

// TestReportWords: Line counts a stage's retries (progress lines showed none), and
// String does not say "batch batch" for a batch row named batch.
func TestReportWords(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	var calls atomic.Int64
	work := pipeline.Then(pipeline.FromSlice(p, ints(10)), pipeline.NewStage("work", 1, func(_ context.Context, v int) (int, error) {
		if calls.Add(1) == 1 {
			return 0, pipeline.Transient(errors.New("once"))
		}
		return v, nil
	}, pipeline.WithRetry(2, nil)))
	pipeline.ToBatches(work, 4, pipeline.NewSink("save", 1, func(context.Context, []int) error { return nil }), pipeline.WithName("batch"))
	require.NoError(t, p.Run(t.Context()))
	rep := p.Report()
	assert.Contains(t, rep.Line(), "work ", rep.Line())
	assert.Contains(t, rep.Line(), " retried=1 |", "the work stage's retries")
	assert.Contains(t, rep.String(), "\nbatch: 3 batches: 2 full,")
	assert.NotContains(t, rep.String(), "batch batch")
}

// TestDeclaredTotal checks that a source that cannot know its total reports the one
// WithTotal declares, and that the declared total, even a wrong one, leaves In and
// NotStarted to what the source yielded.
func TestDeclaredTotal(t *testing.T) {
	t.Parallel()
	seq := func(yield func(int) bool) {
		for i := range 7 {
			if !yield(i) {
				return
			}
		}
	}
	for _, tc := range []struct {
		name   string
		source func(*pipeline.Pipeline) *pipeline.Stream[int]
		total  int64
	}{
		{"FromSeq exact", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.FromSeq(p, seq, pipeline.WithTotal(7), pipeline.WithName("src"))
		}, 7},
		{"FromSeq too many", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.FromSeq(p, seq, pipeline.WithTotal(10), pipeline.WithName("src"))
		}, 10},
		{"Generate", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
				return emitInts(emit, 7)
			}, pipeline.WithTotal(5), pipeline.WithName("src"))
		}, 5},
		{"undeclared", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.FromSeq(p, seq, pipeline.WithName("src"))
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			pipeline.To(tc.source(p), pipeline.NewSink("sink", 2, func(context.Context, int) error { return nil }))
			require.NoError(t, p.Run(t.Context()))
			rep := p.Report()
			src := row(t, rep, "src")
			assert.Equal(t, tc.total, src.Total)
			assert.Equal(t, int64(7), src.In, "In counts what the source yielded")
			assert.Zero(t, src.NotStarted)
			assert.Zero(t, src.Resumed, "only a checkpointed source resumes")
			checkReport(t, rep)
		})
	}
}

func TestDeclaredTotalMisuse(t *testing.T) {
	t.Parallel()
	assertPanicsPipeline(t, func() { pipeline.WithTotal(0) })
	assertPanicsPipeline(t, func() { pipeline.FromSlice(pipeline.New(), []int{1, 2}, pipeline.WithTotal(2)) })
}
