package pipeline_test

// The examples of the options for stages that call a service (client.go): rate limits,
// Retry-After, the circuit breaker and adaptive workers. They sit in a file of their own
// until the branch is merged; they belong with the others in example_test.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/gopipeline/pipeline"
)

// This example shows WithRateLimit: one limiter of golang.org/x/time/rate paces the
// attempts of all the stage's workers (here 1,000 per second with bursts of 5, so the
// example is quick); the same limiter could be given to other stages too.
func ExampleWithRateLimit() {
	quota := rate.NewLimiter(1000, 5) // the API's quota: 1,000 requests/s, bursts of 5
	var calls atomic.Int64
	call := pipeline.NewStage("call-api", 8, func(_ context.Context, id int) (string, error) {
		calls.Add(1)
		return fmt.Sprintf("user-%d", id), nil
	}, pipeline.WithRateLimit(quota))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, ints(20)), call))
	fmt.Println(len(out), err, calls.Load())
	// Output: 20 <nil> 20
}

// countingLimiter is a Limiter of one's own: it lets everything through and counts.
type countingLimiter struct{ n atomic.Int64 }

func (l *countingLimiter) Wait(context.Context) error {
	l.n.Add(1)
	return nil
}

// This example shows a Limiter of one's own shared by two stages: anything with a
// Wait(ctx) error method fits (a limiter backed by a shared store could pace several
// processes); every attempt of either stage asks it first.
func ExampleLimiter() {
	lim := &countingLimiter{}
	p := pipeline.New()
	a := pipeline.Then(pipeline.FromSlice(p, ints(3)), pipeline.NewStage("a", 1, func(_ context.Context, v int) (int, error) {
		return v, nil
	}, pipeline.WithRateLimit(lim)))
	b := pipeline.Then(a, pipeline.NewStage("b", 1, func(_ context.Context, v int) (int, error) {
		return v, nil
	}, pipeline.WithRateLimit(lim)))
	_, err := pipeline.Collect(context.Background(), b)
	fmt.Println(err, lim.n.Load())
	// Output: <nil> 6
}

// This example shows WithRateLimitPerKey: each tenant has a quota of its own, so a busy
// tenant does not spend another's.
func ExampleWithRateLimitPerKey() {
	type request struct {
		Tenant string
		N      int
	}
	var mu sync.Mutex
	perTenant := map[string]int{}
	call := pipeline.NewSink("call", 4, func(_ context.Context, r request) error {
		mu.Lock()
		defer mu.Unlock()
		perTenant[r.Tenant]++
		return nil
	}, pipeline.WithRateLimitPerKey(func(r request) string { return r.Tenant }, 1000, 10))

	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []request{{"acme", 1}, {"acme", 2}, {"globex", 1}, {"acme", 3}}), call)
	fmt.Println(p.Run(context.Background()), perTenant)
	// Output: <nil> map[acme:3 globex:1]
}

// This example shows WithMaxTokenWait capping a hot tenant: each tenant has a quota of
// 1 call per hour with a burst of 2, and an item may wait at most 10 ms for its token.
// Acme's third and fourth items would wait far longer, so they are shed to the dead
// letters, and Globex's item behind them goes on at once.
func ExampleWithMaxTokenWait() {
	type request struct {
		Tenant string
		N      int
	}
	var mu sync.Mutex
	var done []string
	call := pipeline.NewSink("call", 1, func(_ context.Context, r request) error {
		mu.Lock()
		defer mu.Unlock()
		done = append(done, fmt.Sprint(r.Tenant, r.N))
		return nil
	}, pipeline.WithRateLimitPerKey(func(r request) string { return r.Tenant }, 1.0/3600, 2),
		pipeline.WithMaxTokenWait(10*time.Millisecond),
		pipeline.WithDeadLetter(func(_ context.Context, dl pipeline.DeadLetter[request]) error {
			fmt.Println("shed:", dl.Item.Tenant, dl.Item.N, dl.ErrType)
			return nil
		}))

	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []request{{"acme", 1}, {"acme", 2}, {"acme", 3}, {"acme", 4}, {"globex", 1}}), call)
	fmt.Println(p.Run(context.Background()), done)
	// Output:
	// shed: acme 3 *pipeline.ThrottledError
	// shed: acme 4 *pipeline.ThrottledError
	// <nil> [acme1 acme2 globex1]
}

// This example shows a *ThrottledError: a stage whose rate limit has no token within
// its WithMaxTokenWait, and no dead-letter destination, fails the run with it.
func ExampleThrottledError() {
	quota := rate.NewLimiter(rate.Every(time.Hour), 1) // one call, then one an hour
	call := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) { return v, nil },
		pipeline.WithRateLimit(quota), pipeline.WithMaxTokenWait(time.Second))
	p := pipeline.New()
	_, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{1, 2}), call))
	te, _ := errors.AsType[*pipeline.ThrottledError](err)
	fmt.Println(errors.Is(err, pipeline.ErrThrottled), te.Stage, te.MaxWait)
	// Output: true call 1s
}

// This example shows RetryAfter: a 429 response says how long to wait, and the retry
// waits at least that long, even though the backoff alone would retry at once.
func ExampleRetryAfter() {
	var at []time.Time
	call := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
		at = append(at, time.Now())
		if len(at) == 1 {
			return 0, pipeline.RetryAfter(errors.New("429 too many requests"), 20*time.Millisecond)
		}
		return v, nil
	}, pipeline.WithRetry(3, pipeline.ConstantBackoff(0)))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{7}), call))
	fmt.Println(out, err, len(at), at[1].Sub(at[0]) >= 20*time.Millisecond)
	// Output: [7] <nil> 2 true
}

// This example shows WithRetryAfterCap: a quota's "Retry-After: 3600" is past the
// stage's cap of a minute, so the item is not waited for but set aside at once, and the
// dead letter names why; the next item goes on.
func ExampleWithRetryAfterCap() {
	call := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
		if v == 1 {
			return 0, pipeline.RetryAfter(errors.New("429 daily quota used up"), 3600*time.Second)
		}
		return v, nil
	}, pipeline.WithRetry(3, nil), pipeline.WithRetryAfterCap(time.Minute),
		pipeline.WithDeadLetter(func(_ context.Context, dl pipeline.DeadLetter[int]) error {
			fmt.Println("set aside:", dl.Item, dl.ErrType)
			return nil
		}))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{1, 2}), call))
	fmt.Println(out, err)
	// Output:
	// set aside: 1 *pipeline.RetryAfterError
	// [2] <nil>
}

// This example shows a *RetryAfterError: a stage without a dead-letter destination
// fails the run with it, and it gives the delay asked for and the cap.
func ExampleRetryAfterError() {
	call := pipeline.NewStage("call", 1, func(context.Context, int) (int, error) {
		return 0, pipeline.RetryAfter(errors.New("503 maintenance"), 2*time.Hour)
	}, pipeline.WithRetry(3, nil))

	p := pipeline.New()
	_, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{1}), call))
	rae, _ := errors.AsType[*pipeline.RetryAfterError](err)
	fmt.Println(errors.Is(err, pipeline.ErrRetryAfterTooLong), rae.Stage, rae.Delay, rae.Cap)
	// Output: true call 2h0m0s 10m0s
}

// This example shows ParseRetryAfter reading both forms of an HTTP Retry-After header.
func ExampleParseRetryAfter() {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, h := range []string{"30", "Tue, 01 Dec 2026 12:02:00 GMT", "soon"} {
		d, ok := pipeline.ParseRetryAfter(h, now)
		fmt.Println(d, ok)
	}
	// Output:
	// 30s true
	// 2m0s true
	// 0s false
}

// This example shows WithCircuitBreaker: the service fails its first calls (it is
// down); after 2 failures in a row the breaker opens, the stage waits instead of
// burning the items' retries, and probes the service every 5 ms until it answers. No
// item is dead-lettered, and the report says how often the breaker opened.
func ExampleWithCircuitBreaker() {
	var calls atomic.Int64
	service := func(_ context.Context, v int) (int, error) {
		if calls.Add(1) <= 3 { // down for its first 3 calls
			return 0, pipeline.Transient(errors.New("503 service unavailable"))
		}
		return v, nil
	}
	dead := pipeline.NewDeadLetterBuffer[int](10)
	var mu sync.Mutex
	var events []string
	p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
		if e.Kind >= pipeline.EventBreakerOpen && e.Kind <= pipeline.EventBreakerClosed {
			mu.Lock()
			events = append(events, e.Kind.String())
			mu.Unlock()
		}
	}))
	call := pipeline.NewStage("call", 1, service,
		pipeline.WithRetry(2, nil), pipeline.WithDeadLetter(dead.Add),
		pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 2, OpenFor: 5 * time.Millisecond}))
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, ints(4)), call))
	s, _ := p.Report().Stage("call")
	fmt.Println(len(out), err, "dead-lettered:", len(dead.Items()))
	fmt.Println("opened:", s.Breaker.Opened, "held:", s.Breaker.Held, "now:", s.Breaker.State)
	fmt.Println(events)
	// Output:
	// 4 <nil> dead-lettered: 0
	// opened: 2 held: 2 now: closed
	// [breaker-open breaker-half-open breaker-open breaker-half-open breaker-closed]
}

// This example shows a Breaker's MaxOpen: a service that stays down for longer fails
// the run with a *BreakerError, rather than keep the items waiting forever.
func ExampleBreakerError() {
	call := pipeline.NewStage("call", 2, func(context.Context, int) (int, error) {
		return 0, pipeline.Transient(errors.New("connection refused"))
	}, pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Millisecond, MaxOpen: 20 * time.Millisecond}))
	p := pipeline.New()
	_, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, ints(5)), call))
	be, _ := errors.AsType[*pipeline.BreakerError](err)
	fmt.Println(errors.Is(err, pipeline.ErrBreakerOpen), be.Stage, be.MaxOpen)
	// Output: true call 20ms
}

// This example shows the states of a breaker and how a report gives them.
func ExampleBreakerState() {
	for _, s := range []pipeline.BreakerState{pipeline.BreakerClosed, pipeline.BreakerOpen, pipeline.BreakerHalfOpen} {
		fmt.Println(s)
	}
	// Output:
	// closed
	// open
	// half-open
}

// This example shows the Breaker of a stage that calls a database: open when half the
// attempts of the last 10 s failed (with at least 20 of them), probe after 2 s with 3
// probes, and give up once it has been open for 5 minutes in all over the last 15
// (in one spell or several); and the transitions its report lists.
func ExampleBreaker() {
	b := pipeline.Breaker{
		FailureRatio: 0.5, MinSample: 20, Window: 10 * time.Second,
		OpenFor: 2 * time.Second, HalfOpenProbes: 3, MaxOpen: 5 * time.Minute, MaxOpenWindow: 15 * time.Minute,
	}
	st := pipeline.NewSink("save", 4, func(context.Context, int) error { return nil }, pipeline.WithCircuitBreaker(b))
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, ints(100)), st)
	fmt.Println(p.Run(context.Background()))
	s, _ := p.Report().Stage("save")
	rep := *s.Breaker // a pipeline.BreakerReport; nil for a stage without a breaker
	fmt.Println(rep.State, rep.Opened, rep.TimeOpen, len(rep.Transitions))
	// Output:
	// <nil>
	// closed 0 0s 0
}

// This example shows Breaker.Counts: an HTTP 429 says the service is up and pacing
// its clients, so it should not open the breaker; its Retry-After paces the retry.
// Here a 429 and a 503 each fail one item once: only the 503 opens the breaker.
func ExampleBreaker_counts() {
	errTooMany := errors.New("429 too many requests")
	b := pipeline.Breaker{
		Failures: 1, OpenFor: 10 * time.Millisecond,
		Counts: func(err error, class pipeline.Class) bool {
			return class == pipeline.ClassTransient && !errors.Is(err, errTooMany)
		},
	}
	var calls atomic.Int64
	call := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
		switch calls.Add(1) {
		case 1:
			return 0, pipeline.RetryAfter(errTooMany, time.Millisecond)
		case 3:
			return 0, pipeline.Transient(errors.New("503 service unavailable"))
		}
		return v, nil
	}, pipeline.WithRetry(2, nil), pipeline.WithCircuitBreaker(b))
	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{1, 2}), call))
	s, _ := p.Report().Stage("call")
	fmt.Println(out, err, "opened:", s.Breaker.Opened)
	// Output: [1 2] <nil> opened: 1
}

// This example shows NewCircuitBreaker and WithSharedBreaker: two pipelines call one
// service through one breaker. The first one finds the service down: the breaker opens,
// and an observer gives the run up at once. The service is back, but the breaker is
// still open when the second pipeline runs: its stage waits for the end of OpenFor
// rather than call the service at once, and its first call is the probe that closes
// the breaker.
func ExampleNewCircuitBreaker() {
	cb := pipeline.NewCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: 50 * time.Millisecond})
	var down atomic.Bool
	down.Store(true)
	var calls atomic.Int64
	service := func(_ context.Context, v int) (int, error) {
		calls.Add(1)
		if down.Load() {
			return 0, pipeline.Transient(errors.New("503 service unavailable"))
		}
		return v, nil
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p1 := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
		if e.Kind == pipeline.EventBreakerOpen {
			cancel() // give up the run once the breaker opened
		}
	}))
	_, err := pipeline.Collect(ctx, pipeline.Then(pipeline.FromSlice(p1, []int{1}),
		pipeline.NewStage("orders", 1, service, pipeline.WithSharedBreaker(cb))))
	fmt.Println(err, cb.State(), calls.Load())

	down.Store(false)
	p2 := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p2, []int{2}),
		pipeline.NewStage("refunds", 1, service, pipeline.WithSharedBreaker(cb))))
	s, _ := p2.Report().Stage("refunds")
	fmt.Println(out, err, cb.State(), calls.Load(), s.Breaker.Opened)
	// Output:
	// context canceled open 1
	// [2] <nil> closed 2 1
}

// This example shows CircuitBreaker.State: a shared breaker starts closed.
func ExampleCircuitBreaker_State() {
	cb := pipeline.NewCircuitBreaker(pipeline.Breaker{Failures: 5})
	fmt.Println(cb.State())
	// Output: closed
}

// This example shows WithSharedBreaker: the stages that write to one database, in two
// pipelines, share its breaker, so that its outage opens it once for both.
func ExampleWithSharedBreaker() {
	db := pipeline.NewCircuitBreaker(pipeline.Breaker{FailureRatio: 0.5, OpenFor: time.Second})
	save := func(context.Context, int) error { return nil }
	p1, p2 := pipeline.New(), pipeline.New()
	pipeline.To(pipeline.FromSlice(p1, ints(10)), pipeline.NewSink("save-orders", 2, save, pipeline.WithSharedBreaker(db)))
	pipeline.To(pipeline.FromSlice(p2, ints(10)), pipeline.NewSink("save-refunds", 2, save, pipeline.WithSharedBreaker(db)))
	fmt.Println(p1.Run(context.Background()), p2.Run(context.Background()), db.State())
	// Output: <nil> <nil> closed
}

// This example shows a breaker transition as a log line of WithLogger.
func ExampleBreakerTransition() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // no wall-clock time in the output
			}
			return a
		},
	}))
	var calls atomic.Int64
	p := pipeline.New(pipeline.WithLogger(logger))
	call := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
		if calls.Add(1) == 1 {
			return 0, pipeline.Transient(errors.New("connection reset"))
		}
		return v, nil
	}, pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Millisecond}))
	_, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{1}), call))
	s, _ := p.Report().Stage("call")
	fmt.Println(err)
	for _, tr := range s.Breaker.Transitions {
		fmt.Println(tr.To)
	}
	// Output:
	// level=WARN msg="pipeline: circuit breaker open" stage=call error="connection reset"
	// level=INFO msg="pipeline: circuit breaker half-open" stage=call
	// level=INFO msg="pipeline: circuit breaker closed" stage=call
	// level=INFO msg="pipeline: stage done" stage=call
	// <nil>
	// open
	// half-open
	// closed
}

// This example shows WithAdaptiveWorkers: a stage of at most 16 workers calls a
// service that serves 4 calls at once and queues the rest. The limit starts at 1 and
// grows while the latency stays flat; the report gives the limit and its changes.
func ExampleWithAdaptiveWorkers() {
	slots := make(chan struct{}, 4)
	service := func(ctx context.Context, v int) (int, error) {
		slots <- struct{}{}
		defer func() { <-slots }()
		time.Sleep(time.Millisecond)
		return v, nil
	}
	p := pipeline.New()
	call := pipeline.NewStage("call", 16, service, pipeline.WithAdaptiveWorkers(1))
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, ints(300)), call))
	s, _ := p.Report().Stage("call")
	fmt.Println(len(out), err, s.Workers)
	fmt.Println("grew from 1:", len(s.LimitHistory) > 0 && s.LimitHistory[0].Reason == "grow" && s.LimitHistory[0].Limit == 2)
	// Output:
	// 300 <nil> 16
	// grew from 1: true
}

// This example shows LimitChange records as a report lists them.
func ExampleLimitChange() {
	history := []pipeline.LimitChange{
		{At: 160 * time.Millisecond, Limit: 2, Reason: "grow"},
		{At: 600 * time.Millisecond, Limit: 9, Reason: "grow"},
		{At: 670 * time.Millisecond, Limit: 8, Reason: "latency"},
	}
	for _, c := range history {
		fmt.Printf("%v: %d (%s)\n", c.At, c.Limit, c.Reason)
	}
	// Output:
	// 160ms: 2 (grow)
	// 600ms: 9 (grow)
	// 670ms: 8 (latency)
}

// This example shows WithBreakerPerKey: a service of two shards, "us" down for its
// first three calls. Its breaker opens at the first failure and holds the shard's
// items, while the one worker goes on with the "eu" items; the probes every 50 ms fail
// twice, then one succeeds, the breaker closes, and the held items follow.
func ExampleWithBreakerPerKey() {
	var usCalls atomic.Int64
	shard := func(v int) string { return [...]string{"eu", "us"}[v%2] }
	service := func(_ context.Context, v int) (int, error) {
		if shard(v) == "us" && usCalls.Add(1) <= 3 {
			return 0, pipeline.Transient(errors.New("503 service unavailable"))
		}
		return v, nil
	}
	p := pipeline.New()
	call := pipeline.NewStage("call", 1, service,
		pipeline.WithBreakerPerKey(shard, pipeline.Breaker{Failures: 1, OpenFor: 50 * time.Millisecond}, pipeline.KeyBounds{Held: 100}))
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, ints(6)), call))
	s, _ := p.Report().Stage("call")
	fmt.Println(out, err)
	fmt.Println("opened:", s.Breaker.Opened, "attempts held:", s.Breaker.Held, "held now:", s.Breaker.Holding, "dead-lettered:", s.DeadLettered)
	// Output:
	// [0 2 4 1 3 5] <nil>
	// opened: 3 attempts held: 3 held now: 0 dead-lettered: 0
}

// This example shows KeyBounds: a key's breaker holds at most Held items, and the items
// of that key past them are shed to the dead-letter destination with a
// *BreakerFullError, here the last three of key "a".
func ExampleKeyBounds() {
	var calls atomic.Int64
	service := func(_ context.Context, v int) (int, error) {
		if calls.Add(1) == 1 { // down for its first call
			return 0, pipeline.Transient(errors.New("503 service unavailable"))
		}
		return v, nil
	}
	dead := pipeline.NewDeadLetterBuffer[int](10)
	p := pipeline.New()
	call := pipeline.NewStage("call", 1, service, pipeline.WithDeadLetter(dead.Add),
		pipeline.WithBreakerPerKey(func(int) string { return "a" }, pipeline.Breaker{Failures: 1, OpenFor: 20 * time.Millisecond}, pipeline.KeyBounds{Held: 2}))
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, ints(5)), call))
	fmt.Println(out, err)
	for _, d := range dead.Items() {
		fmt.Println(d.Item, d.ErrType, d.Attempts)
	}
	// Output:
	// [0 1] <nil>
	// 2 *pipeline.BreakerFullError 0
	// 3 *pipeline.BreakerFullError 0
	// 4 *pipeline.BreakerFullError 0
}

// This example shows the error of an item shed at its key's bound, and how to match it.
func ExampleBreakerFullError() {
	var err error = &pipeline.BreakerFullError{Stage: "call", Key: "us", Held: 1024}
	fmt.Println(errors.Is(err, pipeline.ErrBreakerFull))
	fmt.Println(err)
	// Output:
	// true
	// pipeline: stage "call": the circuit breaker of key us holds 1024 items, its bound: shed
}

// This example shows KeyBreakerReport: a Snapshot taken while key "us" is held lists
// its breaker, open, and the item it holds (here from the call of the next item, of
// key "eu").
func ExampleKeyBreakerReport() {
	var usCalls atomic.Int64
	shard := func(v int) string { return [...]string{"us", "eu"}[v%2] }
	var p *pipeline.Pipeline
	service := func(_ context.Context, v int) (int, error) {
		switch {
		case shard(v) == "us" && usCalls.Add(1) == 1:
			return 0, pipeline.Transient(errors.New("503 service unavailable"))
		case v == 1:
			s, _ := p.Snapshot().Stage("call")
			fmt.Printf("%+v\n", s.Breaker.Keys)
		}
		return v, nil
	}
	p = pipeline.New()
	call := pipeline.NewStage("call", 1, service,
		pipeline.WithBreakerPerKey(shard, pipeline.Breaker{Failures: 1, OpenFor: 10 * time.Millisecond}, pipeline.KeyBounds{}))
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, ints(2)), call))
	fmt.Println(out, err)
	// Output:
	// [{Key:us State:open Holding:1 Opened:1}]
	// [1 0] <nil>
}
