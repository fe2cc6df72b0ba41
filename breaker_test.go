package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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

var errDown = errors.New("connection refused")

// flakyService is a simulated service that takes 10 ms per call and fails every call
// that starts in [downFrom, downTo) since it was made, as a service that is down does.
type flakyService struct {
	start            time.Time
	downFrom, downTo time.Duration
	calls, failed    atomic.Int64
	maxActive        atomic.Int64 // most calls in flight at once while down
	active           atomic.Int64
}

func newFlakyService(from, to time.Duration) *flakyService {
	return &flakyService{start: time.Now(), downFrom: from, downTo: to}
}

func (s *flakyService) call(ctx context.Context, v int) (int, error) {
	s.calls.Add(1)
	at := time.Since(s.start)
	down := at >= s.downFrom && at < s.downTo
	if down {
		n := s.active.Add(1)
		defer s.active.Add(-1)
		for m := s.maxActive.Load(); n > m && !s.maxActive.CompareAndSwap(m, n); m = s.maxActive.Load() {
		}
	}
	select {
	case <-time.After(10 * time.Millisecond):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if down {
		s.failed.Add(1)
		return 0, pipeline.Transient(errDown)
	}
	return v, nil
}

// eventLog records a run's events.
type eventLog struct {
	mu     sync.Mutex
	start  time.Time
	events []pipeline.Event
	at     []time.Duration
}

func (l *eventLog) observe(e pipeline.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
	l.at = append(l.at, time.Since(l.start))
}

// kinds returns the kinds of the events recorded, of the given kinds only.
func (l *eventLog) kinds(of ...pipeline.EventKind) []pipeline.EventKind {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []pipeline.EventKind
	for _, e := range l.events {
		for _, k := range of {
			if e.Kind == k {
				out = append(out, e.Kind)
			}
		}
	}
	return out
}

var breakerKinds = []pipeline.EventKind{pipeline.EventBreakerOpen, pipeline.EventBreakerHalfOpen, pipeline.EventBreakerClosed}

// TestBreakerOutage is the done-when check: 10,000 items through a service that is
// down for 30 s of virtual time in the middle of them, with a breaker and retries. No
// item is dead-lettered, every item is processed after the outage, the report shows
// the time spent open (30 s and at most one OpenFor more), and the error budget does
// not trip: held items are not failures.
func TestBreakerOutage(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 10000
		svc := newFlakyService(3*time.Second, 33*time.Second) // 16 workers, 10 ms: 1,600/s, so item ~4,800 to ~33 s
		log := &eventLog{start: time.Now()}
		dead := pipeline.NewDeadLetterBuffer[int](n)
		var delivered atomic.Int64
		p := pipeline.New(pipeline.WithObserver(log.observe),
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.01, MinSample: 100}))
		st := pipeline.NewStage("call", 16, svc.call,
			pipeline.WithRetry(3, pipeline.ConstantBackoff(50*time.Millisecond)),
			pipeline.WithDeadLetter(dead.Add),
			pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 5, OpenFor: time.Second, MaxOpen: time.Minute}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error {
			delivered.Add(1)
			return nil
		}))

		midRun := snapshotAfter(p, 20*time.Second)
		require.NoError(t, p.Run(t.Context()))
		mid := midRun()

		rep := p.Report()
		checkReport(t, rep)
		call := row(t, rep, "call")
		require.NotNil(t, call.Breaker)
		b := call.Breaker
		t.Logf("outage of 30 s in %d items: %v of virtual time, %d dead-lettered, %d delivered; breaker open %v, opened %d times, %d attempts held, %d calls failed",
			n, rep.Elapsed, call.DeadLettered, delivered.Load(), b.TimeOpen, b.Opened, b.Held, svc.failed.Load())
		assert.Zero(t, call.DeadLettered, "no item dead-lettered because of the outage")
		assert.Empty(t, dead.Items())
		assert.Equal(t, int64(n), call.Succeeded)
		assert.Equal(t, int64(n), delivered.Load(), "every item processed after the outage")
		assert.Zero(t, call.Failed)
		assert.Equal(t, pipeline.BreakerClosed, b.State)
		assert.GreaterOrEqual(t, b.TimeOpen, 30*time.Second-10*time.Millisecond)
		assert.LessOrEqual(t, b.TimeOpen, 31*time.Second+20*time.Millisecond)
		assert.InDelta(t, 29, b.Opened, 2, "opened once, then after each failed probe (one a second)")
		assert.Positive(t, b.Held)
		assert.LessOrEqual(t, svc.failed.Load(), 16+b.Opened, "while open, only probes reach the service")
		assert.Less(t, rep.Elapsed, 33*time.Second+7*time.Second)

		// The transitions: open, then (half-open, open) per failed probe, then half-open, closed.
		kinds := log.kinds(breakerKinds...)
		require.Len(t, kinds, int(2*b.Opened+1))
		assert.Equal(t, pipeline.EventBreakerOpen, kinds[0])
		assert.Equal(t, []pipeline.EventKind{pipeline.EventBreakerHalfOpen, pipeline.EventBreakerClosed}, kinds[len(kinds)-2:])
		require.Len(t, b.Transitions, 32, "the latest 32")
		assert.Equal(t, pipeline.BreakerClosed, b.Transitions[31].To)
		assert.Zero(t, log.kinds(pipeline.EventBudget, pipeline.EventDeadLetter))

		// The Snapshot in the middle of the outage shows the breaker open and its time.
		require.True(t, mid.Running)
		ms := row(t, mid, "call")
		require.NotNil(t, ms.Breaker)
		assert.NotEqual(t, pipeline.BreakerClosed, ms.Breaker.State)
		assert.InDelta(t, float64(17*time.Second), float64(ms.Breaker.TimeOpen), float64(50*time.Millisecond))
	})
}

// TestBreakerOutageShapes runs a shorter outage through every kind of stage (plain,
// ordered, keyed; 1 and 8 workers): no item is dead-lettered or failed, all arrive, and
// an ordered stage keeps the input order, a keyed one the order per key.
func TestBreakerOutageShapes(t *testing.T) {
	t.Parallel()
	for _, shape := range []string{"plain", "ordered", "keyed"} {
		for _, workers := range []int{1, 8} {
			t.Run(fmt.Sprintf("%s/workers=%d", shape, workers), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					const n = 2000
					svc := newFlakyService(time.Second, 4*time.Second)
					// With one worker, the first item of the outage makes all of its attempts
					// before the breaker can open: it needs as many as Failures.
					opts := []pipeline.StageOption{
						pipeline.WithRetry(3, pipeline.ConstantBackoff(20*time.Millisecond)), discardDead[int](),
						pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 3, OpenFor: 500 * time.Millisecond}),
					}
					switch shape {
					case "ordered":
						opts = append(opts, pipeline.WithOrdered(0))
					case "keyed":
						opts = append(opts, pipeline.WithKey(func(v int) int { return v % 5 }))
					}
					p := pipeline.New()
					out, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("call", workers, svc.call, opts...)))
					require.NoError(t, err)
					rep := p.Report()
					checkReport(t, rep)
					call := row(t, rep, "call")
					assert.Zero(t, call.DeadLettered)
					assert.Zero(t, call.Failed)
					require.Len(t, out, n)
					assert.GreaterOrEqual(t, call.Breaker.TimeOpen, 3*time.Second-20*time.Millisecond)
					switch shape {
					case "ordered":
						assert.True(t, slices.IsSorted(out))
					case "keyed":
						last := map[int]int{}
						for _, v := range out {
							if prev, ok := last[v%5]; ok {
								assert.Greater(t, v, prev, "key %d out of order", v%5)
							}
							last[v%5] = v
						}
					default:
						slices.Sort(out)
						assert.Equal(t, ints(n), out)
					}
				})
			})
		}
	}
}

// TestBreakerWithoutIt is the same outage without a breaker: the items of the outage
// burn their retries and are dead-lettered, which is what the breaker prevents.
func TestBreakerWithoutIt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		svc := newFlakyService(time.Second, 4*time.Second)
		p := pipeline.New()
		st := pipeline.NewStage("call", 16, svc.call,
			pipeline.WithRetry(3, pipeline.ConstantBackoff(50*time.Millisecond)), discardDead[int]())
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(5000)), st), nopSink())
		require.NoError(t, p.Run(t.Context()))
		call := row(t, p.Report(), "call")
		t.Logf("without a breaker, a 3 s outage dead-letters %d items", call.DeadLettered)
		assert.Greater(t, call.DeadLettered, int64(300), "16 workers, 130 ms per item of the outage")
		assert.Nil(t, call.Breaker)
	})
}

// TestBreakerTransitions checks the state machine step by step: closed → open after
// Failures in a row; no attempt while open; half-open after OpenFor; HalfOpenProbes
// successes one at a time close it; and a failed probe opens it again.
func TestBreakerTransitions(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var (
			mu      sync.Mutex
			healthy = true
			calls   []time.Duration
			start   = time.Now()
		)
		setHealthy := func(h bool) { mu.Lock(); healthy = h; mu.Unlock() }
		log := &eventLog{start: start}
		p := pipeline.New(pipeline.WithObserver(log.observe))
		src := make(chan int)
		st := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, time.Since(start))
			if !healthy {
				return 0, pipeline.Transient(errDown)
			}
			return v, nil
		}, pipeline.WithRetry(2, nil), discardDead[int](),
			pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 3, OpenFor: time.Second, HalfOpenProbes: 2}))
		pipeline.To(pipeline.Then(pipeline.FromChan(p, src), st), nopSink())
		done := runAsync(t.Context(), p)
		state := func() pipeline.BreakerState { return row(t, p.Snapshot(), "call").Breaker.State }

		src <- 1
		synctest.Wait()
		assert.Equal(t, pipeline.BreakerClosed, state())
		setHealthy(false)
		src <- 2 // 2 attempts, both fail: dead-lettered, the breaker is still closed (2 in a row)
		synctest.Wait()
		assert.Equal(t, pipeline.BreakerClosed, state())
		src <- 3 // the third failure in a row opens it; the item is held
		synctest.Wait()
		assert.Equal(t, pipeline.BreakerOpen, state())
		mu.Lock()
		assert.Len(t, calls, 4)
		mu.Unlock()
		time.Sleep(999 * time.Millisecond) // virtual time: no attempt while open
		synctest.Wait()
		mu.Lock()
		assert.Len(t, calls, 4)
		mu.Unlock()
		time.Sleep(time.Millisecond) // the probe fails: open again
		synctest.Wait()
		assert.Equal(t, pipeline.BreakerOpen, state())
		setHealthy(true)
		time.Sleep(time.Second) // the first probe succeeds: still half-open
		synctest.Wait()
		assert.Equal(t, pipeline.BreakerHalfOpen, state())
		src <- 4 // the second probe succeeds: closed
		synctest.Wait()
		assert.Equal(t, pipeline.BreakerClosed, state())
		close(src)
		require.NoError(t, <-done)

		rep := p.Report()
		checkReport(t, rep)
		call := row(t, rep, "call")
		assert.Equal(t, int64(1), call.DeadLettered, "item 2, whose failures came while closed")
		assert.Equal(t, int64(3), call.Succeeded, "items 1, 3 (held, then the first probe) and 4")
		mu.Lock()
		assert.Equal(t, []time.Duration{0, 0, 0, 0, time.Second, 2 * time.Second, 2 * time.Second}, calls)
		mu.Unlock()
		b := call.Breaker
		assert.Equal(t, int64(2), b.Opened)
		assert.Equal(t, int64(2), b.Held, "item 3's attempt that opened it and its failed probe")
		assert.Equal(t, 2*time.Second, b.TimeOpen)
		assert.Equal(t, []pipeline.BreakerTransition{
			{To: pipeline.BreakerOpen, At: 0},
			{To: pipeline.BreakerHalfOpen, At: time.Second},
			{To: pipeline.BreakerOpen, At: time.Second},
			{To: pipeline.BreakerHalfOpen, At: 2 * time.Second},
			{To: pipeline.BreakerClosed, At: 2 * time.Second},
		}, b.Transitions)
		assert.Equal(t, []pipeline.EventKind{
			pipeline.EventBreakerOpen, pipeline.EventBreakerHalfOpen, pipeline.EventBreakerOpen,
			pipeline.EventBreakerHalfOpen, pipeline.EventBreakerClosed,
		}, log.kinds(breakerKinds...))
		for _, e := range log.events {
			assert.Empty(t, e.Key, "a stage's breaker has no key")
		}
	})
}

// runTimedCalls runs one item through a stage "call" with opts whose n-th call (from 1)
// fails with fail(n), or succeeds when that is nil; the run must succeed. It returns
// when each call began, from the start, and the run's report.
func runTimedCalls(t *testing.T, fail func(n int) error, opts ...pipeline.StageOption) ([]time.Duration, pipeline.Report) {
	t.Helper()
	start := time.Now()
	var calls []time.Duration
	st := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
		calls = append(calls, time.Since(start))
		if err := fail(len(calls)); err != nil {
			return 0, err
		}
		return v, nil
	}, opts...)
	p := pipeline.New()
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{1}), st), nopSink())
	require.NoError(t, p.Run(t.Context()))
	return calls, p.Report()
}

// TestBreakerRetryAfter checks that a breaker opened by a failure that asks for a
// Retry-After longer than OpenFor stays open that long before it probes.
func TestBreakerRetryAfter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		calls, _ := runTimedCalls(t, func(n int) error {
			switch n {
			case 1:
				return pipeline.RetryAfter(errors.New("503"), 3*time.Second) // opens it for 3 s
			case 2:
				return pipeline.Transient(errDown) // a failed probe: open for OpenFor
			}
			return nil
		}, pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Second}))
		assert.Equal(t, []time.Duration{0, 3 * time.Second, 4 * time.Second}, calls)
	})
}

// TestBreakerRatio checks the FailureRatio rule: a steady 20 % of failures does not
// open a breaker at 50 %; a rise to 100 % does, once MinSample attempts of the window
// are in, and an item error is no failure for the breaker.
func TestBreakerRatio(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		p := pipeline.New()
		st := pipeline.NewStage("call", 4, func(_ context.Context, v int) (int, error) {
			calls.Add(1)
			time.Sleep(10 * time.Millisecond)
			switch {
			case v >= 2000:
				return 0, pipeline.Transient(errDown)
			case v%5 == 0:
				return 0, pipeline.Transient(errBoom)
			case v%7 == 0:
				return 0, pipeline.Permanent(errBoom) // a bad item: the service is fine
			}
			return v, nil
		}, discardDead[int](), pipeline.WithCircuitBreaker(pipeline.Breaker{
			FailureRatio: 0.5, MinSample: 20, Window: time.Second, OpenFor: time.Hour, MaxOpen: time.Minute,
		}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(3000)), st), nopSink())
		err := p.Run(t.Context())

		require.ErrorIs(t, err, pipeline.ErrBreakerOpen)
		be, ok := errors.AsType[*pipeline.BreakerError](err)
		require.True(t, ok)
		assert.Equal(t, "call", be.Stage)
		assert.Equal(t, time.Minute, be.MaxOpen)
		assert.Equal(t, 2*time.Minute, be.Window, "the default MaxOpenWindow")
		assert.Contains(t, err.Error(), `circuit breaker of stage "call" open for 1m0s of the last 2m0s, as long as its MaxOpen of 1m0s`)
		rep := p.Report()
		checkReport(t, rep)
		call := row(t, rep, "call")
		require.NotNil(t, call.Breaker)
		assert.Equal(t, int64(1), call.Breaker.Opened)
		// Over a second (400 attempts, 20 % failed), 50 % needs some 150 failures past
		// item 2,000, by slices of 100 ms.
		t.Logf("opened after %d calls; %d dead-lettered", calls.Load(), call.DeadLettered)
		assert.Greater(t, calls.Load(), int64(2100))
		assert.Less(t, calls.Load(), int64(2600))
		assert.Greater(t, call.DeadLettered, int64(2000/5), "before it opened, failures were dead-lettered as usual")
	})
}

// TestBreakerCancel checks that workers waiting on an open breaker stop with the run,
// their items counted as failed, and nothing leaks.
func TestBreakerCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		p := pipeline.New()
		st := pipeline.NewStage("call", 4, func(context.Context, int) (int, error) {
			return 0, pipeline.Transient(errDown)
		}, discardDead[int](), pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Hour}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(100)), st), nopSink())
		t0 := time.Now()
		require.ErrorIs(t, p.Run(ctx), context.DeadlineExceeded)
		assert.Equal(t, 10*time.Second, time.Since(t0))
		rep := p.Report()
		checkReport(t, rep)
		call := row(t, rep, "call")
		assert.Equal(t, int64(4), call.Failed, "the held items")
		assert.Zero(t, call.DeadLettered)
		assert.Equal(t, pipeline.BreakerOpen, call.Breaker.State)
		assert.Equal(t, 10*time.Second, call.Breaker.TimeOpen)
		assert.Contains(t, rep.String(), "breaker call: open, opened 1 times, open 10s, ")
		assert.Contains(t, rep.Line(), "call 0/s q=64/64 busy=0/4 failed=4 breaker=open")
	})
}

// TestBreakerOptionPanics checks the misuse of WithCircuitBreaker.
func TestBreakerOptionPanics(t *testing.T) {
	t.Parallel()
	for _, b := range []pipeline.Breaker{
		{},
		{Failures: -1},
		{FailureRatio: 1.5},
		{FailureRatio: -0.1},
		{Failures: 3, OpenFor: -time.Second},
		{Failures: 3, MaxOpen: -time.Second},
		{Failures: 3, HalfOpenProbes: -1},
		{Failures: 3, MaxOpenWindow: -time.Second},
		{Failures: 3, MaxOpen: time.Minute, MaxOpenWindow: time.Second},
	} {
		assertPanicsPipeline(t, func() { pipeline.WithCircuitBreaker(b) })
		assertPanicsPipeline(t, func() { pipeline.NewCircuitBreaker(b) })
	}
	assert.PanicsWithValue(t, "pipeline: WithSharedBreaker(nil)", func() { pipeline.WithSharedBreaker(nil) })
	assert.Equal(t, "half-open", pipeline.BreakerHalfOpen.String())
	assert.Equal(t, "breaker-open", pipeline.EventBreakerOpen.String())
	assert.Equal(t, "BreakerState(9)", pipeline.BreakerState(9).String())
}

var errTooMany = errors.New("429 too many requests")

// TestBreakerCounts checks Breaker.Counts: by default a transient error (a 429 with
// its Retry-After included) opens the breaker (and fails the first probe too); with a predicate that leaves 429s out,
// they neither open it nor are held, and their items are retried after the delay the
// server asked for; a predicate may count item errors too.
func TestBreakerCounts(t *testing.T) {
	t.Parallel()
	not429 := func(err error, class pipeline.Class) bool {
		return class == pipeline.ClassTransient && !errors.Is(err, errTooMany)
	}
	items := func(err error, class pipeline.Class) bool { return class == pipeline.ClassItem }
	cases := []struct {
		name     string
		counts   func(error, pipeline.Class) bool
		fail     error
		opened   int64
		held     int64
		dead     int64
		lastCall time.Duration
	}{
		{name: "default, 429", fail: pipeline.RetryAfter(errTooMany, 100*time.Millisecond), opened: 2, held: 2, lastCall: 2 * time.Second},
		{name: "not 429s, 429", counts: not429, fail: pipeline.RetryAfter(errTooMany, 100*time.Millisecond), lastCall: 200 * time.Millisecond},
		{name: "not 429s, 503", counts: not429, fail: pipeline.Transient(errDown), opened: 2, held: 2, lastCall: 2 * time.Second},
		{name: "default, item error", fail: errBoom, dead: 1},
		{name: "item errors, item error", counts: items, fail: errBoom, opened: 2, held: 2, lastCall: 2 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				calls, rep := runTimedCalls(t, func(n int) error {
					if n <= 2 {
						return c.fail
					}
					return nil
				}, pipeline.WithRetry(3, nil), discardDead[int](), pipeline.WithClassifier(func(error) pipeline.Class { return pipeline.ClassItem }),
					pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Second, Counts: c.counts}))
				call := row(t, rep, "call")
				assert.Equal(t, c.opened, call.Breaker.Opened)
				assert.Equal(t, c.held, call.Breaker.Held)
				assert.Equal(t, c.dead, call.DeadLettered)
				assert.Equal(t, c.lastCall, calls[len(calls)-1])
			})
		})
	}
}

// TestBreakerMaxOpenFlapping checks that MaxOpen counts the time not closed over
// MaxOpenWindow across spells: a breaker that reopens at once after each successful
// probe (each spell 1 s, shorter than MaxOpen) fails the run once its spells add up to
// MaxOpen; one open a third of the time fails it only with a window long enough to
// hold MaxOpen of it.
func TestBreakerMaxOpenFlapping(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		window   time.Duration
		period   time.Duration // the service is down for the last third of each period
		fails    bool
		from, to time.Duration // when the run fails
	}{
		{name: "reopens at once", period: 0, fails: true, from: 10 * time.Second, to: 10 * time.Second},
		{name: "down a third of the time, default window", period: 3 * time.Second},
		{name: "down a third of the time, a window of 60 s", period: 3 * time.Second, window: time.Minute, fails: true, from: 28 * time.Second, to: 34 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				var calls int
				st := pipeline.NewStage("call", 1, func(ctx context.Context, v int) (int, error) {
					calls++
					if c.period == 0 { // every other call fails, at once: each probe succeeds, the next call reopens it
						if calls%2 == 1 {
							return 0, pipeline.Transient(errDown)
						}
						return v, nil
					}
					down := time.Since(start)%c.period >= c.period*2/3
					time.Sleep(10 * time.Millisecond)
					if down {
						return 0, pipeline.Transient(errDown)
					}
					return v, nil
				}, pipeline.WithRetry(3, nil), discardDead[int](),
					pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Second, MaxOpen: 10 * time.Second, MaxOpenWindow: c.window}))
				p := pipeline.New()
				pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(3000)), st), nopSink())
				err := p.Run(t.Context())
				elapsed := time.Since(start)
				rep := p.Report()
				checkReport(t, rep)
				b := row(t, rep, "call").Breaker
				t.Logf("%v: opened %d times, open %v in all, %d calls; %v", elapsed, b.Opened, b.TimeOpen, calls, err)
				assert.Greater(t, b.Opened, int64(5), "it flaps: each spell is shorter than MaxOpen")
				if !c.fails {
					require.NoError(t, err)
					return
				}
				require.ErrorIs(t, err, pipeline.ErrBreakerOpen)
				be, ok := errors.AsType[*pipeline.BreakerError](err)
				require.True(t, ok)
				assert.Equal(t, 10*time.Second, be.Open)
				assert.GreaterOrEqual(t, elapsed, c.from)
				assert.LessOrEqual(t, elapsed, c.to)
			})
		})
	}
}

// TestBreakerShared checks a breaker shared by the stages of two pipelines: opened by
// the first one's failure, it holds the second one's calls (that run starts while it is
// open), lets one probe of either through, and closes for both; each opening is one
// event, and both reports give its account.
func TestBreakerShared(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var (
			mu    sync.Mutex
			down  = true
			calls []string
		)
		service := func(stage string) func(context.Context, int) (int, error) {
			return func(_ context.Context, v int) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, fmt.Sprintf("%s@%v", stage, time.Since(start)))
				if down {
					return 0, pipeline.Transient(errDown)
				}
				return v, nil
			}
		}
		ncalls := func() int { mu.Lock(); defer mu.Unlock(); return len(calls) }
		cb := pipeline.NewCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Second})
		logA, logB := &eventLog{start: start}, &eventLog{start: start}
		pa, pb := pipeline.New(pipeline.WithObserver(logA.observe)), pipeline.New(pipeline.WithObserver(logB.observe))
		pipeline.To(pipeline.Then(pipeline.FromSlice(pa, []int{1}), pipeline.NewStage("a", 1, service("a"), pipeline.WithSharedBreaker(cb))), nopSink())
		pipeline.To(pipeline.Then(pipeline.FromSlice(pb, []int{2}), pipeline.NewStage("b", 1, service("b"), pipeline.WithSharedBreaker(cb))), nopSink())

		doneA, doneB := make(chan error), make(chan error)
		go func() { doneA <- pa.Run(t.Context()) }()
		synctest.Wait()
		assert.Equal(t, pipeline.BreakerOpen, cb.State(), "a's failure opened it")
		assert.Equal(t, 1, ncalls())
		go func() { doneB <- pb.Run(t.Context()) }()
		synctest.Wait()
		assert.Equal(t, 1, ncalls(), "b's call is held: the service is down")
		time.Sleep(time.Second) // one probe, of a or of b: it fails
		synctest.Wait()
		assert.Equal(t, 2, ncalls())
		assert.Equal(t, pipeline.BreakerOpen, cb.State())
		mu.Lock()
		down = false
		mu.Unlock()
		time.Sleep(time.Second) // the probe succeeds: closed, and the other goes on
		require.NoError(t, <-doneA)
		require.NoError(t, <-doneB)
		assert.Equal(t, 4, ncalls())
		assert.Equal(t, pipeline.BreakerClosed, cb.State())

		ra, rb := row(t, pa.Report(), "a").Breaker, row(t, pb.Report(), "b").Breaker
		assert.Equal(t, int64(2), ra.Opened)
		assert.Equal(t, int64(2), rb.Opened, "the shared breaker's account")
		assert.Equal(t, 2*time.Second, ra.TimeOpen)
		assert.Equal(t, int64(2), ra.Held+rb.Held, "the first failure and the failed probe")
		assert.Equal(t, ra.Transitions, rb.Transitions, "both runs started at the same instant of virtual time")
		opens := len(logA.kinds(pipeline.EventBreakerOpen)) + len(logB.kinds(pipeline.EventBreakerOpen))
		assert.Equal(t, 2, opens, "each opening is one event, in the run that made it")
	})
}

// TestBreakerProbeGivenBack checks that a shared breaker's half-open probe is given
// back when its attempt ends without an outcome: the run stopping under it, its
// function panicking, or a later policy's key function panicking after the breaker let
// the probe through, or the breaker's Counts panicking on the probe's failure. The next
// pipeline's attempt is then the probe that closes it. A probe left taken kept the
// breaker half-open for good, and the next run waited forever.
func TestBreakerProbeGivenBack(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"canceled", "panic", "key panic", "counts panic"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var calls, keys atomic.Int64
				cb := pipeline.NewCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Second, Counts: func(_ error, c pipeline.Class) bool {
					if how == "counts panic" && calls.Load() == 2 { // the probe's failure
						panic("the breaker's Counts panics")
					}
					return c == pipeline.ClassTransient
				}})
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				first := pipeline.NewStage("first", 1, func(context.Context, int) (int, error) {
					if calls.Add(1) == 1 {
						return 0, pipeline.Transient(errDown) // opens the breaker: the item is held
					}
					// the probe, after OpenFor
					switch how {
					case "panic":
						panic("the probe's function panics")
					case "canceled":
						cancel()
					}
					return 0, pipeline.Transient(errDown)
				}, pipeline.WithSharedBreaker(cb), pipeline.WithRateLimitPerKey(func(v int) int {
					if keys.Add(1) == 2 && how == "key panic" { // the probe's, after the breaker let it through
						panic("the rate limit's key function panics")
					}
					return v
				}, 1e6, 1000))
				p1 := pipeline.New()
				pipeline.To(pipeline.Then(pipeline.FromSlice(p1, []int{1}), first), nopSink())
				err := p1.Run(ctx)
				calledBack := int64(2) // the first call and the probe
				if how == "canceled" {
					require.ErrorIs(t, err, context.Canceled)
				} else {
					var pe *pipeline.PanicError
					require.ErrorAs(t, err, &pe)
					if how == "key panic" {
						calledBack = 1 // the probe never reached the function
					}
				}
				assert.Equal(t, calledBack, calls.Load())
				assert.Equal(t, pipeline.BreakerHalfOpen, cb.State())

				ctx2, cancel2 := context.WithTimeout(t.Context(), time.Minute) // virtual time: only if the probe is never free
				defer cancel2()
				p2 := pipeline.New()
				second := pipeline.NewStage("second", 1, func(_ context.Context, v int) (int, error) {
					calls.Add(1)
					return v, nil
				}, pipeline.WithSharedBreaker(cb))
				out, err := pipeline.Collect(ctx2, pipeline.Then(pipeline.FromSlice(p2, []int{2}), second))
				require.NoError(t, err, "the next run's attempt is the probe")
				assert.Equal(t, []int{2}, out)
				assert.Equal(t, pipeline.BreakerClosed, cb.State())
				assert.Equal(t, calledBack+1, calls.Load())
			})
		})
	}
}

// TestBreakerWindowShorterThanItsSlices runs a breaker whose Window is shorter than its
// ten slices of time (5 ns): it counts in slices of 1 ns, opens on failures, and the
// run ends with the breaker's error, not a division by zero with its lock held (which
// then hung the report).
func TestBreakerWindowShorterThanItsSlices(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		st := pipeline.NewStage("call", 2, func(context.Context, int) (int, error) {
			time.Sleep(time.Millisecond)
			return 0, pipeline.Transient(errDown)
		}, discardDead[int](), pipeline.WithCircuitBreaker(pipeline.Breaker{
			FailureRatio: 0.5, MinSample: 2, Window: 5 * time.Nanosecond, OpenFor: 10 * time.Millisecond, MaxOpen: time.Second,
		}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(100)), st), nopSink())
		err := p.Run(t.Context())
		_, panicked := errors.AsType[*pipeline.PanicError](err)
		require.False(t, panicked, "%v", err)
		checkReport(t, p.Report())
	})
}

// shardItem is an item of one of 4 shards, emitted at a known time.
type shardItem struct {
	shard, i int
	at       time.Duration // when the source emitted it, since the start
}

// snapshotAfter takes p's snapshot d from now (in a synctest bubble, d of its virtual
// time into the run about to start); the function returns it once the run has ended.
func snapshotAfter(p *pipeline.Pipeline, d time.Duration) func() pipeline.Report {
	var mu sync.Mutex
	var mid pipeline.Report
	time.AfterFunc(d, func() {
		mu.Lock()
		defer mu.Unlock()
		mid = p.Snapshot()
	})
	return func() pipeline.Report {
		mu.Lock()
		defer mu.Unlock()
		return mid
	}
}

// shardDown runs f in a parallel subtest, in a synctest bubble, for each breaker rule of
// the shard-down scenario: a ratio (which a stage-wide breaker reaches for all shards)
// and a count (which a stage-wide breaker never reaches, the other shards' successes
// breaking the run); either opens shard 3's breaker. svc is the scenario's service, with
// shard 3 down from 2 s to 47 s.
func shardDown(t *testing.T, f func(t *testing.T, rule string, b pipeline.Breaker, svc *shardService)) {
	t.Helper()
	for _, tc := range []struct {
		name string
		b    pipeline.Breaker
	}{
		{"ratio", pipeline.Breaker{FailureRatio: 0.2, OpenFor: time.Second}},
		{"count", pipeline.Breaker{Failures: 5, OpenFor: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				f(t, tc.name, tc.b, &shardService{start: time.Now(), down: 3, from: 2 * time.Second, to: 47 * time.Second})
			})
		})
	}
}

// shardService is a simulated service of 4 shards that takes 10 ms per call; shard
// down fails every call that starts in [from, to) since it was made.
type shardService struct {
	start    time.Time
	down     int
	from, to time.Duration
	calls    atomic.Int64
	failed   atomic.Int64
}

func (s *shardService) call(ctx context.Context, v shardItem) (shardItem, error) {
	s.calls.Add(1)
	at := time.Since(s.start)
	down := v.shard == s.down && at >= s.from && at < s.to
	select {
	case <-time.After(10 * time.Millisecond):
	case <-ctx.Done():
		return v, ctx.Err()
	}
	if down {
		s.failed.Add(1)
		return v, pipeline.Transient(errDown)
	}
	return v, nil
}

// pacedShards emits n items of 4 shards in turn, one every 1/rate s.
func pacedShards(n, rate int) func(yield func(shardItem) bool) {
	return func(yield func(shardItem) bool) {
		start := time.Now()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := range n {
			if !yield(shardItem{shard: i % 4, i: i, at: time.Since(start)}) {
				return
			}
			<-tick.C
		}
	}
}

// TestBreakerPerKeyShardDown is the scenario: 10,000 items of 4 shards at 200/s,
// shard 3 down for 45 s. With a breaker per shard, the healthy shards' items are
// delivered at their offered rate throughout (the held items never keep a worker),
// shard 3's items are held and delivered after it recovers, none is dead-lettered or
// lost, and the held items stay within the bound. Both rules open shard 3's breaker:
// the ratio (which a stage-wide breaker would reach for all shards) and a count (which
// a stage-wide breaker never reaches, the other shards' successes breaking the run).
func TestBreakerPerKeyShardDown(t *testing.T) {
	t.Parallel()
	shardDown(t, testBreakerPerKeyShardDown)
}

func testBreakerPerKeyShardDown(t *testing.T, rule string, b pipeline.Breaker, svc *shardService) {
	const n, rate = 10000, 200
	dead := pipeline.NewDeadLetterBuffer[shardItem](n)
	start := time.Now()
	var mu sync.Mutex
	var healthy [60]int // healthy items delivered per second of the run
	var late []shardItem
	var slowest time.Duration // of a healthy item, from its source to the sink
	var delivered atomic.Int64
	var peakHeld int64
	p := pipeline.New()
	// Until it opens, shard 3's items spend their own attempts: enough of them
	// that none runs out first (see WithCircuitBreaker).
	st := pipeline.NewStage("call", 8, svc.call,
		pipeline.WithRetry(5, pipeline.ConstantBackoff(200*time.Millisecond)),
		pipeline.WithDeadLetter(dead.Add),
		pipeline.WithBreakerPerKey(func(v shardItem) int { return v.shard }, b, pipeline.KeyBounds{Held: 3000}))
	pipeline.To(pipeline.Then(pipeline.FromSeq(p, pacedShards(n, rate)), st), pipeline.NewSink("sink", 1, func(_ context.Context, v shardItem) error {
		at := time.Since(start)
		mu.Lock()
		if v.shard != 3 {
			healthy[int(at/time.Second)]++
			slowest = max(slowest, at-v.at)
		} else if v.at >= 3*time.Second && v.at < 46*time.Second {
			late = append(late, v)
		}
		mu.Unlock()
		delivered.Add(1)
		return nil
	}))
	var mid pipeline.Report
	tick := time.NewTicker(time.Second)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-tick.C:
				s := p.Snapshot()
				if r, ok := s.Stage("call"); ok && r.Breaker != nil {
					peakHeld = max(peakHeld, r.Breaker.Holding)
					if time.Since(start) >= 30*time.Second && mid.Stages == nil {
						mid = s
					}
				}
			case <-stop:
				return
			}
		}
	}()
	require.NoError(t, p.Run(t.Context()))
	close(stop)
	<-done
	tick.Stop()

	rep := p.Report()
	checkReport(t, rep)
	call := row(t, rep, "call")
	t.Logf("%s: %v of virtual time, %d delivered, %d dead-lettered, breaker opened %d times, %d attempts held, peak %d items held, %d calls failed",
		rule, rep.Elapsed, delivered.Load(), call.DeadLettered, call.Breaker.Opened, call.Breaker.Held, peakHeld, svc.failed.Load())
	assert.Zero(t, call.DeadLettered)
	assert.Empty(t, dead.Items())
	assert.Equal(t, int64(n), call.Succeeded)
	assert.Equal(t, int64(n), delivered.Load(), "none lost")
	// The healthy shards offer 150/s. Until shard 3's breaker opens, its items
	// spend their retries' backoff in the workers' hands (a second at most);
	// from then on, in every whole second to the end of the source, the
	// healthy items were delivered at 95 % of that or more.
	t.Logf("healthy items per second: %v; the slowest took %v", healthy[:52], slowest)
	for s := 4; s < 49; s++ {
		assert.GreaterOrEqualf(t, healthy[s], 143, "healthy items delivered in second %d", s)
	}
	assert.Less(t, slowest, time.Second)
	// Shard 3's items of the outage were held and delivered after it.
	assert.Len(t, late, 43*rate/4, "shard 3's items emitted from 3 s to 46 s")
	// Memory: at most what the outage offered of shard 3, within the bound.
	assert.LessOrEqual(t, peakHeld, int64(46*rate/4))
	assert.Greater(t, peakHeld, int64(40*rate/4))
	// Mid-outage, the snapshot shows shard 3 open and holding, the others not.
	mc := row(t, mid, "call")
	require.NotNil(t, mc.Breaker)
	assert.True(t, mc.Breaker.PerKey)
	assert.Equal(t, 1, mc.Breaker.KeysOpen)
	require.Len(t, mc.Breaker.Keys, 1)
	assert.Equal(t, "3", mc.Breaker.Keys[0].Key)
	assert.Positive(t, mc.Breaker.Keys[0].Holding)
	assert.Equal(t, int64(mc.Breaker.Keys[0].Holding), mc.Breaker.Holding)
	assert.GreaterOrEqual(t, mc.NotStarted, mc.Breaker.Holding, "held items count as not started")
	// At the end every key is closed and nothing is held.
	assert.Equal(t, pipeline.BreakerClosed, call.Breaker.State)
	assert.Zero(t, call.Breaker.Holding)
	assert.Zero(t, call.Breaker.KeysOpen)
	assert.Empty(t, call.Breaker.Keys)
	assert.Zero(t, call.InFlight, "an item held by one worker and taken back by another is in flight in neither once done")
	assert.Less(t, rep.Elapsed, 55*time.Second)
}

// keyService is a simulated service that takes 10 ms per call and fails every call of
// a key in down until downTo since it was made (for ever when downTo is 0).
type keyService struct {
	start  time.Time
	down   map[string]bool
	downTo time.Duration
	mu     sync.Mutex
	calls  map[string]int
	done   map[int]int // processed items, by value
}

func newKeyService(downTo time.Duration, down ...string) *keyService {
	s := &keyService{start: time.Now(), down: map[string]bool{}, downTo: downTo, calls: map[string]int{}, done: map[int]int{}}
	for _, k := range down {
		s.down[k] = true
	}
	return s
}

// keyOf is the key of item v of keyService's tests: "a", "b", "c", ... in turn.
func keyOf(keys int) func(int) string {
	return func(v int) string { return string(rune('a' + v%keys)) }
}

func (s *keyService) call(key func(int) string) func(context.Context, int) (int, error) {
	return func(ctx context.Context, v int) (int, error) {
		k := key(v)
		down := s.down[k] && (s.downTo == 0 || time.Since(s.start) < s.downTo)
		s.mu.Lock()
		s.calls[k]++
		s.mu.Unlock()
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if down {
			return 0, pipeline.Transient(errDown)
		}
		s.mu.Lock()
		s.done[v]++
		s.mu.Unlock()
		return v, nil
	}
}

// TestBreakerPerKeyOneWorkerServesOtherKeys checks that an open key's items never keep
// a worker: with one worker, key a down for 2 s and key b up, every b item is
// processed before a recovers, and while a is down only its probes reach the service.
// Then a's held items are processed, each once.
func TestBreakerPerKeyOneWorkerServesOtherKeys(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 100
		svc := newKeyService(2*time.Second, "a")
		key := keyOf(2)
		start := time.Now()
		var bDone []time.Duration
		p := pipeline.New()
		st := pipeline.NewStage("call", 1, svc.call(key),
			pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 500 * time.Millisecond}, pipeline.KeyBounds{}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(_ context.Context, v int) error {
			if key(v) == "b" {
				bDone = append(bDone, time.Since(start))
			}
			return nil
		}))
		require.NoError(t, p.Run(t.Context()))
		rep := p.Report()
		checkReport(t, rep)
		call := row(t, rep, "call")
		assert.Equal(t, int64(n), call.Succeeded)
		assert.Zero(t, call.DeadLettered)
		require.Len(t, bDone, n/2)
		assert.Less(t, bDone[len(bDone)-1], time.Second, "b's items do not wait for a")
		for i := range n {
			assert.Equal(t, 1, svc.done[i], i)
		}
		// a: its first item's failure opens its breaker; then a probe every 500 ms
		// until 2 s (the ones at 0.5, 1 and 1.5 s fail), then its 50 items.
		assert.Equal(t, 1+3+n/2, svc.calls["a"])
		assert.Equal(t, n/2, svc.calls["b"])
		assert.Equal(t, int64(4), call.Breaker.Opened)
		assert.Equal(t, int64(4), call.Breaker.Held, "the failed attempts held")
		assert.Less(t, rep.Elapsed, 2*time.Second+time.Second)
	})
}

// TestBreakerPerKeyBounds checks both bounds. Held: key a's breaker holds 5 items, the
// 15 after them are shed to the dead letters with a *BreakerFullError, and the held 5
// are processed after a recovers. Keys: with one key state, a (down) has it; b (down)
// and c (up) share the rest's breaker, so that b's failure holds c's items too, as a
// stage-wide breaker would; all of them are processed in the end.
func TestBreakerPerKeyBounds(t *testing.T) {
	t.Parallel()
	t.Run("held", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			const n = 20
			svc := newKeyService(2*time.Second, "a")
			key := keyOf(1)
			dead := pipeline.NewDeadLetterBuffer[int](n)
			p := pipeline.New()
			st := pipeline.NewStage("call", 1, svc.call(key), pipeline.WithDeadLetter(dead.Add),
				pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 500 * time.Millisecond}, pipeline.KeyBounds{Held: 5}))
			midRun := snapshotAfter(p, time.Second)
			pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
			require.NoError(t, p.Run(t.Context()))
			rep := p.Report()
			checkReport(t, rep)
			call := row(t, rep, "call")
			assert.Equal(t, int64(5), call.Succeeded)
			assert.Equal(t, int64(n-5), call.DeadLettered)
			require.Len(t, dead.Items(), n-5)
			for i, d := range dead.Items() {
				assert.Equal(t, 5+i, d.Item, "the items past the bound, in order")
				assert.Equal(t, "*pipeline.BreakerFullError", d.ErrType)
				assert.Equal(t, (&pipeline.BreakerFullError{Stage: "call", Key: "a", Held: 5}).Error(), d.LastError)
				assert.Equal(t, pipeline.ClassItem, d.Class)
				assert.Zero(t, d.Attempts, "shed before any attempt")
			}
			require.Len(t, call.Errors, 1, "the held attempts' errors are not the items'")
			assert.Equal(t, "*pipeline.BreakerFullError", call.Errors[0].Type)
			assert.Equal(t, int64(n-5), call.Errors[0].DeadLettered)
			for i := range 5 {
				assert.Equal(t, 1, svc.done[i], i)
			}
			mid := midRun()
			mc := row(t, mid, "call")
			require.NotNil(t, mc.Breaker)
			assert.Equal(t, int64(5), mc.Breaker.Holding)
			assert.Equal(t, []pipeline.KeyBreakerReport{{Key: "a", State: pipeline.BreakerOpen, Holding: 5, Opened: 2}}, mc.Breaker.Keys)
			assert.Contains(t, mid.String(), "; per key: 1 keys not closed, 5 items held (a: open, 5 held)\n")
		})
	})
	t.Run("keys", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			const n = 60
			svc := newKeyService(time.Second, "a", "b")
			key := keyOf(3)
			p := pipeline.New()
			st := pipeline.NewStage("call", 1, svc.call(key),
				pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 300 * time.Millisecond}, pipeline.KeyBounds{Keys: 1}))
			midRun := snapshotAfter(p, 500*time.Millisecond)
			pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
			require.NoError(t, p.Run(t.Context()))
			rep := p.Report()
			checkReport(t, rep)
			call := row(t, rep, "call")
			assert.Equal(t, int64(n), call.Succeeded)
			for i := range n {
				assert.Equal(t, 1, svc.done[i], i)
			}
			assert.Equal(t, n/3, svc.calls["c"], "c is up: each of its items called once, held while the shared breaker was open")
			mid := midRun()
			mc := row(t, mid, "call")
			require.NotNil(t, mc.Breaker)
			assert.Equal(t, 2, mc.Breaker.KeysOpen)
			keys := map[string]int{}
			for _, k := range mc.Breaker.Keys {
				keys[k.Key] = k.Holding
			}
			assert.Equal(t, map[string]int{"a": n / 3, "(other keys)": 2 * n / 3}, keys)
		})
	})
}

// TestBreakerPerKeyCancel checks a run stopped while items are held: they count as not
// started, the report says how many were held, every other item settled once, and no
// goroutine is left.
func TestBreakerPerKeyCancel(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		const n = 200
		svc := newKeyService(0, "a")
		key := keyOf(2)
		p := pipeline.New()
		st := pipeline.NewStage("call", 4, svc.call(key),
			pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 200 * time.Millisecond}, pipeline.KeyBounds{}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		err := p.Run(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		rep := p.Report()
		checkAccounting(t, rep)
		call := row(t, rep, "call")
		require.NotNil(t, call.Breaker)
		assert.Equal(t, int64(n/2), call.Succeeded, "b's items")
		assert.Equal(t, int64(n), call.In)
		assert.Zero(t, call.DeadLettered)
		assert.Equal(t, call.Breaker.Holding, call.NotStarted-int64(call.QueueLen), "the held items are not started")
		assert.Equal(t, int64(n/2), call.Breaker.Holding+call.Failed, "a's items: held, or in a probe when the run stopped")
		assert.LessOrEqual(t, call.Failed, int64(1))
		for i := range n {
			if key(i) == "b" {
				assert.Equal(t, 1, svc.done[i], i)
			}
		}
	})
}

// TestBreakerPerKeyCheckpoint checks that a checkpointed run stopped while items are
// held resumes exactly: its checkpoint stays before the first held item, and the next
// run (the key up again) processes every item from there; no item is missed.
func TestBreakerPerKeyCheckpoint(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 400
		store := &memStore{}
		key := keyOf(4)
		first := newKeyService(0, "d")
		runOnce := func(svc *keyService, ctx context.Context) (pipeline.Report, error) {
			p := pipeline.New()
			st := pipeline.NewSink("call", 4, func(ctx context.Context, v int) error {
				_, err := svc.call(key)(ctx, v)
				return err
			}, pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 300 * time.Millisecond}, pipeline.KeyBounds{}))
			pipeline.To(pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(10)), st)
			err := p.Run(ctx)
			return p.Report(), err
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		rep, err := runOnce(first, ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		checkAccounting(t, rep)
		call := row(t, rep, "call")
		assert.Equal(t, int64(3*n/4), call.Succeeded)
		saved := store.pos
		assert.LessOrEqual(t, saved, int64(3), "before the first of d's items, which is held")
		for i := range int(saved) {
			assert.Equal(t, 1, first.done[i], i)
		}

		second := newKeyService(0)
		rep, err = runOnce(second, t.Context())
		require.NoError(t, err)
		checkReport(t, rep)
		assert.Equal(t, int64(n), store.pos)
		assert.Len(t, second.done, n-int(saved))
		for i := range n {
			assert.Equal(t, 1, max(first.done[i], second.done[i]), i) // in one run, or redone past the checkpoint
			if key(i) == "d" {
				assert.Zero(t, first.done[i], i)
			}
			if key(i) == "d" || i >= int(saved) {
				assert.Equal(t, 1, second.done[i], i)
			}
		}
	})
}

// TestBreakerPerKeyPanics checks WithBreakerPerKey's misuse: a nil key, a negative
// bound, a bad Breaker, another item type, and the stages it cannot serve.
func TestBreakerPerKeyPanics(t *testing.T) {
	t.Parallel()
	key := func(v int) int { return v % 4 }
	b := pipeline.Breaker{Failures: 3}
	id := func(_ context.Context, v int) (int, error) { return v, nil }
	assert.PanicsWithValue(t, "pipeline: WithBreakerPerKey: nil key function", func() {
		pipeline.WithBreakerPerKey[int, int](nil, b, pipeline.KeyBounds{})
	})
	assertPanicsPipeline(t, func() { pipeline.WithBreakerPerKey(key, b, pipeline.KeyBounds{Held: -1}) })
	assertPanicsPipeline(t, func() { pipeline.WithBreakerPerKey(key, b, pipeline.KeyBounds{Keys: -1}) })
	assertPanicsPipeline(t, func() { pipeline.WithBreakerPerKey(key, pipeline.Breaker{}, pipeline.KeyBounds{}) })
	for _, tc := range []struct {
		opt  pipeline.StageOption
		want string
	}{
		{pipeline.WithOrdered(0), "WithBreakerPerKey and WithOrdered together"},
		{pipeline.WithKey(func(v int) int { return v }), "WithBreakerPerKey and WithKey together"},
		{pipeline.WithPartition(func(v int) int { return v }), "WithBreakerPerKey and WithPartition together"},
	} {
		msg := assertPanicsPipeline(t, func() {
			pipeline.NewStage("s", 2, id, tc.opt, pipeline.WithBreakerPerKey(key, b, pipeline.KeyBounds{}))
		})
		assert.Contains(t, msg, tc.want)
	}
	msg := assertPanicsPipeline(t, func() {
		pipeline.NewStage("s", 2, func(_ context.Context, v string) (string, error) { return v, nil }, pipeline.WithBreakerPerKey(key, b, pipeline.KeyBounds{}))
	})
	assert.Contains(t, msg, "for another item type")
}

// TestBreakerPerStageShardDown is TestBreakerPerKeyShardDown's scenario with one
// breaker for the stage, the shortfall WithBreakerPerKey is for: by either rule it opens
// for every shard (shard 3's retries fail together), and the healthy shards' items wait
// out the outage with shard 3's.
func TestBreakerPerStageShardDown(t *testing.T) {
	t.Parallel()
	shardDown(t, testBreakerPerStageShardDown)
}

func testBreakerPerStageShardDown(t *testing.T, rule string, b pipeline.Breaker, svc *shardService) {
	const n, rate = 10000, 200
	start := time.Now()
	var mu sync.Mutex
	healthy := 0 // healthy items delivered from 10 s to 40 s
	p := pipeline.New()
	st := pipeline.NewStage("call", 8, svc.call,
		pipeline.WithRetry(5, pipeline.ConstantBackoff(200*time.Millisecond)),
		discardDead[shardItem](), pipeline.WithCircuitBreaker(b))
	pipeline.To(pipeline.Then(pipeline.FromSeq(p, pacedShards(n, rate)), st), pipeline.NewSink("sink", 1, func(_ context.Context, v shardItem) error {
		if at := time.Since(start); v.shard != 3 && at >= 10*time.Second && at < 40*time.Second {
			mu.Lock()
			healthy++
			mu.Unlock()
		}
		return nil
	}))
	require.NoError(t, p.Run(t.Context()))
	rep := p.Report()
	checkReport(t, rep)
	call := row(t, rep, "call")
	t.Logf("%s: %v of virtual time, healthy items delivered at %.1f/s from 10 s to 40 s (150/s offered), %d dead-lettered, breaker opened %d times",
		rule, rep.Elapsed, float64(healthy)/30, call.DeadLettered, call.Breaker.Opened)
	assert.Less(t, healthy, 30*150/2, "the healthy shards are held too")
	assert.Greater(t, rep.Elapsed, 47*time.Second+10*time.Second, "the healthy items wait for shard 3")
}

// TestBreakerPerKeyDrainedBudget checks that a budget that drains the stage drops the
// held items (not started) rather than keeping the workers for them: key a is down for
// good, and key b's failures trip a draining budget; the run ends with the budget's
// error and a's items count as not started.
func TestBreakerPerKeyDrainedBudget(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		key := keyOf(2)
		svc := newKeyService(0, "a")
		call := svc.call(key)
		p := pipeline.New()
		st := pipeline.NewStage("call", 1, func(ctx context.Context, v int) (int, error) {
			if key(v) == "b" && v > 20 {
				return 0, pipeline.Permanent(errors.New("bad item"))
			}
			return call(ctx, v)
		}, discardDead[int](),
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 5, Drain: true}),
			pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 100 * time.Millisecond}, pipeline.KeyBounds{}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		err := p.Run(ctx)
		require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
		require.NoError(t, ctx.Err(), "the run ended by itself")
		rep := p.Report()
		checkAccounting(t, rep)
		call2 := row(t, rep, "call")
		assert.Equal(t, int64(n), call2.In)
		assert.Equal(t, int64(10), call2.Succeeded, "b's items up to 20")
		assert.Equal(t, int64(2), call2.DeadLettered, "b's failures that tripped the budget")
		assert.Equal(t, int64(n-12), call2.NotStarted, "a's items, held and dropped, and b's after the drain")
	})
}

// TestBreakerPerKeyFlatStage checks a flat stage and a sink with a breaker per key: the
// held items' outputs (two per item) all reach the sink once their key recovers, with
// workers ∈ {1, 4}.
func TestBreakerPerKeyFlatStage(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const n = 200
				key := keyOf(3)
				svc := newKeyService(time.Second, "c")
				call := svc.call(key)
				p := pipeline.New()
				flat := pipeline.NewFlatStage("split", workers, func(ctx context.Context, v int, emit func(int)) error {
					if _, err := call(ctx, v); err != nil {
						return err
					}
					emit(v)
					emit(-v - 1)
					return nil
				}, pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 200 * time.Millisecond}, pipeline.KeyBounds{}))
				var mu sync.Mutex
				seen := map[int]int{}
				pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), flat), pipeline.NewSink("sink", 2, func(_ context.Context, v int) error {
					mu.Lock()
					defer mu.Unlock()
					seen[v]++
					return nil
				}, pipeline.WithBreakerPerKey(func(v int) bool { return v < 0 }, pipeline.Breaker{Failures: 1}, pipeline.KeyBounds{})))
				require.NoError(t, p.Run(t.Context()))
				rep := p.Report()
				checkAccounting(t, rep) // a flat stage: two outputs per item
				checkChain(t, rep)
				assert.Equal(t, int64(n), row(t, rep, "split").Succeeded)
				assert.Equal(t, int64(2*n), row(t, rep, "sink").Succeeded)
				require.Len(t, seen, 2*n)
				for v, c := range seen {
					assert.Equal(t, 1, c, v)
				}
				assert.Positive(t, row(t, rep, "split").Breaker.Opened)
			})
		})
	}
}

// TestBreakerPerKeyMaxOpen checks MaxOpen per key: key a down for good fails the run
// with a *BreakerError at its first failed probe past MaxOpen, once b's items are all
// processed, and the accounting adds up.
func TestBreakerPerKeyMaxOpen(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		key := keyOf(2)
		svc := newKeyService(0, "a")
		start := time.Now()
		p := pipeline.New()
		st := pipeline.NewStage("call", 2, svc.call(key),
			pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 500 * time.Millisecond, MaxOpen: 2 * time.Second}, pipeline.KeyBounds{}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		err := p.Run(t.Context())
		be, ok := errors.AsType[*pipeline.BreakerError](err)
		require.True(t, ok, "%v", err)
		require.ErrorIs(t, err, pipeline.ErrBreakerOpen)
		assert.GreaterOrEqual(t, be.Open, 2*time.Second)
		assert.Less(t, time.Since(start), 3*time.Second, "at the first probe past MaxOpen")
		rep := p.Report()
		checkAccounting(t, rep)
		call := row(t, rep, "call")
		assert.Equal(t, int64(n/2), call.Succeeded, "b's items")
		// Each worker may take a held item back as the open time passes MaxOpen: its
		// attempt finds the breaker open too long, fails, and stops the run.
		assert.GreaterOrEqual(t, call.Failed, int64(1), "the items whose attempt found the breaker open too long")
		assert.LessOrEqual(t, call.Failed, int64(2), "one per worker at most")
		assert.Equal(t, int64(n/2)-call.Failed, call.NotStarted, "a's other items, held")
		assert.Equal(t, call.NotStarted, call.Breaker.Holding)
	})
}

// TestBreakerPerKeyDrainStopsTakingBack: once an error budget drains, a worker taking
// back a key's held items starts no more of them, as it starts no new item: key "a"
// fails its first call, then passes its probe, then fails every call; the budget
// drains within a few failures. (The loop over held items did not look, and went on
// to dead-letter some sixty of them.)
func TestBreakerPerKeyDrainStopsTakingBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 400
		key := keyOf(2)
		var aCalls atomic.Int64
		p := pipeline.New()
		st := pipeline.NewStage("call", 1, func(ctx context.Context, v int) (int, error) {
			if key(v) == "a" {
				switch aCalls.Add(1) {
				case 1:
					return 0, pipeline.Transient(errors.New("down"))
				case 2:
					return v, nil
				default:
					return 0, pipeline.Permanent(errors.New("bad"))
				}
			}
			return v, nil
		}, discardDead[int](),
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.5, MinSample: 5, Window: 5, Drain: true}),
			pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 100 * time.Millisecond}, pipeline.KeyBounds{}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		err := p.Run(t.Context())
		rep := p.Report()
		require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
		call := row(t, rep, "call")
		t.Logf("a calls %d, dead-lettered %d", aCalls.Load(), call.DeadLettered)
		checkAccounting(t, rep)
		// With MinSample 5, Window 5, MaxRatio 0.5: at most a few failures before the drain trips.
		assert.LessOrEqual(t, call.DeadLettered, int64(5))
	})
}

// TestBreakerPerKeyIdleWorkersEnd checks that workers waiting for held items all end
// once the held items are done, whichever worker took them: many workers, every item
// in the queue at once (so the input ends while items are held), one key down for a
// while. A worker that waited for a signal that never came would leave the run
// blocked, which synctest reports as a deadlock.
func TestBreakerPerKeyIdleWorkersEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		workers int
		items   int
		probes  int
	}{
		{"2 workers", 2, 4, 1},
		{"4 workers", 4, 12, 1},
		{"8 workers", 8, 40, 1},
		{"8 workers 3 probes", 8, 40, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for i := range 50 {
				synctest.Test(t, func(t *testing.T) {
					svc := newKeyService(time.Duration(100+10*i)*time.Millisecond, "a")
					key := keyOf(2)
					p := pipeline.New()
					st := pipeline.NewStage("call", tc.workers, svc.call(key),
						pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 50 * time.Millisecond, HalfOpenProbes: tc.probes}, pipeline.KeyBounds{}))
					var got atomic.Int64
					pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(tc.items)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error {
						got.Add(1)
						return nil
					}))
					require.NoError(t, p.Run(t.Context()))
					assert.Equal(t, int64(tc.items), got.Load())
					for v := range tc.items {
						assert.Equal(t, 1, svc.done[v], v)
					}
				})
			}
		})
	}
}

// TestBreakerPerKeyIdleWorkerTakesBackItemHeldAfterItWaited checks that a worker that
// went idle while nothing was held takes back an item held after it began to wait, once
// the item's key half-opens, though no more input comes: the worker that held the item
// stays busy with the next item of its run, which waits for the held one. Two workers
// are kept busy at once first, so that x and y are queued together and one worker
// takes both; the other finds the queue empty and waits. (It waited for input alone:
// the item's hold did not wake it, and the run hung.)
func TestBreakerPerKeyIdleWorkerTakesBackItemHeldAfterItWaited(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const openFor = 100 * time.Millisecond
		busy := make(chan struct{}, 2) // the warm-up items' calls have begun
		release := make(chan struct{})
		x := newDownOnce()
		xDone := x.done
		call := func(ctx context.Context, v string) (string, error) {
			switch v {
			case "w1", "w2": // both workers busy (and their runs no longer of one item)
				busy <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
					return "", ctx.Err()
				}
			case "x": // key a, down for its first call
				if err := x.call(ctx); err != nil {
					return "", err
				}
			case "y": // key b: waits for x
				select {
				case <-xDone:
				case <-ctx.Done():
					return "", ctx.Err()
				}
			}
			return v, nil
		}
		key := func(v string) string {
			if v == "x" {
				return "a"
			}
			return "b"
		}
		p := pipeline.New()
		src := pipeline.Generate(p, func(ctx context.Context, emit func(string) error) error {
			emits := func(vs ...string) error {
				for _, v := range vs {
					if err := emit(v); err != nil {
						return err
					}
				}
				return nil
			}
			if err := emits("w1", "w2"); err != nil {
				return err
			}
			for range 2 {
				select {
				case <-busy:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if err := emits("x", "y"); err != nil {
				return err
			}
			close(release)
			select { // the input stays open, with nothing more in it, until x is done
			case <-xDone:
			case <-ctx.Done():
			}
			return nil
		})
		st := pipeline.NewStage("call", 2, call,
			pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: openFor}, pipeline.KeyBounds{}))
		got, err := pipeline.Collect(t.Context(), pipeline.Then(src, st))
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"w1", "w2", "x", "y"}, got)
		assert.Equal(t, int64(2), x.calls.Load())
		// Its first call failed at 10 ms; the idle worker took it back as its key
		// half-opened, and its probe took 10 ms.
		assert.Equal(t, 10*time.Millisecond+openFor+10*time.Millisecond, x.at)
		rep := row(t, p.Report(), "call")
		assert.Equal(t, int64(1), rep.Breaker.Opened)
		assert.Equal(t, int64(1), rep.Breaker.Held)
	})
}

// TestBreakerPerKeyWorkerWaitingForAProbeTakesBackAnotherKeysItem checks that a worker
// waiting for a half-open key's probe to end (no timer: only the probe's end changes
// that key) takes back an item that another key's breaker holds meanwhile, once that
// key half-opens. Key c's first calls fail; its probe then waits for x, as does y, the
// item after x in one worker's run. x's failure opens its key, whose signal wakes the
// waiter; the key function lets x be held only once the waiter waits again, as it may
// with real schedules. (The hold did not wake the waiter: it waited for c's probe, a
// second at the most with the re-look that masked it.)
func TestBreakerPerKeyWorkerWaitingForAProbeTakesBackAnotherKeysItem(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const openFor = 100 * time.Millisecond
		busy := make(chan struct{}, 2) // v1's and v2's calls have begun
		probing := make(chan struct{}, 1)
		release := make(chan struct{})
		x := newDownOnce()
		xDone := x.done
		var probeAt time.Duration
		start := time.Now()
		call := func(ctx context.Context, v string) (string, error) {
			switch v {
			case "c1", "c2": // key c: down at first; its probe waits for x
				if time.Since(start) < openFor/2 {
					return "", pipeline.Transient(errDown)
				}
				select {
				case probing <- struct{}{}:
				default:
				}
				if err := awaitClose(ctx, xDone); err != nil {
					return "", err
				}
			case "v1", "v2": // the other two workers busy (and their runs no longer of one item)
				busy <- struct{}{}
				if err := awaitClose(ctx, release); err != nil {
					return "", err
				}
			case "x": // key a, down for its first call
				if err := x.call(ctx); err != nil {
					return "", err
				}
			case "y": // key b: waits for x
				if err := awaitClose(ctx, xDone); err != nil {
					return "", err
				}
			}
			return v, nil
		}
		p := pipeline.New()
		src := pipeline.Generate(p, func(ctx context.Context, emit func(string) error) error {
			for _, step := range []struct {
				v     string
				after <-chan struct{} // what to wait for once v is emitted
			}{{"c1", nil}, {"c2", probing}, {"v1", busy}, {"v2", busy}, {"x", nil}, {"y", nil}} {
				if err := emit(step.v); err != nil {
					return err
				}
				if step.after != nil {
					if err := awaitClose(ctx, step.after); err != nil {
						return err
					}
				}
			}
			probeAt = time.Since(start)
			close(release)
			return awaitClose(ctx, xDone) // the input stays open, with nothing more in it, until x is done
		})
		var xKeys atomic.Int64
		key := func(v string) string {
			if v == "x" && xKeys.Add(1) == 2 { // before x's attempt after its failure
				synctest.Wait()
			}
			return v[:1]
		}
		st := pipeline.NewStage("call", 3, call,
			pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: openFor}, pipeline.KeyBounds{}))
		got, err := pipeline.Collect(t.Context(), pipeline.Then(src, st))
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"c1", "c2", "v1", "v2", "x", "y"}, got)
		assert.Equal(t, int64(2), x.calls.Load())
		assert.Equal(t, openFor, probeAt, "c's probe began as it half-opened")
		// x's first call failed 10 ms after c's probe began; a waiting worker took it
		// back as its key half-opened, and its probe took 10 ms.
		assert.Equal(t, openFor+10*time.Millisecond+openFor+10*time.Millisecond, x.at)
	})
}

// TestBreakerPerKeyEventsNameTheirKey checks that the transitions of a breaker per key
// are events that name their key, and that WithLogger logs it: key a is down for 200
// ms, b is up; one worker, so a's probes come one after another.
func TestBreakerPerKeyEventsNameTheirKey(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		var mu sync.Mutex
		logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
		events := &eventLog{start: time.Now()}
		svc := newKeyService(200*time.Millisecond, "a")
		key := keyOf(2)
		p := pipeline.New(pipeline.WithObserver(events.observe), pipeline.WithLogger(logger))
		st := pipeline.NewStage("call", 1, svc.call(key),
			pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 100 * time.Millisecond}, pipeline.KeyBounds{}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(4)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		require.NoError(t, p.Run(t.Context()))
		// a opens at its first call, fails its probe at 110 ms, passes the next at 220 ms.
		assert.Equal(t, []pipeline.EventKind{
			pipeline.EventBreakerOpen, pipeline.EventBreakerHalfOpen, pipeline.EventBreakerOpen,
			pipeline.EventBreakerHalfOpen, pipeline.EventBreakerClosed,
		}, events.kinds(breakerKinds...))
		var keys []string
		for _, e := range events.events {
			if slices.Contains(breakerKinds, e.Kind) {
				keys = append(keys, e.Key)
			} else {
				assert.Empty(t, e.Key, e.Kind)
			}
		}
		assert.Equal(t, []string{"a", "a", "a", "a", "a"}, keys)
		mu.Lock()
		out := buf.String()
		mu.Unlock()
		for _, want := range []string{
			`level=WARN msg="pipeline: circuit breaker open" stage=call key=a error="connection refused"`,
			`level=INFO msg="pipeline: circuit breaker half-open" stage=call key=a`,
			`level=INFO msg="pipeline: circuit breaker closed" stage=call key=a`,
		} {
			assert.Contains(t, out, want)
		}
	})
}

// downOnce is the item x of the lost-wake-up tests: each call works 10 ms, the first
// fails (transient: its key's breaker opens), the second records when it came (since
// the test began, on the bubble's clock) and closes done.
type downOnce struct {
	start time.Time
	calls atomic.Int64
	at    time.Duration
	done  chan struct{}
}

func newDownOnce() *downOnce { return &downOnce{start: time.Now(), done: make(chan struct{})} }

func (d *downOnce) call(ctx context.Context) error {
	select {
	case <-time.After(10 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	if d.calls.Add(1) == 1 {
		return pipeline.Transient(errDown)
	}
	d.at = time.Since(d.start)
	close(d.done)
	return nil
}

// orderedCalls records the items whose calls succeeded, in the order they did.
type orderedCalls struct {
	mu   sync.Mutex
	done []string
}

func (o *orderedCalls) add(v string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = append(o.done, v)
}

func (o *orderedCalls) of(key string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, v := range o.done {
		if v[:1] == key {
			out = append(out, v)
		}
	}
	return out
}

// spend takes d of the bubble's time, or ends with ctx's error.
func spend(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestBreakerPerKeyHeldItemsGoBeforeNewOnes checks that while a key holds items, an
// item of that key that was not held (a new one, or the retry of one in a worker's
// hands) never begins ahead of them: it is held behind them, and the key's held items
// are taken back first, its first held item as the probe. An item's key is its first
// letter. (An item not held took the probe of a half-open key, or the first attempt of
// a key closed again, while the key's held items waited.)
func TestBreakerPerKeyHeldItemsGoBeforeNewOnes(t *testing.T) {
	t.Parallel()
	const openFor = 100 * time.Millisecond
	key := func(v string) string { return v[:1] }
	t.Run("half-open, a new item later in a worker's run", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			// One worker. w takes no time, so that the worker's next run is of
			// the three items queued meanwhile: a1 fails and opens a; b1 lasts
			// past a's OpenFor; then a2, new, finds a ready for its probe.
			started, emitted := make(chan struct{}), make(chan struct{})
			var calls orderedCalls
			var a1Failed atomic.Bool
			call := func(ctx context.Context, v string) (string, error) {
				switch v {
				case "w":
					close(started)
					if err := awaitClose(ctx, emitted); err != nil {
						return "", err
					}
				case "a1":
					if a1Failed.CompareAndSwap(false, true) {
						return "", pipeline.Transient(errDown)
					}
				case "b1":
					if err := spend(ctx, openFor+50*time.Millisecond); err != nil {
						return "", err
					}
				}
				calls.add(v)
				return v, nil
			}
			p := pipeline.New()
			src := pipeline.Generate(p, func(ctx context.Context, emit func(string) error) error {
				if err := emit("w"); err != nil {
					return err
				}
				if err := awaitClose(ctx, started); err != nil {
					return err
				}
				for _, v := range []string{"a1", "b1", "a2"} {
					if err := emit(v); err != nil {
						return err
					}
				}
				close(emitted)
				return nil
			})
			st := pipeline.NewStage("call", 1, call,
				pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: openFor}, pipeline.KeyBounds{}))
			pipeline.To(pipeline.Then(src, st), pipeline.NewSink("sink", 1, func(context.Context, string) error { return nil }))
			require.NoError(t, p.Run(t.Context()))
			rep := p.Report()
			checkReport(t, rep)
			assert.Equal(t, []string{"a1", "a2"}, calls.of("a"), "a1, held, is a's probe; a2 follows")
			assert.Equal(t, []string{"w", "b1", "a1", "a2"}, calls.done)
			call1 := row(t, rep, "call")
			assert.Equal(t, int64(4), call1.Succeeded)
			assert.Equal(t, int64(1), call1.Breaker.Opened)
			assert.Equal(t, int64(1), call1.Breaker.Held, "a1's failed attempt")
		})
	})
	t.Run("closed again, a held item left", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			p, calls := closedAgainWithAHeldItem(10 * time.Millisecond)
			require.NoError(t, p.Run(t.Context()))
			rep := p.Report()
			checkReport(t, rep)
			assert.Equal(t, []string{"a1", "a2", "a3"}, calls.of("a"), "a2, held, before a3, new")
			call1 := row(t, rep, "call")
			assert.Equal(t, int64(4), call1.Succeeded)
			assert.Equal(t, int64(1), call1.Breaker.Opened)
		})
	})
	t.Run("half-open, the retry of an item not held, two workers", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			// Two workers; a opens at its second failure. a2's first call
			// fails at 5 ms (a stays closed) and its retry waits 140 ms in its
			// worker's hands; a1 fails at 10 ms, opens a and is held; its
			// worker then takes b1, which lasts past a's OpenFor. a2's retry
			// comes as a half-opens, and neither worker has taken a1 back.
			var calls orderedCalls
			var a1Calls, a2Calls atomic.Int64
			call := func(ctx context.Context, v string) (string, error) {
				var err error
				switch v {
				case "a1":
					err = spend(ctx, 10*time.Millisecond)
					if err == nil && a1Calls.Add(1) == 1 {
						return "", pipeline.Transient(errDown)
					}
				case "a2":
					err = spend(ctx, 5*time.Millisecond)
					if err == nil && a2Calls.Add(1) == 1 {
						return "", pipeline.Transient(errDown)
					}
				case "b1":
					err = spend(ctx, 2*openFor)
				}
				if err != nil {
					return "", err
				}
				calls.add(v)
				return v, nil
			}
			p := pipeline.New()
			st := pipeline.NewStage("call", 2, call,
				pipeline.WithRetry(2, pipeline.ConstantBackoff(140*time.Millisecond)),
				pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 2, OpenFor: openFor}, pipeline.KeyBounds{}))
			pipeline.To(pipeline.Then(pipeline.FromSlice(p, []string{"a1", "a2", "b1"}), st),
				pipeline.NewSink("sink", 1, func(context.Context, string) error { return nil }))
			require.NoError(t, p.Run(t.Context()))
			rep := p.Report()
			checkReport(t, rep)
			assert.Equal(t, []string{"a1", "a2"}, calls.of("a"), "a1, held, is a's probe; a2 follows")
			call1 := row(t, rep, "call")
			assert.Equal(t, int64(3), call1.Succeeded)
			assert.Zero(t, call1.DeadLettered)
			assert.Equal(t, int64(2), a1Calls.Load())
			assert.Equal(t, int64(2), a2Calls.Load())
		})
	})
}

// closedAgainWithAHeldItem returns a pipeline of one worker whose key a closes again
// with an item held: each call takes 10 ms (a2's takes a2), so runs are of one item and
// one held item is taken back at a time. a1 fails and opens a (OpenFor 100 ms); a2 is
// held behind it; b1 lasts past a's OpenFor; a1's probe closes a, a2 still held; a3,
// new, comes next from the input. calls records the calls that succeeded.
func closedAgainWithAHeldItem(a2 time.Duration) (*pipeline.Pipeline, *orderedCalls) {
	const openFor = 100 * time.Millisecond
	calls := &orderedCalls{}
	var a1Failed atomic.Bool
	call := func(ctx context.Context, v string) (string, error) {
		d := 10 * time.Millisecond
		switch v {
		case "b1":
			d = openFor + 50*time.Millisecond
		case "a2":
			d = a2
		}
		if err := spend(ctx, d); err != nil {
			return "", err
		}
		if v == "a1" && a1Failed.CompareAndSwap(false, true) {
			return "", pipeline.Transient(errDown)
		}
		calls.add(v)
		return v, nil
	}
	p := pipeline.New()
	st := pipeline.NewStage("call", 1, call,
		pipeline.WithBreakerPerKey(func(v string) string { return v[:1] }, pipeline.Breaker{Failures: 1, OpenFor: openFor}, pipeline.KeyBounds{}))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, []string{"a1", "a2", "b1", "a3"}), st),
		pipeline.NewSink("sink", 1, func(context.Context, string) error { return nil }))
	return p, calls
}

// TestBreakerPerKeyCancelWithNewItemHeldBehindHeldOnes checks the accounting of a run
// stopped while a new item is held behind a key's held item: as in
// TestBreakerPerKeyHeldItemsGoBeforeNewOnes, a closes again with a2 held and a3 new;
// a2's call, taken back, lasts until the run stops. a2 is failed (in flight), a3 not
// started (held), and every item settled once.
func TestBreakerPerKeyCancelWithNewItemHeldBehindHeldOnes(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		p, calls := closedAgainWithAHeldItem(time.Hour) // a2's call lasts until the run stops
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		require.ErrorIs(t, p.Run(ctx), context.DeadlineExceeded)
		rep := p.Report()
		checkAccounting(t, rep)
		checkConservation(t, rep)
		assert.Equal(t, []string{"b1", "a1"}, calls.done)
		call1 := row(t, rep, "call")
		assert.Equal(t, int64(4), call1.In)
		assert.Equal(t, int64(2), call1.Succeeded)
		assert.Equal(t, int64(1), call1.Failed, "a2, stopped in its call")
		assert.Equal(t, int64(1), call1.NotStarted, "a3, held")
		assert.Equal(t, int64(1), call1.Breaker.Holding)
		assert.Equal(t, []pipeline.KeyBreakerReport{{Key: "a", State: pipeline.BreakerClosed, Holding: 1, Opened: 1}}, call1.Breaker.Keys)
	})
}

// FuzzBreakerPerKey checks that, whatever the items' keys, the failures of their calls,
// the workers and the moment the run stops, every item of a stage with a breaker per
// key settles exactly once: processed once or dead-lettered once (shed at its key's
// bound, or out of attempts), or, when the run stopped, failed or not started; the
// report's counts add up; nothing is held at the end of a run that ended by itself.
// With one worker, each key's items end (processed, or dead-lettered out of attempts)
// in the order they came: the items of a key that holds items are held behind them,
// also across a key's move from the shared breaker to one of its own. A run that ended
// by itself ends with every breaker closed: the item whose failure opened one was held
// by it (not by a state its key got meanwhile), and its probe closed it.
// plan[i] is item i: its key is plan[i]%3 (three keys, two with a breaker of their
// own, or one when bit 2 of workers is set), and bit j of plan[i]>>2 makes its call j
// fail with a transient error.
func FuzzBreakerPerKey(f *testing.F) {
	f.Add([]byte{0x04, 0x00, 0x0c, 0x01, 0x04, 0x02, 0x00, 0x00}, uint8(0), uint16(0))
	f.Add([]byte{0xfc, 0x04, 0x08, 0xfd, 0x00, 0x01, 0x04, 0x04, 0x04, 0x02}, uint8(1), uint16(0))
	f.Add([]byte{0x04, 0x04, 0x04, 0x04, 0x00, 0x00, 0x01, 0x05, 0x09}, uint8(3), uint16(45))
	f.Add([]byte{0x0c, 0x0c, 0x0c, 0x0c, 0x0c, 0x0c, 0x0c, 0x0c, 0x0c, 0x0c, 0x0c, 0x0c}, uint8(0), uint16(0))
	// One worker, one key state: a opens and holds a0; c's items (retried once each) and
	// b3 go to the shared breaker, which b3 opens; a0's probe closes a; b4 comes.
	f.Add([]byte{0x0c, 0x05, 0x05, 0x0d, 0x01}, uint8(4), uint16(0))
	f.Fuzz(func(t *testing.T, plan []byte, workers uint8, stopAt uint16) {
		plan = plan[:min(len(plan), 48)]
		synctest.Test(t, func(t *testing.T) {
			n := len(plan)
			key := func(i int) int { return int(plan[i] % 3) }
			var mu sync.Mutex
			calls := make([]int, n)
			done := make([]int, n)
			var ended []int // items processed, or dead-lettered out of attempts, in the order they were
			call := func(ctx context.Context, i int) (int, error) {
				mu.Lock()
				c := calls[i]
				calls[i]++
				mu.Unlock()
				if err := spend(ctx, time.Millisecond); err != nil {
					return 0, err
				}
				if c < 6 && plan[i]>>(2+c)&1 == 1 {
					return 0, pipeline.Transient(errDown)
				}
				mu.Lock()
				done[i]++
				ended = append(ended, i)
				mu.Unlock()
				return i, nil
			}
			dead := pipeline.NewDeadLetterBuffer[int](n + 1)
			p := pipeline.New()
			st := pipeline.NewStage("call", 1+int(workers%4), call,
				pipeline.WithRetry(3, pipeline.ConstantBackoff(5*time.Millisecond)),
				pipeline.WithDeadLetter(func(ctx context.Context, dl pipeline.DeadLetter[int]) error {
					if dl.ErrType != "*pipeline.BreakerFullError" { // shed at the bound: not in order
						mu.Lock()
						ended = append(ended, dl.Item)
						mu.Unlock()
					}
					return dead.Add(ctx, dl)
				}),
				pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 2, OpenFor: 20 * time.Millisecond}, pipeline.KeyBounds{Held: 4, Keys: 2 - int(workers>>2&1)}))
			pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
			ctx := t.Context()
			if stopAt > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(stopAt)*time.Millisecond)
				defer cancel()
			}
			err := p.Run(ctx)
			if stopAt == 0 {
				require.NoError(t, err)
			}
			rep := p.Report()
			checkReport(t, rep)
			cr := row(t, rep, "call")
			settled := make([]int, n)
			for i, d := range done {
				settled[i] += d
			}
			for _, d := range dead.Items() {
				settled[d.Item]++
			}
			for i, s := range settled {
				assert.LessOrEqualf(t, s, 1, "item %d processed or dead-lettered more than once", i)
				if err == nil {
					assert.Equalf(t, 1, s, "item %d: processed or dead-lettered once", i)
				}
			}
			assert.Equal(t, int64(n), cr.In)
			assert.Equal(t, int64(len(dead.Items())), cr.DeadLettered)
			if err == nil {
				assert.Zero(t, cr.Breaker.Holding, "nothing held at the end")
				assert.Zero(t, cr.NotStarted+cr.Failed)
				assert.Zerof(t, cr.Breaker.KeysOpen, "every breaker closed at the end: the item whose failure opened one is held by it, and its probe closes it (%+v)", cr.Breaker.Keys)
			}
			if workers%4 == 0 { // one worker
				last := map[int]int{}
				for _, i := range ended {
					if j, ok := last[key(i)]; ok {
						assert.Lessf(t, j, i, "key %d: item %d ended after item %d (ended: %v)", key(i), i, j, ended)
					}
					last[key(i)] = i
				}
			}
		})
	})
}

// TestBreakerPerKeyStopWithAHeldItemReadyEnds checks that a run stopped while an item
// is held, its key ready to let it through and the input ended, ends: a1 fails and is
// held, and b1's call, which does not heed its context, returns after the run has
// stopped and a's OpenFor has passed. The worker, with nothing to take and a1 held,
// looks again for held items to take back; it must see the stop. (It found a ready
// and looked again at once, for ever, taking nothing back once the run had stopped:
// the run never ended.)
func TestBreakerPerKeyStopWithAHeldItemReadyEnds(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		key := func(v string) string { return v[:1] }
		call := func(_ context.Context, v string) (string, error) {
			if v == "a1" {
				return "", pipeline.Transient(errDown)
			}
			<-time.After(100 * time.Millisecond) // past the stop, and past a's OpenFor
			return v, nil
		}
		p := pipeline.New()
		st := pipeline.NewStage("call", 1, call,
			pipeline.WithBreakerPerKey(key, pipeline.Breaker{Failures: 1, OpenFor: 10 * time.Millisecond}, pipeline.KeyBounds{}))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, []string{"a1", "b1"}), st),
			pipeline.NewSink("sink", 1, func(context.Context, string) error { return nil }))
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, p.Run(ctx), context.DeadlineExceeded)
		rep := p.Report()
		checkAccounting(t, rep)
		call1 := row(t, rep, "call")
		assert.Equal(t, int64(2), call1.In)
		assert.Equal(t, int64(1), call1.Breaker.Holding, "a1, held")
		assert.Equal(t, int64(1), call1.NotStarted-int64(call1.QueueLen), "a1, not started")
	})
}

// TestBreakerPerKeySharedBreakerKeepsItsKeysHeldItems checks a key whose items are held
// by the breaker that the keys past KeyBounds.Keys share, "(other keys)", when a state
// of its own becomes free: its items held there, or taken back from there, still go
// first, once the shared breaker lets them through (not before its OpenFor), and its
// new items wait behind them. Keys: 1, two workers; a1's call lasts 500 ms, so a has
// the one state; k1's first call fails and opens the shared breaker (OpenFor 1 s), k1
// (and k2) are held there; a1 ends, so a's state may go to another key; k3 comes
// later. (k got a state of its own and k3 began at once under it, ahead of k1 and k2,
// which waited for the shared breaker; or, k1 taken back as the shared breaker's probe,
// k3 began under it during the probe, and k1, whose probe failed, after k3.)
func TestBreakerPerKeySharedBreakerKeepsItsKeysHeldItems(t *testing.T) {
	t.Parallel()
	const openFor = time.Second
	for _, tc := range []struct {
		name    string
		held    []string      // k's items held by the shared breaker, k1 first
		probe   time.Duration // how long k1's second call (the shared breaker's probe) lasts
		k3      time.Duration // when k3 comes
		begun   []string      // k's calls, in the order they begin
		k1After time.Duration // k1's call that succeeds begins no earlier
		holding int64         // items held 50 ms after k3 came
	}{
		// k3 comes while k1 and k2 are held: it is held behind them.
		{
			name: "held", held: []string{"k1", "k2"}, probe: 10 * time.Millisecond, k3: 600 * time.Millisecond,
			begun: []string{"k1", "k1", "k2", "k3"}, k1After: openFor, holding: 3,
		},
		// k3 comes during k1's probe, which fails: k1 is held again, first.
		{
			name: "probe", held: []string{"k1"}, probe: 300 * time.Millisecond, k3: 1100 * time.Millisecond,
			begun: []string{"k1", "k1", "k1", "k3"}, k1After: 2*openFor + 300*time.Millisecond, holding: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				r := runSharedBreakerKey(t, openFor, tc.held, []timedItem{{"k3", tc.k3}}, tc.k3+50*time.Millisecond,
					func(n int) (time.Duration, bool) {
						d := 10 * time.Millisecond
						if n == 2 {
							d = tc.probe
						}
						return d, n == 1 || n == 2 && len(tc.held) == 1
					})
				assert.Equal(t, int64(len(tc.held)+2), r.call.Succeeded)
				assert.Equal(t, tc.begun, r.begun, "k's held items first, k1 as the probe")
				assert.GreaterOrEqual(t, r.at["k1"], tc.k1After, "k1 waits for the shared breaker")
				assert.GreaterOrEqual(t, r.at["k3"], r.at[tc.held[len(tc.held)-1]], "k3 after k's held items")
				require.NotNil(t, r.mid.Breaker)
				assert.Equal(t, []pipeline.KeyBreakerReport{{Key: "(other keys)", State: r.mid.Breaker.State, Holding: int(r.mid.Breaker.Holding), Opened: r.mid.Breaker.Opened}}, r.mid.Breaker.Keys,
					"k has no state of its own while its items are under the shared breaker")
				assert.Equal(t, tc.holding, r.mid.Breaker.Holding, "held 50 ms after k3 came")
			})
		})
	}
}

// TestBreakerPerKeySharedBreakerKeepsItsKeysAttemptInFlight checks a key with an attempt
// in flight under the breaker that the keys past KeyBounds.Keys share, "(other keys)",
// when a state of its own becomes free: the key keeps the shared breaker, so that the
// attempt's failure, which opens it, holds the item there; the key's later items wait
// behind it, and its probe, once OpenFor has passed, closes the shared breaker. Keys: 1,
// two workers; a1's call lasts 500 ms, so a has the one state; k1's first call lasts
// 1 s and fails; k2 comes at 600 ms (a's state free) and k3 at 1.1 s. (k got a state
// of its own at k2; k1's failure opened the shared breaker, but k1 went on at once
// under k's new state, held nowhere, and the shared breaker stayed open to the end,
// with no probe.)
func TestBreakerPerKeySharedBreakerKeepsItsKeysAttemptInFlight(t *testing.T) {
	t.Parallel()
	const openFor = time.Second
	synctest.Test(t, func(t *testing.T) {
		r := runSharedBreakerKey(t, openFor, []string{"k1"}, []timedItem{{"k2", 600 * time.Millisecond}, {"k3", 1100 * time.Millisecond}}, 1150*time.Millisecond,
			func(n int) (time.Duration, bool) {
				if n == 1 {
					return openFor, true
				}
				return 10 * time.Millisecond, false
			})
		assert.Equal(t, int64(4), r.call.Succeeded)
		assert.Equal(t, []string{"k1", "k2", "k1", "k3"}, r.begun)
		assert.GreaterOrEqual(t, r.at["k1"], 2*openFor, "k1, held by the shared breaker that its failure opened, waits for its OpenFor")
		assert.GreaterOrEqual(t, r.at["k3"], r.at["k1"], "k3 after k1, held")
		assert.Equal(t, int64(1), r.call.Breaker.Held, "k1's failed attempt")
		assert.Equal(t, pipeline.BreakerClosed, r.call.Breaker.State, "k1's probe closed the shared breaker")
		assert.Zero(t, r.call.Breaker.KeysOpen)
		require.NotNil(t, r.mid.Breaker)
		assert.Equal(t, []pipeline.KeyBreakerReport{{Key: "(other keys)", State: pipeline.BreakerOpen, Holding: 2, Opened: 1}}, r.mid.Breaker.Keys,
			"k1 and k3 held by the shared breaker; k has no state of its own")
	})
}

// timedItem is an item the source emits at a known time since the start.
type timedItem struct {
	v  string
	at time.Duration
}

// sharedBreakerKeyRun is what runSharedBreakerKey saw.
type sharedBreakerKeyRun struct {
	begun     []string                 // k's calls, in the order they began
	at        map[string]time.Duration // when each k item's call that succeeded began
	call, mid pipeline.StageReport     // the stage's row at the end, and at midAt
}

// runSharedBreakerKey runs, in the caller's synctest bubble, the scenario of the tests
// of a key under the breaker that the keys past KeyBounds.Keys share: Keys: 1 (the key
// is an item's first letter), two workers, Failures: 1 and openFor. The source emits
// a1, whose call lasts 500 ms, so a has the one state; once a1's call began, held (k's
// items, which the shared breaker will hold); once it ended, each later item at its
// time. k1Call(n) says how long k1's n-th call lasts and whether it fails (Transient);
// k's other calls last 10 ms and succeed. The run must succeed and its report pass
// checkReport.
func runSharedBreakerKey(t *testing.T, openFor time.Duration, held []string, later []timedItem, midAt time.Duration, k1Call func(n int) (time.Duration, bool)) sharedBreakerKeyRun {
	t.Helper()
	start := time.Now()
	a1Began, a1Done := make(chan struct{}), make(chan struct{})
	var (
		mu      sync.Mutex
		r       = sharedBreakerKeyRun{at: map[string]time.Duration{}}
		k1Calls int
	)
	call := func(ctx context.Context, v string) (string, error) {
		if v == "a1" {
			close(a1Began)
			defer close(a1Done)
			return v, spend(ctx, 500*time.Millisecond)
		}
		mu.Lock()
		r.begun = append(r.begun, v)
		began := time.Since(start)
		d, fail := 10*time.Millisecond, false
		if v == "k1" {
			k1Calls++
			d, fail = k1Call(k1Calls)
		}
		mu.Unlock()
		if err := spend(ctx, d); err != nil {
			return "", err
		}
		if fail {
			return "", pipeline.Transient(errDown)
		}
		mu.Lock()
		r.at[v] = began
		mu.Unlock()
		return v, nil
	}
	p := pipeline.New()
	src := pipeline.Generate(p, func(ctx context.Context, emit func(string) error) error {
		if err := emit("a1"); err != nil {
			return err
		}
		if err := awaitClose(ctx, a1Began); err != nil { // a has the state
			return err
		}
		for _, v := range held {
			if err := emit(v); err != nil {
				return err
			}
		}
		if err := awaitClose(ctx, a1Done); err != nil {
			return err
		}
		for _, e := range later {
			if err := spend(ctx, e.at-time.Since(start)); err != nil {
				return err
			}
			if err := emit(e.v); err != nil {
				return err
			}
		}
		return nil
	})
	st := pipeline.NewStage("call", 2, call,
		pipeline.WithBreakerPerKey(func(v string) string { return v[:1] }, pipeline.Breaker{Failures: 1, OpenFor: openFor}, pipeline.KeyBounds{Keys: 1}))
	midRun := snapshotAfter(p, midAt)
	pipeline.To(pipeline.Then(src, st), pipeline.NewSink("sink", 1, func(context.Context, string) error { return nil }))
	require.NoError(t, p.Run(t.Context()))
	rep := p.Report()
	checkReport(t, rep)
	r.call = row(t, rep, "call")
	r.mid = row(t, midRun(), "call")
	return r
}

// TestBreakerFatalTimeoutIsNotAFailure: an attempt that timed out and that the
// classifier makes fatal stops the run; the breaker does not count it (a timeout
// otherwise counts), so it neither opens nor holds the item, whether the attempt was
// an ordinary one or its half-open probe.
func TestBreakerFatalTimeoutIsNotAFailure(t *testing.T) {
	t.Parallel()
	for _, probe := range []bool{false, true} {
		t.Run(fmt.Sprint("probe=", probe), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int64
				p := pipeline.New()
				st := pipeline.NewStage("call", 1, func(ctx context.Context, v int) (int, error) {
					n := calls.Add(1)
					if probe && n == 1 {
						return 0, pipeline.Transient(errBoom) // opens it: the next attempt is the probe
					}
					<-ctx.Done() // times out
					return 0, ctx.Err()
				},
					pipeline.WithTimeout(10*time.Millisecond),
					pipeline.WithClassifier(func(err error) pipeline.Class {
						if errors.Is(err, pipeline.ErrTimeout) {
							return pipeline.ClassFatal
						}
						return pipeline.ClassTransient
					}),
					pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Second}))
				pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(3)), st), nopSink())
				err := runWithin(t, p, time.Minute) // counted, the fatal probe left the breaker waiting for it
				require.ErrorIs(t, err, pipeline.ErrTimeout)
				b := row(t, p.Report(), "call").Breaker
				require.NotNil(t, b)
				opened := int64(0)
				if probe {
					opened = 1 // by the transient failure, not again by the fatal probe
				}
				assert.Equal(t, opened, b.Opened, "times opened")
				if !probe {
					assert.Equal(t, pipeline.BreakerClosed, b.State)
				}
			})
		})
	}
}
