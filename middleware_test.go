package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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

// TestTimeoutDeadLettersHangingItem checks, in virtual time, that WithTimeout ends a
// hanging attempt after exactly the timeout and dead-letters its item as a timeout,
// while the other items flow past it at once.
func TestTimeoutDeadLettersHangingItem(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const d = 3 * time.Second
		start := time.Now()
		var hung time.Duration
		dead := pipeline.NewDeadLetterBuffer[int](10)
		p := pipeline.New()
		st := pipeline.NewStage("work", 2, func(ctx context.Context, v int) (int, error) {
			if v == 0 {
				<-ctx.Done()
				hung = time.Since(start)
				return 0, ctx.Err()
			}
			return v, nil
		}, pipeline.WithTimeout(d), pipeline.WithDeadLetter(dead.Add))
		var mu sync.Mutex
		arrived := map[int]time.Duration{}
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(20)), st), pipeline.NewSink("sink", 1, func(_ context.Context, v int) error {
			mu.Lock()
			defer mu.Unlock()
			arrived[v] = time.Since(start)
			return nil
		}))

		require.NoError(t, p.Run(t.Context()))

		assert.Equal(t, d, hung, "the attempt's context ends after exactly the timeout")
		assert.Equal(t, d, time.Since(start))
		require.Len(t, arrived, 19)
		for v, at := range arrived {
			assert.Zerof(t, at, "item %d waited for the hanging one", v)
		}
		items := dead.Items()
		require.Len(t, items, 1)
		dl := items[0]
		assert.Equal(t, 0, dl.Item)
		assert.Equal(t, "work", dl.Stage)
		assert.Equal(t, 1, dl.Attempts)
		assert.Equal(t, pipeline.ClassItem, dl.Class)
		assert.Equal(t, "timeout", dl.ErrType)
		assert.Contains(t, dl.LastError, d.String())
		assert.Equal(t, d, dl.Time.Sub(start), "the dead letter is stamped when the timeout fired")
		rep := p.Report()
		checkReport(t, rep)
		// A timeout's cause is what the function returned when its deadline passed.
		assert.Equal(t, []pipeline.Cause{{Type: "timeout", Message: "context deadline exceeded", Count: 1}}, rep.Causes())
	})
}

// fatalTimeoutErr returns the error of a run whose one attempt, with a timeout of 1 s,
// waits for its context's end and returns an error marked Fatal that wraps errBoom.
func fatalTimeoutErr(t *testing.T) error {
	t.Helper()
	p := pipeline.New()
	st := pipeline.NewStage("work", 1, func(ctx context.Context, v int) (int, error) {
		<-ctx.Done()
		return 0, pipeline.Fatal(fmt.Errorf("fetch %d: %w", v, errBoom))
	}, pipeline.WithTimeout(time.Second))
	_, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, []int{1}), st))
	return err
}

// TestTimeoutErrorMatches checks the error of a timed-out attempt: a function that
// marks it Fatal makes it the run's error, which matches ErrTimeout and the function's
// own error, and says after how long the attempt timed out.
func TestTimeoutErrorMatches(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		err := fatalTimeoutErr(t)
		require.ErrorIs(t, err, pipeline.ErrTimeout)
		require.ErrorIs(t, err, errBoom)
		assert.Contains(t, err.Error(), "timed out after 1s")
	})
}

// TestTimeoutErrorMatchesDeadlineExceeded checks what ErrTimeout's doc promises: the
// error of a timed-out attempt also matches context.DeadlineExceeded, even when the
// function's own error does not wrap it.
func TestTimeoutErrorMatchesDeadlineExceeded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		err := fatalTimeoutErr(t)
		require.ErrorIs(t, err, pipeline.ErrTimeout)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

// TestTimeoutExcludesBlockedSend checks that the time an item waits for room in a
// full downstream queue is not part of its attempt: a sink blocked for longer than
// the timeout does not make any item time out.
func TestTimeoutExcludesBlockedSend(t *testing.T) {
	t.Parallel()
	for _, flat := range []bool{false, true} {
		t.Run(fmt.Sprintf("flat=%v", flat), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const timeout, slow, n = time.Second, 5 * time.Second, 10
				start := time.Now()
				p := pipeline.New(pipeline.WithBuffer(0))
				var st *pipeline.Stage[int, int]
				if flat {
					st = pipeline.NewFlatStage("work", 1, func(_ context.Context, v int, emit func(int)) error {
						emit(v)
						emit(v)
						return nil
					}, pipeline.WithTimeout(timeout))
				} else {
					st = pipeline.NewStage("work", 1, identity, pipeline.WithTimeout(timeout))
				}
				var got collector[int]
				pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(ctx context.Context, v int) error {
					time.Sleep(slow) // virtual time: a sink slower than the timeout
					return got.add(ctx, v)
				}))

				require.NoError(t, p.Run(t.Context()))

				rep := p.Report()
				checkAccounting(t, rep)
				checkChain(t, rep)
				assert.Zero(t, rep.DeadLettered(), "no item timed out\n%v", rep)
				outs := n
				if flat {
					outs = 2 * n
				}
				assert.Len(t, got.got(), outs)
				assert.Equal(t, time.Duration(outs)*slow, time.Since(start))
			})
		})
	}
}

// retryRecorder is a stage function that fails with errs[i] on attempt i (nil:
// succeed) and records the virtual time of every attempt.
type retryRecorder struct {
	mu    sync.Mutex
	errs  []error
	times []time.Time
}

func (r *retryRecorder) fn(ctx context.Context, v int) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.times = append(r.times, time.Now())
	i := len(r.times) - 1
	if i < len(r.errs) && r.errs[i] != nil {
		return 0, r.errs[i]
	}
	return v, nil
}

func (r *retryRecorder) gaps() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gaps []time.Duration
	for i := 1; i < len(r.times); i++ {
		gaps = append(gaps, r.times[i].Sub(r.times[i-1]))
	}
	return gaps
}

func attemptErr(i int) error { return fmt.Errorf("attempt %d: %w", i, errBoom) }

// TestRetry checks WithRetry in virtual time: the waits between attempts, and the
// four ways retrying ends (success, a Permanent error, out of attempts, cancel).
func TestRetry(t *testing.T) {
	t.Parallel()
	const wait = 250 * time.Millisecond
	t.Run("waits the backoff between attempts, then succeeds", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			r := &retryRecorder{errs: []error{
				pipeline.Transient(attemptErr(1)), pipeline.Transient(attemptErr(2)), pipeline.Transient(attemptErr(3)),
			}}
			p := pipeline.New()
			st := pipeline.NewStage("work", 1, r.fn, pipeline.WithRetry(5, pipeline.ConstantBackoff(wait)))
			got, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, []int{42}), st))
			require.NoError(t, err)
			assert.Equal(t, []int{42}, got)
			assert.Equal(t, []time.Duration{wait, wait, wait}, r.gaps())
			w := row(t, p.Report(), "work")
			assert.Equal(t, int64(3), w.Retried)
			assert.Equal(t, int64(1), w.Succeeded)
			assert.Zero(t, w.DeadLettered)
		})
	})
	t.Run("stops at a Permanent error", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			r := &retryRecorder{errs: []error{
				pipeline.Transient(attemptErr(1)), pipeline.Permanent(attemptErr(2)), pipeline.Transient(attemptErr(3)),
			}}
			dead := pipeline.NewDeadLetterBuffer[int](1)
			p := pipeline.New()
			st := pipeline.NewStage("work", 1, r.fn, pipeline.WithRetry(5, pipeline.ConstantBackoff(wait)), pipeline.WithDeadLetter(dead.Add))
			_, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, []int{42}), st))
			require.NoError(t, err)
			assert.Equal(t, []time.Duration{wait}, r.gaps())
			require.Len(t, dead.Items(), 1)
			dl := dead.Items()[0]
			assert.Equal(t, 2, dl.Attempts)
			assert.Equal(t, pipeline.ClassItem, dl.Class)
			assert.Equal(t, "attempt 1: boom", dl.FirstError)
			assert.Equal(t, "attempt 2: boom", dl.LastError)
		})
	})
	t.Run("dead-letters after the last attempt", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			const attempts = 4
			var errs []error
			for i := 1; i <= attempts; i++ {
				errs = append(errs, pipeline.Transient(attemptErr(i)))
			}
			r := &retryRecorder{errs: errs}
			dead := pipeline.NewDeadLetterBuffer[int](1)
			start := time.Now()
			p := pipeline.New()
			st := pipeline.NewStage("work", 1, r.fn, pipeline.WithRetry(attempts, pipeline.ConstantBackoff(wait)), pipeline.WithDeadLetter(dead.Add))
			_, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, []int{42}), st))
			require.NoError(t, err)
			assert.Equal(t, []time.Duration{wait, wait, wait}, r.gaps())
			assert.Equal(t, (attempts-1)*wait, time.Since(start))
			require.Len(t, dead.Items(), 1)
			dl := dead.Items()[0]
			assert.Equal(t, 42, dl.Item)
			assert.Equal(t, attempts, dl.Attempts)
			assert.Equal(t, pipeline.ClassTransient, dl.Class)
			assert.Equal(t, "attempt 1: boom", dl.FirstError)
			assert.Equal(t, "attempt 4: boom", dl.LastError)
			w := row(t, p.Report(), "work")
			assert.Equal(t, int64(attempts-1), w.Retried)
			assert.Equal(t, int64(1), w.DeadLettered)
		})
	})
	t.Run("the backoff wait ends at cancel", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			cause := errors.New("shutting down")
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			r := &retryRecorder{errs: []error{pipeline.Transient(attemptErr(1)), pipeline.Transient(attemptErr(2))}}
			p := pipeline.New()
			st := pipeline.NewStage("work", 1, r.fn, pipeline.WithRetry(3, pipeline.ConstantBackoff(time.Hour)))
			pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{42}), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
			errc := runAsync(ctx, p)
			synctest.Wait() // the worker waits out its backoff
			start := time.Now()
			cancel(cause)
			err := <-errc
			assert.Same(t, cause, err)
			assert.Zero(t, time.Since(start), "the wait ended at cancel")
			assert.Empty(t, r.gaps(), "no attempt after cancel")
			w := row(t, p.Report(), "work")
			assert.Equal(t, int64(1), w.Failed)
			assert.Equal(t, int64(1), w.Retried)
			checkReport(t, p.Report())
		})
	})
	t.Run("ExponentialBackoff waits within its bounds", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			const base, limit = 100 * time.Millisecond, 300 * time.Millisecond
			var errs []error
			for i := 1; i <= 6; i++ {
				errs = append(errs, pipeline.Transient(attemptErr(i)))
			}
			r := &retryRecorder{errs: errs}
			p := pipeline.New()
			st := pipeline.NewStage("work", 1, r.fn, pipeline.WithRetry(6, pipeline.ExponentialBackoff(base, limit)), discardDead[int]())
			_, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, []int{42}), st))
			require.NoError(t, err)
			gaps := r.gaps()
			require.Len(t, gaps, 5)
			for i, g := range gaps {
				d := min(base<<i, limit)
				assert.GreaterOrEqualf(t, g, d/2, "wait %d", i+1)
				assert.LessOrEqualf(t, g, d, "wait %d", i+1)
			}
		})
	})
}

// expBackoffBound is base·2^(attempt-1) capped at limit, without overflow.
func expBackoffBound(base, limit time.Duration, attempt int) time.Duration {
	if attempt-1 >= 63 || base > limit>>(attempt-1) {
		return limit
	}
	return base << (attempt - 1)
}

// TestExponentialBackoff checks that each wait is within [d/2, d] of d = base·2^(n-1)
// capped at the limit, for many draws.
func TestExponentialBackoff(t *testing.T) {
	t.Parallel()
	cases := []struct{ base, limit time.Duration }{
		{time.Millisecond, time.Millisecond},
		{time.Millisecond, time.Second},
		{100 * time.Millisecond, 30 * time.Second},
		{time.Second, time.Hour},
		{1, 1},
		{1, 3},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%v..%v", c.base, c.limit), func(t *testing.T) {
			t.Parallel()
			b := pipeline.ExponentialBackoff(c.base, c.limit)
			for attempt := 1; attempt <= 100; attempt++ {
				d := expBackoffBound(c.base, c.limit, attempt)
				for range 20 {
					got := b(attempt)
					if got < d/2 || got > d {
						t.Fatalf("attempt %d: wait %v not in [%v, %v]", attempt, got, d/2, d)
					}
				}
			}
		})
	}
	t.Run("ConstantBackoff", func(t *testing.T) {
		t.Parallel()
		b := pipeline.ConstantBackoff(time.Second)
		for attempt := 1; attempt < 10; attempt++ {
			assert.Equal(t, time.Second, b(attempt))
		}
	})
}

// TestExponentialBackoffHugeLimit checks the cap with a limit so large that
// base·2^(n-1) overflows a Duration before reaching it.
func TestExponentialBackoffHugeLimit(t *testing.T) {
	t.Parallel()
	for _, base := range []time.Duration{time.Millisecond, time.Second, 10 * time.Second} {
		b := pipeline.ExponentialBackoff(base, math.MaxInt64)
		for attempt := 1; attempt <= 100; attempt++ {
			d := expBackoffBound(base, math.MaxInt64, attempt)
			if got := b(attempt); got < d/2 || got > d {
				t.Errorf("ExponentialBackoff(%v, MaxInt64)(%d) = %v, not in [%v, %v]", base, attempt, got, d/2, d)
			}
		}
	}
}

// TestErrorClasses checks who decides what an error does to its item: markers (the
// outermost wins), then a timeout, then the stage's classifier (or the pipeline's),
// else fatal; and that setting an item aside needs a WithDeadLetter destination
// (without one, an item error is fatal too).
func TestErrorClasses(t *testing.T) {
	t.Parallel()
	item := func(error) pipeline.Class { return pipeline.ClassItem }
	fatal := func(error) pipeline.Class { return pipeline.ClassFatal }
	transient := func(error) pipeline.Class { return pipeline.ClassTransient }
	always := func(err error) func(context.Context) error { return func(context.Context) error { return err } }
	hang := func(wrap func(error) error) func(context.Context) error {
		return func(ctx context.Context) error {
			<-ctx.Done()
			return wrap(ctx.Err())
		}
	}
	noWrap := func(err error) error { return err }
	cases := []struct {
		name         string
		newOpts      []pipeline.PipelineOption
		stageOpts    []pipeline.StageOption
		noDeadLetter bool                            // no WithDeadLetter on the stage
		fail         func(ctx context.Context) error // the error of every attempt
		fatal        bool                            // the run fails with a *StageError wrapping errBoom
		attempts     int                             // attempts made
		class        pipeline.Class                  // the dead letter's class, when not fatal
		errType      string                          // the dead letter's ErrType, when set
	}{
		{name: "unmarked without policy is fatal", fail: always(errBoom), fatal: true, attempts: 1},
		{name: "wrapped unmarked without policy is fatal", fail: always(fmt.Errorf("fetch: %w", errBoom)), fatal: true, attempts: 1},
		{name: "Fatal", fail: always(pipeline.Fatal(errBoom)), fatal: true, attempts: 1},
		{name: "Permanent", fail: always(pipeline.Permanent(errBoom)), attempts: 1, class: pipeline.ClassItem},
		{name: "Permanent of a typed error", fail: always(pipeline.Permanent(fmt.Errorf("fetch: %w", &codeError{503}))), attempts: 1, class: pipeline.ClassItem, errType: "*pipeline_test.codeError"},
		{name: "Permanent without WithDeadLetter is fatal", noDeadLetter: true, fail: always(pipeline.Permanent(errBoom)), fatal: true, attempts: 1},
		{name: "Transient out of attempts without WithDeadLetter is fatal", noDeadLetter: true, stageOpts: []pipeline.StageOption{pipeline.WithRetry(2, nil)}, fail: always(pipeline.Transient(errBoom)), fatal: true, attempts: 2},
		{name: "classifier item without WithDeadLetter is fatal", noDeadLetter: true, stageOpts: []pipeline.StageOption{pipeline.WithClassifier(item)}, fail: always(errBoom), fatal: true, attempts: 1},
		{name: "timeout without WithDeadLetter is fatal", noDeadLetter: true, stageOpts: []pipeline.StageOption{pipeline.WithTimeout(time.Second)}, fail: hang(func(err error) error { return errors.Join(err, errBoom) }), fatal: true, attempts: 1},
		{name: "Transient without WithRetry is dead-lettered after 1 attempt", fail: always(pipeline.Transient(errBoom)), attempts: 1, class: pipeline.ClassTransient},
		{name: "Transient with WithRetry", stageOpts: []pipeline.StageOption{pipeline.WithRetry(3, nil)}, fail: always(pipeline.Transient(errBoom)), attempts: 3, class: pipeline.ClassTransient},
		{name: "Permanent is not retried", stageOpts: []pipeline.StageOption{pipeline.WithRetry(3, nil)}, fail: always(pipeline.Permanent(errBoom)), attempts: 1, class: pipeline.ClassItem},
		{name: "Fatal is not retried", stageOpts: []pipeline.StageOption{pipeline.WithRetry(3, nil)}, fail: always(pipeline.Fatal(errBoom)), fatal: true, attempts: 1},
		{name: "outermost wins: Permanent(Transient)", stageOpts: []pipeline.StageOption{pipeline.WithRetry(3, nil)}, fail: always(pipeline.Permanent(pipeline.Transient(errBoom))), attempts: 1, class: pipeline.ClassItem},
		{name: "outermost wins: Transient(Permanent)", stageOpts: []pipeline.StageOption{pipeline.WithRetry(3, nil)}, fail: always(pipeline.Transient(pipeline.Permanent(errBoom))), attempts: 3, class: pipeline.ClassTransient},
		{name: "outermost wins: Fatal(Permanent)", fail: always(pipeline.Fatal(pipeline.Permanent(errBoom))), fatal: true, attempts: 1},
		{name: "outermost wins: Permanent(Fatal)", fail: always(pipeline.Permanent(pipeline.Fatal(errBoom))), attempts: 1, class: pipeline.ClassItem},
		{name: "a marker under fmt.Errorf %w", fail: always(fmt.Errorf("fetch 7: %w", pipeline.Permanent(errBoom))), attempts: 1, class: pipeline.ClassItem},
		{name: "stage classifier", stageOpts: []pipeline.StageOption{pipeline.WithClassifier(item)}, fail: always(errBoom), attempts: 1, class: pipeline.ClassItem},
		{name: "stage classifier says transient", stageOpts: []pipeline.StageOption{pipeline.WithClassifier(transient), pipeline.WithRetry(2, nil)}, fail: always(errBoom), attempts: 2, class: pipeline.ClassTransient},
		{name: "stage classifier says fatal", stageOpts: []pipeline.StageOption{pipeline.WithClassifier(fatal)}, fail: always(errBoom), fatal: true, attempts: 1},
		{name: "pipeline classifier (New)", newOpts: []pipeline.PipelineOption{pipeline.WithClassifier(item)}, fail: always(errBoom), attempts: 1, class: pipeline.ClassItem},
		{name: "stage classifier overrides New's", newOpts: []pipeline.PipelineOption{pipeline.WithClassifier(item)}, stageOpts: []pipeline.StageOption{pipeline.WithClassifier(fatal)}, fail: always(errBoom), fatal: true, attempts: 1},
		{name: "marker beats classifier: Permanent", stageOpts: []pipeline.StageOption{pipeline.WithClassifier(fatal)}, fail: always(pipeline.Permanent(errBoom)), attempts: 1, class: pipeline.ClassItem},
		{name: "marker beats classifier: Fatal", stageOpts: []pipeline.StageOption{pipeline.WithClassifier(item)}, fail: always(pipeline.Fatal(errBoom)), fatal: true, attempts: 1},
		{name: "timeout is an item error by default", stageOpts: []pipeline.StageOption{pipeline.WithTimeout(time.Second)}, fail: hang(noWrap), attempts: 1, class: pipeline.ClassItem, errType: "timeout"},
		{name: "a classifier decides timeouts too: fatal", stageOpts: []pipeline.StageOption{pipeline.WithTimeout(time.Second), pipeline.WithClassifier(fatal)}, fail: hang(func(err error) error { return errors.Join(err, errBoom) }), fatal: true, attempts: 1},
		{name: "a classifier decides timeouts too: retried", stageOpts: []pipeline.StageOption{pipeline.WithTimeout(time.Second), pipeline.WithRetry(3, nil), pipeline.WithClassifier(transient)}, fail: hang(noWrap), attempts: 3, class: pipeline.ClassTransient, errType: "timeout"},
		{name: "timeout is not retried", stageOpts: []pipeline.StageOption{pipeline.WithTimeout(time.Second), pipeline.WithRetry(3, nil)}, fail: hang(noWrap), attempts: 1, class: pipeline.ClassItem, errType: "timeout"},
		{name: "timeout marked Transient is retried", stageOpts: []pipeline.StageOption{pipeline.WithTimeout(time.Second), pipeline.WithRetry(3, nil)}, fail: hang(pipeline.Transient), attempts: 3, class: pipeline.ClassTransient, errType: "timeout"},
		{name: "timeout marked Fatal is fatal", stageOpts: []pipeline.StageOption{pipeline.WithTimeout(time.Second)}, fail: hang(func(err error) error { return pipeline.Fatal(errors.Join(err, errBoom)) }), fatal: true, attempts: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var attempts int
				dead := pipeline.NewDeadLetterBuffer[int](1)
				p := pipeline.New(tc.newOpts...)
				opts := tc.stageOpts
				if !tc.noDeadLetter {
					opts = append([]pipeline.StageOption{pipeline.WithDeadLetter(dead.Add)}, opts...)
				}
				st := pipeline.NewStage("work", 1, func(ctx context.Context, _ int) (int, error) {
					attempts++
					return 0, tc.fail(ctx)
				}, opts...)
				pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{7}), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))

				err := p.Run(t.Context())

				assert.Equal(t, tc.attempts, attempts, "attempts")
				rep := p.Report()
				checkReport(t, rep)
				w := row(t, rep, "work")
				assert.Equal(t, int64(tc.attempts-1), w.Retried)
				if tc.fatal {
					require.Error(t, err)
					se, ok := errors.AsType[*pipeline.StageError](err)
					require.True(t, ok, "a *StageError: %v", err)
					assert.Equal(t, "work", se.Stage)
					require.ErrorIs(t, err, errBoom)
					assert.Equal(t, int64(1), w.Failed)
					assert.Empty(t, dead.Items())
					return
				}
				require.NoError(t, err)
				assert.Equal(t, int64(1), w.DeadLettered)
				require.Len(t, dead.Items(), 1)
				dl := dead.Items()[0]
				assert.Equal(t, 7, dl.Item)
				assert.Equal(t, tc.attempts, dl.Attempts)
				assert.Equal(t, tc.class, dl.Class)
				if tc.errType != "" {
					assert.Equal(t, tc.errType, dl.ErrType)
				}
			})
		})
	}
}

// TestUnmarkedErrorIsReturnedAsIs checks that an unmarked error without policy fails
// the run with a *StageError whose Err is the stage function's error itself.
func TestUnmarkedErrorIsReturnedAsIs(t *testing.T) {
	t.Parallel()
	orig := fmt.Errorf("parse %q: %w", "x", errBoom)
	p := pipeline.New()
	st := pipeline.NewStage("parse", 2, func(context.Context, int) (int, error) { return 0, orig })
	_, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(5)), st))
	se, ok := errors.AsType[*pipeline.StageError](err)
	require.True(t, ok)
	assert.Equal(t, "parse", se.Stage)
	assert.Same(t, orig, se.Err)
	require.ErrorIs(t, err, errBoom)
	assert.Equal(t, `pipeline: stage "parse": parse "x": boom`, err.Error())
}

// TestClassOf checks the markers directly.
func TestClassOf(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err    error
		class  pipeline.Class
		marked bool
	}{
		{errBoom, pipeline.ClassFatal, false},
		{pipeline.Transient(errBoom), pipeline.ClassTransient, true},
		{pipeline.Permanent(errBoom), pipeline.ClassItem, true},
		{pipeline.Fatal(errBoom), pipeline.ClassFatal, true},
		{pipeline.Transient(pipeline.Permanent(errBoom)), pipeline.ClassTransient, true},
		{fmt.Errorf("x: %w", pipeline.Permanent(pipeline.Transient(errBoom))), pipeline.ClassItem, true},
	}
	for _, c := range cases {
		class, marked := pipeline.ClassOf(c.err)
		assert.Equal(t, c.class, class, "%v", c.err)
		assert.Equal(t, c.marked, marked, "%v", c.err)
		require.ErrorIs(t, c.err, errBoom, "a marker keeps the error's chain")
		assert.Equal(t, "boom", c.err.Error()[len(c.err.Error())-4:], "a marker keeps the error's text")
	}
	assert.NoError(t, pipeline.Transient(nil))
	assert.NoError(t, pipeline.Permanent(nil))
	assert.NoError(t, pipeline.Fatal(nil))
	assert.Equal(t, "fatal", pipeline.ClassFatal.String())
	assert.Equal(t, "item", pipeline.ClassItem.String())
	assert.Equal(t, "transient", pipeline.ClassTransient.String())
}

// codeError is an error type of the tests' own, to check DeadLetter.ErrType.
type codeError struct{ code int }

func (e *codeError) Error() string { return fmt.Sprintf("status %d", e.code) }

// A WithTimeout attempt context that a goroutine first looks at after the attempt returned
// was reused for the worker's next attempt; its timer (armed with the OLD deadline) then
// canceled the next attempt, which started already "deadline exceeded".
func TestTimeoutAttemptCtxNotReusedAfterEscape(t *testing.T) {
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

// TestRetryBackoffPublishesCounts checks, in virtual time, that a worker waiting in a
// retry's backoff has added the counts of its run's earlier items first: a Snapshot
// taken during the wait shows them succeeded, not taken and unfinished (the worker
// used to add them only at the end of its run).
func TestRetryBackoffPublishesCounts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		items := make([]int, 10)
		for i := range items {
			items[i] = i
		}
		p := pipeline.New()
		failed := false // item 5's first attempt fails: one worker, so no race
		s := pipeline.Then(pipeline.FromSlice(p, items), pipeline.NewStage("work", 1, func(_ context.Context, v int) (int, error) {
			if v == 5 && !failed {
				failed = true
				return 0, pipeline.Transient(errors.New("once"))
			}
			return v, nil
		}, pipeline.WithRetry(2, pipeline.ConstantBackoff(time.Hour))))
		pipeline.To(s, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		errc := runAsync(t.Context(), p)
		synctest.Wait() // the worker sleeps in item 5's backoff
		work := row(t, p.Snapshot(), "work")
		assert.Equal(t, int64(5), work.Succeeded, "items 0 to 4, before the backoff")
		assert.Equal(t, int64(1), work.Retried)
		require.NoError(t, <-errc)
		assert.Equal(t, int64(10), row(t, p.Report(), "work").Succeeded)
	})
}

// TestRetryNotBegunAfterCancel cancels the run as an item's attempt fails (from an
// observer of its EventRetry), with no backoff before the retry: the retry is not
// made (the worker went on to it at once, its context canceled). The same check
// covers a backoff whose timer and the run's end are ready together. The item counts
// as failed, and its one attempt was the only call.
func TestRetryNotBegunAfterCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var calls atomic.Int64
		st := pipeline.NewStage("call", 1, func(context.Context, int) (int, error) {
			calls.Add(1)
			return 0, pipeline.Transient(errors.New("down"))
		}, pipeline.WithRetry(5, nil))
		p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
			if e.Kind == pipeline.EventRetry {
				cancel()
			}
		}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(1)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		require.ErrorIs(t, p.Run(ctx), context.Canceled)
		assert.Equal(t, int64(1), calls.Load(), "a retry begun after the run was canceled")
		checkReport(t, p.Report())
	})
}

// TestTimeoutReportsStuckAttempt checks, in virtual time, that an attempt whose function
// ignores its context is reported once, by an EventStuck and a log line, within twice
// the timeout of its start, also after the run is canceled; that Snapshot shows its age;
// and that attempts that return in time, or a little past the timeout, are not reported.
func TestTimeoutReportsStuckAttempt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const d = 100 * time.Millisecond
		start := time.Now()
		var mu sync.Mutex
		var buf bytes.Buffer
		type seen struct {
			e  pipeline.Event
			at time.Duration
		}
		var events []seen
		began := map[int]time.Duration{}
		release := make(chan struct{})
		logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
		p := pipeline.New(pipeline.WithLogger(logger), pipeline.WithObserver(func(e pipeline.Event) {
			if e.Kind == pipeline.EventStuck {
				mu.Lock()
				events = append(events, seen{e, time.Since(start)})
				mu.Unlock()
			}
		}))
		st := pipeline.NewStage("work", 2, func(_ context.Context, v int) (int, error) {
			mu.Lock()
			began[v] = time.Since(start)
			mu.Unlock()
			switch v {
			case 0, 4: // ignore the context
				<-release
			case 1:
				time.Sleep(d - 10*time.Millisecond) // in time
			case 2:
				time.Sleep(d + 10*time.Millisecond) // past the timeout, not by the margin
			}
			return v, nil
		}, pipeline.WithTimeout(d))
		ctx, cancel := context.WithCancel(t.Context())
		out := pipeline.Then(pipeline.FromSlice(p, ints(6)), st)
		errc := make(chan error, 1)
		go func() {
			_, err := pipeline.Collect(ctx, out)
			errc <- err
		}()

		time.Sleep(2 * d)
		synctest.Wait()
		mu.Lock()
		require.Len(t, events, 1, "item 0's attempt, 2×d after it began")
		e := events[0]
		assert.Equal(t, "work", e.e.Stage)
		assert.Equal(t, 4*d/2, began[4], "items 1 and 2 took 200ms on the other worker")
		assert.LessOrEqual(t, e.at-began[0], 2*d, "reported within twice the timeout")
		assert.Greater(t, e.e.Age, d, "reported once past its timeout")
		assert.LessOrEqual(t, e.e.Age, e.at-began[0], "never older than it is")
		assert.Contains(t, buf.String(), `level=WARN msg="pipeline: attempt stuck: the function does not return after its context is done" stage=work age=`+e.e.Age.String())
		mu.Unlock()
		snap, ok := p.Snapshot().Stage("work")
		require.True(t, ok)
		assert.Greater(t, snap.OldestAttempt, d)
		assert.LessOrEqual(t, snap.OldestAttempt, 2*d)

		cancel() // the function ignores this too: the run goes on waiting for it
		time.Sleep(time.Second)
		synctest.Wait()
		select {
		case err := <-errc:
			t.Fatalf("the run ended with %v while an attempt was stuck", err)
		default:
		}
		snap, _ = p.Snapshot().Stage("work")
		assert.Greater(t, snap.OldestAttempt, time.Second, "item 0's attempt, 1.2 s old")
		assert.LessOrEqual(t, snap.OldestAttempt, time.Since(start))
		assert.Contains(t, p.Snapshot().Line(), " stuck="+snap.OldestAttempt.Round(time.Millisecond).String())
		mu.Lock()
		require.Len(t, events, 2, "one event per stuck attempt: items 0 and 4")
		assert.LessOrEqual(t, events[1].at-began[4], 2*d)
		assert.Equal(t, 2, strings.Count(buf.String(), "attempt stuck"))
		mu.Unlock()

		close(release)
		require.ErrorIs(t, <-errc, context.Canceled)
		rep := p.Report()
		stage, _ := rep.Stage("work")
		assert.Zero(t, stage.OldestAttempt, "no attempt runs after the run")
		checkReport(t, rep)
	})
}

// TestTimeoutSlowAttemptsInOneRunAreNotStuck checks that a worker whose run of items
// turns slow (items that each take most of the timeout, taken together in a run sized
// while they were fast) is not reported stuck: each attempt returns in time.
func TestTimeoutSlowAttemptsInOneRunAreNotStuck(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const d = 100 * time.Millisecond
		var stuck atomic.Int64
		var oldest time.Duration
		p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
			if e.Kind == pipeline.EventStuck {
				stuck.Add(1)
			}
		}))
		st := pipeline.NewStage("work", 1, func(_ context.Context, v int) (int, error) {
			if v >= 1000 {
				time.Sleep(d - time.Millisecond)
			}
			return v, nil
		}, pipeline.WithTimeout(d))
		sink := pipeline.NewSink("sink", 1, func(_ context.Context, v int) error {
			if v%1000 == 999 {
				s, _ := p.Snapshot().Stage("work")
				oldest = max(oldest, s.OldestAttempt)
			}
			return nil
		})
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(2000)), st), sink)
		require.NoError(t, p.Run(t.Context()))
		assert.Zero(t, stuck.Load())
		assert.Less(t, oldest, d)
		checkReport(t, p.Report())
	})
}
