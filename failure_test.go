package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// TestFailureInjection injects an error, and separately a panic, at every position of a
// chain (source, three stages, sink), at the first, a middle and the last item, with 1
// and 4 workers per stage. Whatever fails, Run must return that failure as a
// *StageError naming where it happened, leak nothing (TestMain), not hang (the test
// timeout), and leave a report in which every item is accounted for.
func TestFailureInjection(t *testing.T) {
	t.Parallel()
	const n = 20
	// Sources: "generate" (Generate), "seq" (FromSeq2 for errors, a panicking iter.Seq
	// for panics); with a stage or the sink failing, the source is FromSlice.
	positions := []string{"generate", "seq", "s1", "s2", "s3", "sink"}
	ats := []struct {
		name string
		item int
	}{{"first", 0}, {"middle", n / 2}, {"last", n - 1}}
	for _, pos := range positions {
		for _, kind := range []string{"error", "panic"} {
			for _, at := range ats {
				for _, workers := range []int{1, 4} {
					name := fmt.Sprintf("%s/%s/%s/workers=%d", pos, kind, at.name, workers)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						testInjectedFailure(t, n, pos, kind, at.item, workers)
					})
				}
			}
		}
	}
}

func testInjectedFailure(t *testing.T, n int, pos, kind string, item, workers int) {
	// inject fails (returns an error or panics) at position where for item v, when that
	// is the configured failure point.
	inject := func(where string, v int) error {
		if where != pos || v != item {
			return nil
		}
		err := fmt.Errorf("%s at item %d: %w", where, v, errBoom)
		if kind == "panic" {
			panic(err)
		}
		return err
	}

	p := pipeline.New(pipeline.WithBuffer(2)) // small queues, so that producers block too
	var src *pipeline.Stream[int]
	switch {
	case pos == "generate":
		src = pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
			for i := range n {
				if err := inject("generate", i); err != nil {
					return err
				}
				if err := emit(i); err != nil {
					return err
				}
			}
			return nil
		})
	case pos == "seq" && kind == "error":
		src = pipeline.FromSeq2(p, func(yield func(int, error) bool) {
			for i := range n {
				if err := inject("seq", i); err != nil {
					yield(0, err)
					return
				}
				if !yield(i, nil) {
					return
				}
			}
		})
	case pos == "seq":
		var seq iter.Seq[int] = func(yield func(int) bool) {
			for i := range n {
				_ = inject("seq", i) // panics at the failure point
				if !yield(i) {
					return
				}
			}
		}
		src = pipeline.FromSeq(p, seq)
	default:
		src = pipeline.FromSlice(p, ints(n))
	}
	s := src
	for _, name := range []string{"s1", "s2", "s3"} {
		s = pipeline.Then(s, pipeline.NewStage(name, workers, func(_ context.Context, v int) (int, error) {
			if err := inject(name, v); err != nil {
				return 0, err
			}
			return v, nil
		}))
	}
	pipeline.To(s, pipeline.NewSink("sink", workers, func(_ context.Context, v int) error {
		return inject("sink", v)
	}))

	err := p.Run(t.Context())

	// Sources are named after their constructor.
	stage := map[string]string{"generate": "Generate", "seq": "FromSeq2"}[pos]
	if pos == "seq" && kind == "panic" {
		stage = "FromSeq"
	}
	if stage == "" {
		stage = pos
	}
	require.Error(t, err)
	se, ok := errors.AsType[*pipeline.StageError](err)
	require.Truef(t, ok, "want a *StageError, got %T: %v", err, err)
	assert.Equal(t, stage, se.Stage, "the error names the failing stage")
	require.ErrorIs(t, err, errBoom)
	pe, isPanic := errors.AsType[*pipeline.PanicError](err)
	if kind == "panic" {
		require.True(t, isPanic, "a panic is reported as a *PanicError")
		assert.NotEmpty(t, pe.Stack)
		assert.Contains(t, string(pe.Stack), "failure_test.go", "the stack shows where the panic happened")
		require.ErrorIs(t, pe, errBoom, "errors.Is sees through a panic with an error value")
	} else {
		assert.False(t, isPanic, "an error is not reported as a panic")
	}

	rep := p.Report()
	assert.Equal(t, err, rep.Err)
	checkReport(t, rep)
	if pos == "generate" || pos == "seq" {
		// Every item before the failing one was sent, and the failing one was not.
		assert.Equal(t, int64(item), row(t, rep, stage).Succeeded, "items the source sent\n%v", rep)
	} else {
		assert.GreaterOrEqual(t, row(t, rep, stage).Failed, int64(1), "the failing item counts as failed\n%v", rep)
	}
}

// TestInlineOperatorPanicAccounting checks that a panic in an inline operator fails
// the run under the upstream's name and keeps the accounting whole: the item the
// operator panicked on must be counted once, as failed, not as both delivered and
// failed (or as sent and never received).
func TestInlineOperatorPanicAccounting(t *testing.T) {
	t.Parallel()
	const n, bad = 10, 3
	panicky := func(v int) int {
		if v == bad {
			panic(fmt.Errorf("map %d: %w", v, errBoom))
		}
		return v
	}
	cases := []struct {
		name     string
		upstream string // the name the run's error must carry
		build    func(p *pipeline.Pipeline) *pipeline.Stream[int]
	}{
		{"Map after a source", "FromSlice", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.Map(pipeline.FromSlice(p, ints(n)), panicky)
		}},
		{"Map after a stage", "work", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("work", 1, identity))
			return pipeline.Map(s, panicky)
		}},
		{"Filter after a stage", "work", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("work", 1, identity))
			return pipeline.Filter(s, func(v int) bool { return panicky(v) >= 0 })
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			pipeline.To(tc.build(p), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))

			err := p.Run(t.Context())

			require.ErrorIs(t, err, errBoom)
			se, ok := errors.AsType[*pipeline.StageError](err)
			require.True(t, ok)
			assert.Equal(t, tc.upstream, se.Stage)
			_, isPanic := errors.AsType[*pipeline.PanicError](err)
			assert.True(t, isPanic)
			checkReport(t, p.Report())
		})
	}
}

func identity(_ context.Context, v int) (int, error) { return v, nil }

// A stage, sink or source function calling runtime.Goexit (as t.FailNow does) fails the run
// with ErrGoexit instead of losing items silently.
func TestGoexitFailsRun(t *testing.T) {
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

// An item's error that stops the run says how many attempts were made and, when that is
// why, that the stage has no WithDeadLetter.
func TestItemErrorMessageNamesAttempts(t *testing.T) {
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
