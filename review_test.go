package pipeline_test

// Regression tests for the bugs an independent review of the issue-8 rework found.

import (
	"context"
	"errors"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// An inline panic while the reorder window flushes a run of several items: the items
// already pushed before the panic stay in "held" and are counted Failed in the ordered
// row, while downstream received them.
func TestReviewOrderedFlushPanicDoubleCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		src := pipeline.FromSlice(p, []int{0, 1, 2})
		st := pipeline.Then(src, pipeline.NewStage("ord", 3, func(_ context.Context, v int) (int, error) {
			if v == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			return v, nil
		}, pipeline.WithOrdered(0)))
		m := pipeline.Map(st, func(v int) int {
			if v == 1 {
				panic("map")
			}
			return v
		})
		pipeline.To(m, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		_ = p.Run(context.Background())
		rep := p.Report()
		t.Log("\n", rep)
		checkAccounting(t, rep)
		ord, sink := row(t, rep, "ord"), row(t, rep, "sink")
		assert.Equal(t, ord.Out, sink.In, "ord sent = sink In")
		assert.LessOrEqual(t, ord.Out, ord.Succeeded, "one-to-one stage: Out <= Succeeded")
		assert.Equal(t, int64(3), ord.Failed+ord.Succeeded-ord.Out+sink.In, "each item once")
	})
}

// A Filter after Flatten: its In is taken from its feeder's Out, which counts batches.
func TestReviewFilterAfterFlattenIn(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, ints(10))
	f := pipeline.Filter(pipeline.Flatten(pipeline.Batch(src, 5)), func(v int) bool { return v%2 == 0 }, pipeline.WithName("even"))
	pipeline.To(f, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	require.NoError(t, p.Run(context.Background()))
	rep := p.Report()
	t.Log("\n", rep)
	ev := row(t, rep, "even")
	assert.Equal(t, int64(10), ev.In)
	assert.Equal(t, int64(5), ev.Out)
	assert.Equal(t, row(t, rep, "sink").In, ev.Out)
}

// A panic in an inline operator of a nested Tee's branch, when the outer Tee's other
// branch is wired last: the StageError names no stage.
func TestReviewNestedTeePanicStageName(t *testing.T) {
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

// runtime.Goexit in a Batch's sizer: the item in hand is counted nowhere.
func TestReviewGoexitInSizer(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, ints(3))
	b := pipeline.Batch(src, 10, pipeline.WithMaxBytes(100, func(v int) int {
		if v == 1 {
			runtime.Goexit()
		}
		return 1
	}))
	pipeline.To(b, pipeline.NewSink("sink", 1, func(context.Context, []int) error { return nil }))
	err := p.Run(context.Background())
	require.ErrorIs(t, err, pipeline.ErrGoexit)
	rep := p.Report()
	t.Log("\n", rep)
	checkAccounting(t, rep)
	bt := row(t, rep, "Batch")
	assert.Equal(t, bt.In, bt.Succeeded+bt.Failed+bt.NotStarted, "batch row")
}

// runtime.Goexit in an inline operator of a Tee's second branch, after the first
// branch took the item.
// A dead-letter line as v0.1 wrote it (class as a number) is malformed now.
func TestReviewReadOldClassNumber(t *testing.T) {
	path := t.TempDir() + "/dl.jsonl"
	line := `{"stage":"s","item":1,"attempts":1,"class":1,"err_type":"error","first_error":"x","last_error":"x","time":"2026-01-01T00:00:00Z"}` + "\n"
	require.NoError(t, os.WriteFile(path, []byte(line), 0o644))
	dls, err := pipeline.ReadDeadLetters[int](path)
	require.NoError(t, err)
	assert.Len(t, dls, 1)
}

// A keyed stage with WithBuffer(n): no more than n items wait, whatever the keys.
func TestReviewKeyedBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		src := pipeline.FromSlice(p, ints(50))
		var snaps []pipeline.StageReport
		st := pipeline.NewSink("k", 3, func(ctx context.Context, v int) error {
			time.Sleep(time.Millisecond)
			return nil
		}, pipeline.WithBuffer(2), pipeline.WithKey(func(v int) int { return v % 2 }))
		pipeline.To(src, st)
		done := make(chan error)
		go func() { done <- p.Run(context.Background()) }()
		for {
			select {
			case err := <-done:
				require.NoError(t, err)
				for _, s := range snaps {
					assert.LessOrEqual(t, s.QueueLen, 2)
				}
				checkAccounting(t, p.Report())
				return
			case <-time.After(300 * time.Microsecond):
				if s, ok := p.Snapshot().Stage("k"); ok {
					snaps = append(snaps, s)
				}
			}
		}
	})
}

func TestReviewOrderedFlushGoexit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		src := pipeline.FromSlice(p, []int{0, 1, 2})
		st := pipeline.Then(src, pipeline.NewStage("ord", 3, func(_ context.Context, v int) (int, error) {
			if v == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			return v, nil
		}, pipeline.WithOrdered(0)))
		m := pipeline.Map(st, func(v int) int {
			if v == 1 {
				runtime.Goexit()
			}
			return v
		})
		pipeline.To(m, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		err := p.Run(context.Background())
		require.ErrorIs(t, err, pipeline.ErrGoexit)
		rep := p.Report()
		t.Log("\n", rep)
		ord := row(t, rep, "ord")
		assert.LessOrEqual(t, ord.Out, ord.Succeeded, "one-to-one stage: Out <= Succeeded")
	})
}

// Run(nil) panics with context's message, after marking the pipeline as running.
func TestReviewRunNilCtx(t *testing.T) {
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, ints(3)), pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
	func() {
		defer func() { t.Logf("panic: %v", recover()) }()
		_ = p.Run(nil) //nolint:staticcheck // a nil context is the misuse under test
	}()
	assert.NotPanics(t, func() { _ = p.Run(context.Background()) })
}

type panicStore struct{ load, save bool }

func (s panicStore) Load(context.Context) (int64, error) {
	if s.load {
		panic("load")
	}
	return 0, nil
}

func (s panicStore) Save(context.Context, int64) error {
	if s.save {
		panic("save")
	}
	return nil
}

// A CheckpointStore whose Save panics, called by the saver goroutine: not recovered.
func TestReviewCrashSavePanics(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, panicStore{save: true}, from(100), pipeline.WithSaveEvery(1))
	pipeline.To(src, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
	err := p.Run(context.Background())
	_, isPanic := errors.AsType[*pipeline.PanicError](err)
	assert.True(t, isPanic, "want the store's panic as the run's error, got %v", err)
}

// A CheckpointStore whose Load panics, under Collect: exec runs in a goroutine.
func TestReviewCrashLoadPanicsCollect(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, panicStore{load: true}, from(10))
	_, err := pipeline.Collect(context.Background(), src)
	_, isPanic := errors.AsType[*pipeline.PanicError](err)
	assert.True(t, isPanic, "want the store's panic as the run's error, got %v", err)
}

// WithClassifier's doc: it classifies errors that "are not timeouts". It is given them.
func TestReviewNextDuplicates(t *testing.T) {
	p := pipeline.New()
	br := pipeline.Tee(pipeline.FromSlice(p, ints(3)), 2)
	pipeline.To(pipeline.Merge(br[0], br[1]), pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
	require.NoError(t, p.Run(context.Background()))
	rep := p.Report()
	t.Log("\n", rep)
	assert.Equal(t, []string{"s"}, row(t, rep, "FromSlice").Next)
}

// An observer that calls runtime.Goexit (t.FailNow) on EventCheckpoint ends the saver
// goroutine silently: the source, waiting for a save (WithMaxRedo), waits for ever.
func TestReviewObserverGoexitInSaverHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Only the first save's event, which the saver goroutine sends: the final save's
		// is sent from Run's own goroutine, where a Goexit ends the caller (as any call
		// of its own would).
		var once atomic.Bool
		p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
			if e.Kind == pipeline.EventCheckpoint && once.CompareAndSwap(false, true) {
				runtime.Goexit()
			}
		}))
		src := pipeline.FromCheckpoint(p, &memStore{}, from(100), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(2))
		pipeline.To(src, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
		done := make(chan error, 1)
		go func() { done <- p.Run(context.Background()) }()
		select {
		case err := <-done:
			t.Log("run ended:", err)
		case <-time.After(time.Hour):
			t.Fatal("run hangs")
		}
	})
}
