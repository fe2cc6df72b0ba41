package pipeline_test

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/gopipeline/pipeline"
)

// TestMisusePanics checks that every programmer error panics at construction (or at
// Run, for an incomplete graph) with a message that starts with "pipeline:".
func TestMisusePanics(t *testing.T) {
	t.Parallel()
	fn := func(_ context.Context, v int) (int, error) { return v, nil }
	sinkFn := func(context.Context, int) error { return nil }
	flatFn := func(context.Context, int, func(int)) error { return nil }
	cases := []struct {
		name string
		f    func(ctx context.Context)
	}{
		{"NewStage workers 0", func(ctx context.Context) { pipeline.NewStage("s", 0, fn) }},
		{"NewStage workers -1", func(ctx context.Context) { pipeline.NewStage("s", -1, fn) }},
		{"NewFlatStage workers 0", func(ctx context.Context) { pipeline.NewFlatStage("s", 0, flatFn) }},
		{"NewSink workers 0", func(ctx context.Context) { pipeline.NewSink("s", 0, sinkFn) }},
		{"NewStage nil fn", func(ctx context.Context) { pipeline.NewStage[int, int]("s", 1, nil) }},
		{"NewFlatStage nil fn", func(ctx context.Context) { pipeline.NewFlatStage[int, int]("s", 1, nil) }},
		{"NewSink nil fn", func(ctx context.Context) { pipeline.NewSink[int]("s", 1, nil) }},
		{"NewStage empty name", func(ctx context.Context) { pipeline.NewStage("", 1, fn) }},
		{"NewFlatStage empty name", func(ctx context.Context) { pipeline.NewFlatStage("", 1, flatFn) }},
		{"NewSink empty name", func(ctx context.Context) { pipeline.NewSink("", 1, sinkFn) }},
		{"nil Option", func(ctx context.Context) { pipeline.NewStage("s", 1, fn, nil) }},
		{"negative WithBuffer", func(ctx context.Context) { pipeline.WithBuffer(-1) }},
		{"WithDeadLetter of the wrong type", func(ctx context.Context) {
			pipeline.NewStage("s", 1, fn, pipeline.WithDeadLetter(func(context.Context, pipeline.DeadLetter[string]) error { return nil }))
		}},
		{"WithDeadLetter nil", func(ctx context.Context) { pipeline.WithDeadLetter[int](nil) }},
		{"WithTimeout 0", func(ctx context.Context) { pipeline.WithTimeout(0) }},
		{"WithRetry 0 attempts", func(ctx context.Context) { pipeline.WithRetry(0, nil) }},
		{"WithClassifier nil", func(ctx context.Context) { pipeline.WithClassifier(nil) }},
		{"ExponentialBackoff base 0", func(ctx context.Context) { pipeline.ExponentialBackoff(0, time.Second) }},
		{"ExponentialBackoff limit < base", func(ctx context.Context) { pipeline.ExponentialBackoff(time.Second, time.Millisecond) }},
		{"ConstantBackoff negative", func(ctx context.Context) { pipeline.ConstantBackoff(-time.Second) }},
		{"WithErrorBudget MaxRatio 1", func(ctx context.Context) { pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 1, MinSample: 1}) }},
		{"WithErrorBudget MaxRatio NaN", func(ctx context.Context) {
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: math.NaN(), MinSample: 1})
		}},
		{"WithErrorBudget MinSample 0", func(ctx context.Context) { pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1}) }},
		{"WithErrorBudget Window < MinSample", func(ctx context.Context) {
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 10, Window: 5})
		}},
		{"NewDeadLetterBuffer negative", func(ctx context.Context) { pipeline.NewDeadLetterBuffer[int](-1) }},
		{"Map nil", func(ctx context.Context) { pipeline.Map[int, int](pipeline.FromSlice(pipeline.New(), []int{1}), nil) }},
		{"Filter nil", func(ctx context.Context) { pipeline.Filter(pipeline.FromSlice(pipeline.New(), []int{1}), nil) }},
		{"Generate nil", func(ctx context.Context) { pipeline.Generate[int](pipeline.New(), nil) }},
		{"FromChan nil", func(ctx context.Context) { pipeline.FromChan[int](pipeline.New(), nil) }},
		{"a stream consumed twice", func(ctx context.Context) {
			s := pipeline.FromSlice(pipeline.New(), []int{1})
			pipeline.Then(s, pipeline.NewStage("a", 1, fn))
			pipeline.Then(s, pipeline.NewStage("b", 1, fn))
		}},
		{"a stream consumed by Map, then Then", func(ctx context.Context) {
			s := pipeline.FromSlice(pipeline.New(), []int{1})
			pipeline.Map(s, func(v int) int { return v })
			pipeline.Then(s, pipeline.NewStage("b", 1, fn))
		}},
		{"To of a NewFlatStage", func(ctx context.Context) {
			pipeline.To(pipeline.FromSlice(pipeline.New(), []int{1}), pipeline.NewFlatStage("s", 1, func(context.Context, int, func(struct{})) error { return nil }))
		}},
		{"two streams read by All", func(ctx context.Context) {
			b := pipeline.Tee(pipeline.FromSlice(pipeline.New(), []int{1}), 2)
			pipeline.All(ctx, b[0])
			pipeline.All(ctx, b[1])
		}},
		{"Run on a pipeline read by Collect", func(ctx context.Context) {
			p := pipeline.New()
			b := pipeline.Tee(pipeline.FromSlice(p, []int{1}), 2)
			pipeline.To(b[0], pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
			pipeline.All(ctx, b[1])
			_ = p.Run(ctx)
		}},
		{"a duplicate stage name", func(ctx context.Context) {
			s := pipeline.Then(pipeline.FromSlice(pipeline.New(), []int{1}), pipeline.NewStage("dup", 1, fn))
			pipeline.Then(s, pipeline.NewStage("dup", 1, fn))
		}},
		{"the same Stage twice in one pipeline", func(ctx context.Context) {
			st := pipeline.NewStage("work", 1, fn)
			s := pipeline.Then(pipeline.FromSlice(pipeline.New(), []int{1}), st)
			pipeline.Then(s, st)
		}},
		{"Run with an unconsumed stream", func(ctx context.Context) {
			p := pipeline.New()
			pipeline.To(pipeline.FromSlice(p, []int{1}), pipeline.NewSink("sink", 1, sinkFn))
			pipeline.Then(pipeline.FromSlice(p, []int{2}), pipeline.NewStage("dangling", 1, fn))
			_ = p.Run(ctx)
		}},
		{"Collect with an unconsumed stream", func(ctx context.Context) {
			p := pipeline.New()
			pipeline.FromSlice(p, []int{2})
			_, _ = pipeline.Collect(ctx, pipeline.FromSlice(p, []int{1}))
		}},
		{"Run with no sink", func(ctx context.Context) { _ = pipeline.New().Run(ctx) }},
		{"WorkersNeeded negative rate", func(ctx context.Context) { pipeline.WorkersNeeded(-1, time.Second, 1) }},
		{"WorkersNeeded NaN rate", func(ctx context.Context) { pipeline.WorkersNeeded(math.NaN(), time.Second, 1) }},
		{"WorkersNeeded infinite rate", func(ctx context.Context) { pipeline.WorkersNeeded(math.Inf(1), time.Second, 1) }},
		{"WorkersNeeded negative latency", func(ctx context.Context) { pipeline.WorkersNeeded(1, -time.Second, 1) }},
		{"WorkersNeeded headroom < 1", func(ctx context.Context) { pipeline.WorkersNeeded(1, time.Second, 0.5) }},
		{"WorkersNeeded NaN headroom", func(ctx context.Context) { pipeline.WorkersNeeded(1, time.Second, math.NaN()) }},
		{"WorkersNeeded infinite headroom", func(ctx context.Context) { pipeline.WorkersNeeded(1, time.Second, math.Inf(1)) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assertPanicsPipeline(t, func() { tc.f(t.Context()) })
		})
	}
}

// TestMisuseMessages spot-checks that the panic messages name the problem.
func TestMisuseMessages(t *testing.T) {
	t.Parallel()
	fn := func(_ context.Context, v int) (int, error) { return v, nil }
	assert.PanicsWithValue(t, `pipeline: NewStage("fetch"): workers must be at least 1, got 0`, func() {
		pipeline.NewStage("fetch", 0, fn)
	})
	assert.PanicsWithValue(t, "pipeline: WithBuffer(-3): the buffer must not be negative", func() {
		pipeline.WithBuffer(-3)
	})
	msg := assertPanicsPipeline(t, func() {
		s := pipeline.Then(pipeline.FromSlice(pipeline.New(), []int{1}), pipeline.NewStage("dup", 1, fn))
		pipeline.Then(s, pipeline.NewStage("dup", 1, fn))
	})
	assert.Contains(t, msg, `"dup"`)
	msg = assertPanicsPipeline(t, func() {
		pipeline.NewStage("s", 1, fn, pipeline.WithDeadLetter(func(context.Context, pipeline.DeadLetter[string]) error { return nil }))
	})
	assert.Contains(t, msg, "WithDeadLetter")
}

// TestPipelineOptionsOnNew checks that the options New accepts do not panic.
func TestPipelineOptionsOnNew(t *testing.T) {
	t.Parallel()
	assert.NotPanics(t, func() {
		pipeline.New(
			pipeline.WithBuffer(0),
			pipeline.WithClassifier(func(error) pipeline.Class { return pipeline.ClassItem }),
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.5, MinSample: 1}),
		)
	})
}

// TestWorkersNeeded checks Little's law with headroom, and the minimum of 1.
func TestWorkersNeeded(t *testing.T) {
	t.Parallel()
	cases := []struct {
		rate     float64
		latency  time.Duration
		headroom float64
		want     int
	}{
		{750, 20 * time.Millisecond, 1.25, 19},
		{750, 2 * time.Millisecond, 1.25, 2},
		{0, time.Second, 1, 1},
		{1000, 0, 1, 1},
		{1, time.Millisecond, 1, 1},
		{100, time.Second, 1, 100},
		{100, time.Second, 1.5, 150},
		{1e12, time.Hour, 10, math.MaxInt32},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, pipeline.WorkersNeeded(c.rate, c.latency, c.headroom),
			"WorkersNeeded(%v, %v, %v)", c.rate, c.latency, c.headroom)
	}
}

// TestWorkersNeededExactProducts checks products that are whole numbers: 100 items/s
// at 70 ms is exactly 7 items in service, so 7 workers, not 8.
func TestWorkersNeededExactProducts(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 7, pipeline.WorkersNeeded(100, 70*time.Millisecond, 1))
	assert.Equal(t, 14, pipeline.WorkersNeeded(200, 70*time.Millisecond, 1))
	assert.Equal(t, 7, pipeline.WorkersNeeded(1000, 7*time.Millisecond, 1))
}

// Nil options, sequences, streams and stages panic with a "pipeline:" message.
func TestNilArgumentsPanic(t *testing.T) {
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

// Run(nil) panics with context's message, and the pipeline can run again after it (the
// panic came after Run had marked the pipeline as running).
func TestRunNilContextLeavesPipelineRunnable(t *testing.T) {
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, ints(3)), pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
	func() {
		defer func() { t.Logf("panic: %v", recover()) }()
		_ = p.Run(nil) //nolint:staticcheck // a nil context is the misuse under test
	}()
	assert.NotPanics(t, func() { _ = p.Run(context.Background()) })
}

// TestOptionForAnotherItemType checks that the options whose function is kept untyped
// until the constructor (they fit steps of any item type) and checked by typed panic
// there, naming the option and both types, when made for another item type than the
// step's. (The client's per-key options are checked in checkClient: breaker_test.go,
// adaptive_test.go.)
func TestOptionForAnotherItemType(t *testing.T) {
	t.Parallel()
	fn := func(_ context.Context, v int) (int, error) { return v, nil }
	strDL := func(context.Context, pipeline.DeadLetter[string]) error { return nil }
	dir := t.TempDir() // WithCodec's case panics before it creates a file
	window := func(opt pipeline.WindowOption) {
		s := pipeline.FromSlice(pipeline.New(), []int{1})
		pipeline.Window(s, pipeline.Tumbling(time.Second), func(int) int { return 0 },
			func(int) time.Time { return time.Time{} }, pipeline.Fold(0, func(a, v int) int { return a + v }), opt)
	}
	cases := []struct {
		option string
		f      func()
	}{
		{"WithDeadLetter", func() { pipeline.NewStage("s", 1, fn, pipeline.WithDeadLetter(strDL)) }},
		{"WithKey", func() { pipeline.NewStage("s", 1, fn, pipeline.WithKey(func(string) string { return "" })) }},
		{"WithMaxBytes", func() {
			pipeline.Batch(pipeline.FromSlice(pipeline.New(), []int{1}), 2, pipeline.WithMaxBytes(10, func(string) int { return 1 }))
		}},
		{"WithLateItems", func() { window(pipeline.WithLateItems(strDL)) }},
		{"WithWatermarkPer", func() { window(pipeline.WithWatermarkPer(2, func(string) int { return 0 })) }},
		{"WithCodec", func() {
			_, _ = pipeline.OpenDeadLetterFile[int](filepath.Join(dir, "dl"), pipeline.WithCodec[string](pipeline.JSONCodec[string]{}))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.option, func(t *testing.T) {
			t.Parallel()
			msg := assertPanicsPipeline(t, tc.f)
			assert.Contains(t, msg, tc.option+" for another item type")
			assert.Contains(t, msg, "string")
			assert.Contains(t, msg, "of int")
		})
	}
	t.Run("an interface item type", func(t *testing.T) {
		t.Parallel()
		msg := assertPanicsPipeline(t, func() {
			pipeline.Batch(pipeline.FromSlice(pipeline.New(), []any{1}), 2, pipeline.WithMaxBytes(10, func(string) int { return 1 }))
		})
		assert.Contains(t, msg, "on a batch of interface {}")
	})
}
