package pipeline_test

// Regression tests for the twelve defects an independent randomized soak of the public
// API found (issue 8), one test each, named after the defect's number.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// S1: a checkpointed run whose source waited for a save once must not stop for good
// when the head item later settles elsewhere (dead-lettered or filtered) while a Batch
// that did not hold the head waits for input.
func TestSoak01CheckpointBatchAfterHeadSettlesElsewhere(t *testing.T) {
	t.Parallel()
	// The hang depended on timing (half the runs with a redo bound of 2): try often.
	redos := []int{3, 5, 17}
	for range 20 {
		redos = append(redos, 2)
	}
	for _, redo := range redos {
		synctest.Test(t, func(t *testing.T) {
			const n = 300
			store := &memStore{}
			p := pipeline.New(pipeline.WithBuffer(2))
			src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(redo))
			kept := pipeline.Filter(src, func(i int) bool { return i%7 != 3 })
			dl := pipeline.Then(kept, pipeline.NewStage("dl", 2, func(_ context.Context, i int) (int, error) {
				if i%5 == 1 {
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int])))
			var got atomic.Int64
			pipeline.ToBatches(dl, 10, pipeline.NewSink("sink", 1, func(_ context.Context, b []int) error {
				got.Add(int64(len(b)))
				return nil
			}))
			require.NoError(t, runWithin(t, p, time.Hour))
			assert.Equal(t, int64(n), store.pos, "the final checkpoint")
			checkAccounting(t, p.Report())
		})
	}
}

// runWithin runs p inside a synctest bubble and fails the test if the run takes longer
// than d of virtual time: a hung run that a ticker keeps from looking deadlocked (the
// checkpoint saver's) fails at once instead of at the test binary's timeout.
func runWithin(t *testing.T, p *pipeline.Pipeline, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-time.After(d):
		cancel()
		t.Fatalf("the run hung for %v (then returned %v)", d, <-errc)
		return nil
	}
}

// S2: a Tee branch read by All with another branch ending in To runs when ranged; Run
// on such a pipeline panics instead of waiting for its context; a second All panics.
func TestSoak02TeeWithAll(t *testing.T) {
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

// negStore loads a negative position.
type negStore struct{ memStore }

func (*negStore) Load(context.Context) (int64, error) { return -1, nil }

// S3: a store that loads a negative position fails the run with ErrBadCheckpoint.
func TestSoak03NegativeCheckpoint(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		pipeline.To(pipeline.FromCheckpoint(p, &negStore{}, from(10)),
			pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		err := runWithin(t, p, time.Hour)
		require.ErrorIs(t, err, pipeline.ErrBadCheckpoint)
	})
}

// S4: when the run stops during a byte-limit flush, the item that triggered the flush
// is counted (failed), so the batch row adds up.
func TestSoak04ByteFlushUnderCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		p := pipeline.New()
		batches := pipeline.Batch(pipeline.FromSlice(p, ints(6)), 10,
			pipeline.WithMaxBytes(2, func(int) int { return 1 }), pipeline.WithBuffer(0))
		pipeline.To(batches, pipeline.NewSink("sink", 1, func(ctx context.Context, _ []int) error {
			<-ctx.Done()
			return ctx.Err()
		}, pipeline.WithBuffer(0)))
		errc := make(chan error, 1)
		go func() { errc <- p.Run(ctx) }()
		synctest.Wait() // the sink holds [0 1]; the batch pushes [2 3], made room for by 4
		cancel(errBoom)
		require.ErrorIs(t, <-errc, errBoom)
		rep := p.Report()
		checkAccounting(t, rep)
		b := row(t, rep, "Batch")
		assert.Equal(t, b.In, b.Succeeded+b.Failed+b.NotStarted, "batch row\n%v", rep)
	})
}

// S5: an inline operator panicking on one Tee branch after another branch took the
// item: the upstream counts it as sent, the failing branch's row as failed.
func TestSoak05TeeInlinePanic(t *testing.T) {
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

// S6: a stage function calling runtime.Goexit (as t.FailNow does) fails the run with
// ErrGoexit instead of losing items silently.
func TestSoak06Goexit(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"stage", "sink", "source"} {
		p := pipeline.New()
		var src *pipeline.Stream[int]
		if where == "source" {
			src = pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
				if err := emit(0); err != nil {
					return err
				}
				runtime.Goexit()
				return nil
			})
		} else {
			src = pipeline.FromSlice(p, ints(3))
		}
		s := pipeline.Then(src, pipeline.NewStage("work", 1, func(_ context.Context, i int) (int, error) {
			if where == "stage" && i == 1 {
				runtime.Goexit()
			}
			return i, nil
		}))
		pipeline.To(s, pipeline.NewSink("sink", 1, func(_ context.Context, i int) error {
			if where == "sink" && i == 1 {
				runtime.Goexit()
			}
			return nil
		}))
		err := p.Run(t.Context())
		require.ErrorIs(t, err, pipeline.ErrGoexit, where)
		checkAccounting(t, p.Report())
	}
}

// S7: during a run, every row's In only grows between two Snapshots.
func TestSoak07SnapshotInGrows(t *testing.T) {
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
	done := make(chan error)
	go func() { done <- p.Run(t.Context()) }()
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

// S8: a keyed stage's queue holds at most what WithBuffer says, whatever the workers.
func TestSoak08KeyedBound(t *testing.T) {
	t.Parallel()
	for _, buf := range []int{0, 1, 3} {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			p := pipeline.New()
			s := pipeline.Then(pipeline.FromSlice(p, ints(100)), pipeline.NewStage("keyed", 4,
				func(ctx context.Context, i int) (int, error) {
					select {
					case <-release:
					case <-ctx.Done():
					}
					return i, nil
				}, pipeline.WithKey(func(i int) int { return i }), pipeline.WithBuffer(buf)))
			pipeline.To(s, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
			errc := make(chan error, 1)
			go func() { errc <- p.Run(t.Context()) }()
			synctest.Wait()
			k := row(t, p.Snapshot(), "keyed")
			assert.Equal(t, buf, k.QueueCap)
			assert.LessOrEqual(t, k.QueueLen, buf, "items waiting in a keyed stage's queues")
			close(release)
			require.NoError(t, <-errc)
			assert.LessOrEqual(t, row(t, p.Report(), "keyed").PeakQueue, buf)
		})
	}
}

// S9: an ordered stage holds at most its window of finished or started items, also
// while the window's items are being pushed to a slow consumer.
func TestSoak09OrderedWindowBound(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 4, 16} {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			var started, taken atomic.Int64
			p := pipeline.New()
			s := pipeline.Then(pipeline.FromSlice(p, ints(200)), pipeline.NewStage("ord", 4,
				func(_ context.Context, i int) (int, error) { started.Add(1); return i, nil },
				pipeline.WithOrdered(window)))
			pipeline.To(s, pipeline.NewSink("sink", 1, func(ctx context.Context, _ int) error {
				taken.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}, pipeline.WithBuffer(0)))
			errc := make(chan error, 1)
			go func() { errc <- p.Run(t.Context()) }()
			synctest.Wait() // the sink holds one item; the window fills behind it
			assert.LessOrEqual(t, started.Load()-taken.Load(), int64(window), "items started and not yet taken by the sink")
			close(release)
			require.NoError(t, <-errc)
		})
	}
}

// S10: the report lists rows upstream first across a Tee, and Next names every row a
// row feeds.
func TestSoak10RowOrderAcrossTee(t *testing.T) {
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

// S11: a classifier's undefined class fails the run clearly, and one bad record never
// makes a dead-letter file unreadable.
func TestSoak11UndefinedClass(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f, err := pipeline.OpenDeadLetterFile[int](filepath.Join(dir, "dead.jsonl"))
	require.NoError(t, err)
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, ints(3)), pipeline.NewSink("s", 1, func(context.Context, int) error { return errBoom },
		pipeline.WithClassifier(func(error) pipeline.Class { return pipeline.Class(7) }),
		pipeline.WithDeadLetter(f.Add)))
	err = p.Run(t.Context())
	require.ErrorIs(t, err, errBoom)
	assert.Contains(t, err.Error(), "undefined")
	assert.Zero(t, p.Report().DeadLettered())
	require.NoError(t, f.Close())

	// A file with one record the reader cannot decode among good ones.
	good := `{"stage":"s","item":1,"attempts":1,"class":"item","err_type":"error","first_error":"x","last_error":"x","time":"2026-01-01T00:00:00Z"}` + "\n"
	bad := strings.Replace(good, `"item"`, `"Class(7)"`, 1)
	bad = strings.Replace(bad, `"item":1`, `"item":2`, 1)
	bad = strings.Replace(bad, `"class":"item"`, `"class":"Class(7)"`, 1)
	path := filepath.Join(dir, "mixed.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(good+bad+good), 0o600))
	dls, err := pipeline.ReadDeadLetters[int](path)
	var rerr *pipeline.DeadLetterReadError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, []int{2}, rerr.Lines)
	assert.Len(t, dls, 2, "the good records are read")
	q := pipeline.New()
	got, err := pipeline.Collect(t.Context(), pipeline.Replay[int](q, path, ""))
	require.ErrorAs(t, err, &rerr, "Replay names the malformed lines")
	assert.Empty(t, got, "before it sends anything")
}

// S12: nil options, sequences, streams and stages panic with a "pipeline:" message.
func TestSoak12NilArguments(t *testing.T) {
	t.Parallel()
	// A pipeline of its own per call: the cases run in parallel, and building is not
	// safe for concurrent use.
	src := func() *pipeline.Stream[int] { return pipeline.FromSlice(pipeline.New(), ints(1)) }
	sink := pipeline.NewSink("sink", 1, func(context.Context, []int) error { return nil })
	var nilStream *pipeline.Stream[int]
	var nilStage *pipeline.Stage[int, int]
	for name, f := range map[string]func(){
		"New(nil)":              func() { pipeline.New(nil) },
		"Batch(nil option)":     func() { pipeline.Batch(src(), 2, nil) },
		"ToBatches(nil option)": func() { pipeline.ToBatches(src(), 2, sink, nil) },
		"FromCheckpoint(nil option)": func() {
			pipeline.FromCheckpoint(pipeline.New(), &memStore{}, from(1), nil)
		},
		"NewStage(nil option)":  func() { pipeline.NewStage("s", 1, identity, nil) },
		"FromSlice(nil option)": func() { pipeline.FromSlice(pipeline.New(), ints(1), nil) },
		"FromSeq(nil)":          func() { pipeline.FromSeq[int](pipeline.New(), nil) },
		"FromSeq2(nil)":         func() { pipeline.FromSeq2[int](pipeline.New(), nil) },
		"FromSlice(nil p)":      func() { pipeline.FromSlice(nil, ints(1)) },
		"Then(nil stream)":      func() { pipeline.Then(nilStream, pipeline.NewStage("x", 1, identity)) },
		"Then(nil stage)":       func() { pipeline.Then(src(), nilStage) },
		"To(nil sink)":          func() { pipeline.To(src(), nil) },
		"Map(nil stream)":       func() { pipeline.Map(nilStream, func(i int) int { return i }) },
		"Filter(nil stream)":    func() { pipeline.Filter(nilStream, func(int) bool { return true }) },
		"Batch(nil stream)":     func() { pipeline.Batch(nilStream, 2) },
		"Tee(nil stream)":       func() { pipeline.Tee(nilStream, 2) },
		"Merge(nil stream)":     func() { pipeline.Merge(src(), nilStream) },
		"Collect(nil stream)":   func() { _, _ = pipeline.Collect(context.Background(), nilStream) },
		"WithName(empty)":       func() { pipeline.WithName("") },
		"WithCodec(nil)":        func() { pipeline.WithCodec[int](nil) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			assertPanicsPipeline(t, f)
		})
	}
}

// Names: every row a user creates can be named, and the names must be unique.
func TestSoakRowNames(t *testing.T) {
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

// An item's error that stops the run says how many attempts were made and, when that is
// why, that the stage has no WithDeadLetter.
func TestSoakItemErrorMessages(t *testing.T) {
	t.Parallel()
	flaky := func(_ context.Context, i int) (int, error) { return 0, pipeline.Transient(fmt.Errorf("flaky %d", i)) }
	for _, tc := range []struct {
		opts []pipeline.StageOption
		want string
	}{
		{
			[]pipeline.StageOption{pipeline.WithRetry(3, nil)},
			`pipeline: stage "x": item failed after 3 attempts, and the stage has no WithDeadLetter to set it aside: flaky 0`,
		},
		{nil, `pipeline: stage "x": item failed (1 attempt), and the stage has no WithDeadLetter to set it aside: flaky 0`},
	} {
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(1)), pipeline.NewStage("x", 1, flaky, tc.opts...)),
			pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		err := p.Run(t.Context())
		require.EqualError(t, err, tc.want)
		serr, ok := errors.AsType[*pipeline.StageError](err)
		require.True(t, ok)
		assert.True(t, serr.NoDeadLetter)
	}
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, ints(1)), pipeline.NewSink("x", 1, func(context.Context, int) error { return errBoom }))
	require.EqualError(t, p.Run(t.Context()), `pipeline: stage "x": boom`, "a fatal error on the first attempt")
}
