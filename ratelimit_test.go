package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/gopipeline/pipeline"
)

// startTimes records when each call of a stage function began, in virtual time since
// the recorder was made.
type startTimes struct {
	mu    sync.Mutex
	start time.Time
	at    []time.Duration
}

func newStartTimes() *startTimes { return &startTimes{start: time.Now()} }

func (s *startTimes) add() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = append(s.at, time.Since(s.start))
}

// countBefore returns the calls that began before d.
func (s *startTimes) countBefore(d time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, at := range s.at {
		if at < d {
			n++
		}
	}
	return n
}

// assertAbout checks a virtual duration to the microsecond: rate.Limiter computes its
// delays in floating point, which can leave a nanosecond out.
func assertAbout(t *testing.T, want, got time.Duration, msg ...any) {
	t.Helper()
	assert.InDelta(t, float64(want), float64(got), float64(time.Microsecond), msg...)
}

// TestRateLimit checks the done-when figure: a stage limited to 100 attempts/s with a
// burst of 10 processes 1,000 items in 9.9–10.1 s of virtual time (exactly 9.9 s: the
// burst's 10 at once, then one every 10 ms), whatever its workers, and that the burst
// is exactly 10.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				starts := newStartTimes()
				st := pipeline.NewStage("call", workers, func(_ context.Context, v int) (int, error) {
					starts.add()
					return v, nil
				}, pipeline.WithRateLimit(rate.NewLimiter(100, 10)))
				p := pipeline.New()
				pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(1000)), st), nopSink())

				t0 := time.Now()
				require.NoError(t, p.Run(t.Context()))
				elapsed := time.Since(t0)

				t.Logf("1,000 items at 100/s, burst 10, %d workers: %v", workers, elapsed)
				assert.GreaterOrEqual(t, elapsed, 9900*time.Millisecond)
				assert.LessOrEqual(t, elapsed, 10100*time.Millisecond)
				assert.Equal(t, 10, starts.countBefore(time.Nanosecond), "the burst: 10 attempts at once")
				assert.Equal(t, 10+100, starts.countBefore(time.Second+time.Nanosecond), "then 100 per second")
				call := row(t, p.Report(), "call")
				assert.Equal(t, int64(1000), call.Succeeded)
				if workers == 1 {
					assertAbout(t, 9900*time.Millisecond, call.Throttled, "the one worker waited for every token")
				}
				assert.GreaterOrEqual(t, call.Throttled, 9899*time.Millisecond)
			})
		})
	}
}

// TestRateLimitBottleneck checks that Bottleneck says a stage that spends its time
// waiting for its rate limit runs at its quota.
func TestRateLimitBottleneck(t *testing.T) {
	t.Parallel()
	rep := pipeline.Report{Elapsed: 10 * time.Second, Stages: []pipeline.StageReport{
		{Name: "src", Kind: pipeline.KindSource, Next: []string{"call"}},
		{
			Name: "call", Kind: pipeline.KindStage, Workers: 4, Limit: 4, QueueCap: 100, PeakQueue: 100, Throttled: 36 * time.Second,
			Latency: pipeline.Latency{Count: 1000, P50: time.Millisecond, P99: time.Millisecond},
		},
	}}
	b := rep.Bottleneck(0)
	assert.Equal(t, "call", b.Stage)
	require.Len(t, b.Warnings, 1)
	assert.Contains(t, b.Warnings[0], `stage "call": its workers spent 90% of their time waiting for its rate limit`)
}

// TestRateLimitShared checks that one limiter given to two stages of two pipelines
// paces them together: 200 attempts at 50/s (burst 1) take 3.98 s in all.
func TestRateLimitShared(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		lim := rate.NewLimiter(50, 1)
		run := func() error {
			p := pipeline.New()
			st := pipeline.NewStage("call", 4, func(_ context.Context, v int) (int, error) { return v, nil }, pipeline.WithRateLimit(lim))
			pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(100)), st), nopSink())
			return p.Run(t.Context())
		}
		t0 := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { errs[i] = run() })
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		assertAbout(t, 199*20*time.Millisecond, time.Since(t0), "199 waits of 20 ms after the first token")
	})
}

// TestRateLimitRetries checks that retries take tokens too, and that the wait for a
// token is not part of the attempt's timeout: a limiter of 10/s and a timeout of 5 ms
// time out nothing.
func TestRateLimitRetries(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var (
			calls atomic.Int64
			mu    sync.Mutex
			tried = map[int]bool{}
		)
		st := pipeline.NewStage("call", 2, func(ctx context.Context, v int) (int, error) {
			calls.Add(1)
			mu.Lock()
			first := !tried[v]
			tried[v] = true
			mu.Unlock()
			if first {
				return 0, pipeline.Transient(errBoom)
			}
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(time.Millisecond):
				return v, nil
			}
		}, pipeline.WithRateLimit(rate.NewLimiter(10, 1)), pipeline.WithTimeout(5*time.Millisecond),
			pipeline.WithRetry(3, nil), discardDead[int]())
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(10)), st), nopSink())

		t0 := time.Now()
		require.NoError(t, p.Run(t.Context()))

		rep := row(t, p.Report(), "call")
		assert.Equal(t, int64(10), rep.Succeeded)
		assert.Equal(t, int64(0), rep.DeadLettered, "no attempt timed out while it waited for a token")
		assert.Equal(t, int64(20), calls.Load())
		// 20 attempts at 10/s, the first at once; the last one takes 1 ms.
		assertAbout(t, 19*100*time.Millisecond+time.Millisecond, time.Since(t0))
	})
}

// TestRateLimitCancel checks that a wait for a token ends when the run is canceled:
// Run returns the cause at once and the item waiting counts as failed.
func TestRateLimitCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(t.Context())
		stop := errors.New("stop")
		st := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) { return v, nil },
			pipeline.WithRateLimit(rate.NewLimiter(rate.Every(time.Hour), 1)))
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(3)), st), nopSink())
		time.AfterFunc(time.Second, func() { cancel(stop) })

		t0 := time.Now()
		err := p.Run(ctx)

		require.ErrorIs(t, err, stop)
		assert.Equal(t, time.Second, time.Since(t0))
		rep := p.Report()
		checkReport(t, rep)
		assert.Equal(t, int64(1), row(t, rep, "call").Succeeded)
		assert.Equal(t, int64(1), row(t, rep, "call").Failed, "the item that waited for its token")
	})
}

// TestRateLimitDeadline checks that a run whose context has a deadline waits for a
// token until the deadline, and then returns the deadline's error (a rate.Limiter
// alone would refuse at once a wait that ends past its context's deadline), in a stage
// and in a sink, whose context adds a value to the run's (a sink's wait had the
// deadline, and the run failed at once with the limiter's error).
func TestRateLimitDeadline(t *testing.T) {
	t.Parallel()
	limit := func() pipeline.StageOption { return pipeline.WithRateLimit(rate.NewLimiter(rate.Every(time.Hour), 1)) }
	for _, tc := range []struct {
		name string
		wire func(p *pipeline.Pipeline)
	}{
		{"stage", func(p *pipeline.Pipeline) {
			st := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) { return v, nil }, limit())
			pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(3)), st), nopSink())
		}},
		{"sink", func(p *pipeline.Pipeline) {
			pipeline.To(pipeline.FromSlice(p, ints(3)), pipeline.NewSink("call", 1, func(context.Context, int) error { return nil }, limit()))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				p := pipeline.New()
				tc.wire(p)
				t0 := time.Now()
				require.ErrorIs(t, p.Run(ctx), context.DeadlineExceeded)
				assert.Equal(t, 5*time.Second, time.Since(t0))
				checkReport(t, p.Report())
			})
		})
	}
}

// failingLimiter is a Limiter that cannot give a token.
type failingLimiter struct{}

func (failingLimiter) Wait(context.Context) error { return errors.New("quota service unreachable") }

// TestRateLimitError checks that a limiter's own error fails the run with a clear
// message.
func TestRateLimitError(t *testing.T) {
	t.Parallel()
	st := pipeline.NewStage("call", 2, func(_ context.Context, v int) (int, error) { return v, nil },
		pipeline.WithRateLimit(failingLimiter{}))
	p := pipeline.New()
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(3)), st), nopSink())

	err := p.Run(t.Context())

	require.Error(t, err)
	assert.Contains(t, err.Error(), `stage "call"`)
	assert.Contains(t, err.Error(), "rate limiter: quota service unreachable")
	checkReport(t, p.Report())
}

// TestRateLimitPerKey checks per-key limits: two keys at 10/s with a burst of 2 each
// take the same time as one key alone (they do not wait for each other), exactly
// 2 + 10 per second per key.
func TestRateLimitPerKey(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		starts := map[string]*startTimes{"a": newStartTimes(), "b": newStartTimes()}
		type req struct {
			tenant string
			n      int
		}
		var items []req
		for i := range 40 {
			items = append(items, req{[]string{"a", "b"}[i%2], i})
		}
		st := pipeline.NewStage("call", 4, func(_ context.Context, r req) (int, error) {
			mu.Lock()
			s := starts[r.tenant]
			mu.Unlock()
			s.add()
			return r.n, nil
		}, pipeline.WithRateLimitPerKey(func(r req) string { return r.tenant }, 10, 2))
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, items), st), nopSink())

		t0 := time.Now()
		require.NoError(t, p.Run(t.Context()))

		assertAbout(t, 18*100*time.Millisecond, time.Since(t0), "20 per key: 2 at once, 18 at 10/s")
		for _, k := range []string{"a", "b"} {
			assert.Equal(t, 2, starts[k].countBefore(time.Nanosecond), "key %s: the burst", k)
			assert.Equal(t, 12, starts[k].countBefore(time.Second+time.Nanosecond), "key %s: one second", k)
		}
	})
}

// TestRetryAfter checks that a retry waits the longer of the backoff and the delay the
// error asks for, through RetryAfter and through any error with a RetryAfter method.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		err     error
		backoff pipeline.Backoff
		want    time.Duration
	}{
		{"marker, longer than the backoff", pipeline.RetryAfter(errBoom, 2*time.Second), pipeline.ConstantBackoff(10 * time.Millisecond), 2 * time.Second},
		{"marker, shorter than the backoff", pipeline.RetryAfter(errBoom, time.Millisecond), pipeline.ConstantBackoff(50 * time.Millisecond), 50 * time.Millisecond},
		{"marker, no backoff", pipeline.RetryAfter(errBoom, 3*time.Second), nil, 3 * time.Second},
		{"a type of the caller's, wrapped", pipeline.Transient(fmt.Errorf("call: %w", &httpError{429, 5 * time.Second})), nil, 5 * time.Second},
		{"in a join", pipeline.Transient(errors.Join(errBoom, &httpError{503, 4 * time.Second})), pipeline.ConstantBackoff(time.Second), 4 * time.Second},
		{"negative", pipeline.RetryAfter(errBoom, -time.Second), nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var at []time.Time
				st := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
					at = append(at, time.Now())
					if len(at) == 1 {
						return 0, c.err
					}
					return v, nil
				}, pipeline.WithRetry(2, c.backoff))
				p := pipeline.New()
				pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{1}), st), nopSink())
				require.NoError(t, p.Run(t.Context()))
				require.Len(t, at, 2)
				assert.Equal(t, c.want, at[1].Sub(at[0]))
			})
		})
	}
	require.NoError(t, pipeline.RetryAfter(nil, time.Second))
	c, ok := pipeline.ClassOf(pipeline.RetryAfter(errBoom, time.Second))
	assert.True(t, ok)
	assert.Equal(t, pipeline.ClassTransient, c)
	assert.ErrorIs(t, pipeline.RetryAfter(errBoom, time.Second), errBoom)
}

// httpError is an error type of a caller's HTTP client, with the server's Retry-After.
type httpError struct {
	status int
	after  time.Duration
}

func (e *httpError) Error() string             { return fmt.Sprintf("HTTP %d", e.status) }
func (e *httpError) RetryAfter() time.Duration { return e.after }

// TestRetryAfterNamesWrappedType: an error marked by RetryAfter is counted, in the
// report's errors and causes and in its dead letter, under the type it wraps (it was
// counted as *pipeline.retryAfterError, the marker's own type).
func TestRetryAfterNamesWrappedType(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		dead := pipeline.NewDeadLetterBuffer[int](1)
		st := pipeline.NewStage("call", 1, func(context.Context, int) (int, error) {
			return 0, pipeline.RetryAfter(&httpError{429, time.Second}, time.Second)
		}, pipeline.WithRetry(2, nil), pipeline.WithDeadLetter(dead.Add))
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{1}), st), nopSink())
		require.NoError(t, p.Run(t.Context()))
		s, ok := p.Report().Stage("call")
		require.True(t, ok)
		assert.Equal(t, []pipeline.ErrorCount{{Type: "*pipeline_test.httpError", Retried: 1, DeadLettered: 1}}, s.Errors)
		assert.Equal(t, []pipeline.Cause{{Type: "*pipeline_test.httpError", Message: "HTTP #", Count: 1}}, s.Causes)
		require.Len(t, dead.Items(), 1)
		assert.Equal(t, "*pipeline_test.httpError", dead.Items()[0].ErrType)
	})
}

// TestRetryAfterCancel checks that a long Retry-After wait ends when the run stops.
func TestRetryAfterCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		st := pipeline.NewStage("call", 1, func(context.Context, int) (int, error) {
			return 0, pipeline.RetryAfter(errBoom, time.Hour)
		}, pipeline.WithRetry(2, nil), pipeline.WithRetryAfterCap(2*time.Hour))
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{1}), st), nopSink())
		t0 := time.Now()
		require.ErrorIs(t, p.Run(ctx), context.DeadlineExceeded)
		assert.Equal(t, time.Second, time.Since(t0))
	})
}

// TestParseRetryAfter checks the two forms of the header and the values that are
// neither.
func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2015, 10, 21, 7, 28, 0, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"120", 2 * time.Minute, true},
		{" 0 ", 0, true},
		{"Wed, 21 Oct 2015 07:28:30 GMT", 30 * time.Second, true},
		{"Wednesday, 21-Oct-15 07:29:00 GMT", time.Minute, true},
		{"Wed Oct 21 07:28:10 2015", 10 * time.Second, true},
		{"Wed, 21 Oct 2015 07:00:00 GMT", 0, true}, // in the past
		{"99999999999999999", 100 * 365 * 24 * time.Hour, true},
		{"", 0, false},
		{"-5", 0, false},
		{"soon", 0, false},
		{"1.5", 0, false},
	}
	for _, c := range cases {
		d, ok := pipeline.ParseRetryAfter(c.in, now)
		assert.Equal(t, c.ok, ok, "%q", c.in)
		assert.Equal(t, c.want, d, "%q", c.in)
	}
}

// TestRateLimitPerKeyHotKey checks WithMaxTokenWait against a hot key: 90 % of the
// items are key 0, 10 % key 1, offered at 10/s, with a quota of 2/s per key and 8
// workers. Without the bound, key 0's backlog paces the whole stage and key 1's items
// finish long after the source's 100 s; with a bound of 1 s, every key-1 item is
// delivered in time, key 0 gets its quota and the rest of it is shed to the dead
// letters with their class, and the accounting is exact.
func TestRateLimitPerKeyHotKey(t *testing.T) {
	t.Parallel()
	for _, bounded := range []bool{false, true} {
		t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const n = 1000
				start := time.Now()
				var mu sync.Mutex
				done := map[int]int{}
				var lastCold time.Duration
				dead := pipeline.NewDeadLetterBuffer[int](n)
				opts := []pipeline.StageOption{
					pipeline.WithRateLimitPerKey(func(v int) int { return min(v%10/9, 1) }, 2, 1),
					pipeline.WithDeadLetter(dead.Add),
				}
				if bounded {
					opts = append(opts, pipeline.WithMaxTokenWait(time.Second))
				}
				st := pipeline.NewStage("call", 8, func(_ context.Context, v int) (int, error) {
					mu.Lock()
					defer mu.Unlock()
					key := min(v%10/9, 1)
					done[key]++
					if key == 1 {
						lastCold = time.Since(start)
					}
					return v, nil
				}, opts...)
				p := pipeline.New()
				src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
					for i := range n {
						if err := emit(i); err != nil {
							return err
						}
						time.Sleep(100 * time.Millisecond)
					}
					return nil
				})
				pipeline.To(pipeline.Then(src, st), nopSink())
				require.NoError(t, p.Run(t.Context()))
				rep := p.Report()
				checkReport(t, rep)
				call := row(t, rep, "call")
				t.Logf("bounded=%v: %v; key 0: %d delivered, key 1: %d delivered, the last at %v; %d shed",
					bounded, rep.Elapsed, done[0], done[1], lastCold, len(dead.Items()))
				assert.Equal(t, n/10, done[1], "every key-1 item delivered")
				if !bounded {
					assert.Empty(t, dead.Items())
					assert.Greater(t, lastCold, 400*time.Second, "key 1 waits behind key 0's backlog")
					return
				}
				assert.LessOrEqual(t, lastCold, 101*time.Second, "key 1 keeps up with the source")
				assert.LessOrEqual(t, rep.Elapsed, 101*time.Second)
				assert.InDelta(t, 201, done[0], 4, "key 0 gets its quota: 2/s over 100 s, and its burst")
				assert.Equal(t, int64(n-done[0]-done[1]), call.DeadLettered)
				require.Len(t, dead.Items(), n-done[0]-done[1])
				for _, dl := range dead.Items() {
					require.Equal(t, 0, min(dl.Item%10/9, 1), "only the hot key is shed")
					require.Equal(t, "*pipeline.ThrottledError", dl.ErrType)
					require.Equal(t, pipeline.ClassItem, dl.Class)
					require.Zero(t, dl.Attempts)
				}
				require.Len(t, rep.Causes(), 1)
				assert.Equal(t, "*pipeline.ThrottledError", rep.Causes()[0].Type)
				assert.Equal(t, int64(n), call.Succeeded+call.DeadLettered)
			})
		})
	}
}

// TestMaxTokenWait checks the bound with a shared rate.Limiter and with a Limiter of
// one's own, and that a stage without a dead-letter destination fails with it.
func TestMaxTokenWait(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		lim       func() pipeline.Limiter
		succeeded int
	}{
		{"rate.Limiter", func() pipeline.Limiter { return rate.NewLimiter(1, 1) }, 1}, // the burst's token; the next come 1 s apart
		{"a Limiter of one's own", func() pipeline.Limiter { return slowLimiter{time.Second} }, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				dead := pipeline.NewDeadLetterBuffer[int](10)
				st := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) { return v, nil },
					pipeline.WithRateLimit(c.lim()), pipeline.WithMaxTokenWait(500*time.Millisecond), pipeline.WithDeadLetter(dead.Add))
				p := pipeline.New()
				pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(3)), st), nopSink())
				require.NoError(t, p.Run(t.Context()))
				rep := p.Report()
				checkReport(t, rep)
				assert.Equal(t, int64(c.succeeded), row(t, rep, "call").Succeeded)
				require.Len(t, dead.Items(), 3-c.succeeded)
				assert.Equal(t, "*pipeline.ThrottledError", dead.Items()[0].ErrType)
			})
		})
	}
	synctest.Test(t, func(t *testing.T) {
		st := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) { return v, nil },
			pipeline.WithRateLimit(rate.NewLimiter(1, 1)), pipeline.WithMaxTokenWait(time.Millisecond))
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(2)), st), nopSink())
		err := p.Run(t.Context())
		require.ErrorIs(t, err, pipeline.ErrThrottled)
		te, ok := errors.AsType[*pipeline.ThrottledError](err)
		require.True(t, ok)
		assert.Equal(t, pipeline.ThrottledError{Stage: "call", MaxWait: time.Millisecond}, *te)
		checkReport(t, p.Report())
	})
	assert.PanicsWithValue(t, "pipeline: WithMaxTokenWait(0s): the bound must be positive", func() { pipeline.WithMaxTokenWait(0) })
	msg := assertPanicsPipeline(t, func() {
		pipeline.NewStage("s", 1, func(_ context.Context, v int) (int, error) { return v, nil }, pipeline.WithMaxTokenWait(time.Second))
	})
	assert.Contains(t, msg, "WithMaxTokenWait without WithRateLimit or WithRateLimitPerKey")
}

// slowLimiter is a Limiter of one's own: each token takes d.
type slowLimiter struct{ d time.Duration }

func (l slowLimiter) Wait(ctx context.Context) error {
	select {
	case <-time.After(l.d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
