// Command outage shows a stage being a good client of a service that has a quota, a
// concurrency knee and an outage, with the options of issue 13 at work:
//
//	source   n item numbers
//	call     up to 32 workers (WithAdaptiveWorkers from 2) call a simulated service
//	         that serves 8 calls at once in 2 ms each and queues the rest, allows
//	         2,000 requests/s (WithRateLimit) and is down (every call fails with a
//	         transient error) for -down, starting a second into the run; a circuit
//	         breaker (WithCircuitBreaker) holds the items while it is down, and
//	         retries (WithRetry) carry the first items of the outage until the
//	         breaker opens (see below)
//	sink     counts what arrives
//
// While it runs it prints Snapshot().Line() every 250 ms (the breaker's state and the
// adaptive limit included) and serves the live web view (package dashboard) on
// loopback, where the breaker's state, the adaptive limit and the time spent waiting
// for the rate limit show on the stage and in the charts; at the end, the report: no
// item dead-lettered, the time the breaker spent open, the limit's last changes.
// Nothing goes beyond loopback.
//
// Why 8 attempts for a breaker that opens at 5 failures in a row: until the breaker
// opens, the items of the outage's first milliseconds spend their own attempts, and a
// call begun just before the outage that succeeds just after it starts the count of
// failures in a row again. With 3 attempts (5, then 10 ms apart), an item could spend
// them all in those 15 ms while the adaptive limit let only a few workers call, and
// be dead-lettered: 3 runs in 18 with 6 of them at once on one CPU did (GOMAXPROCS=1).
// With 8 attempts, spread over 355 ms, each item outlasts the calls in flight when the
// outage began and sees the breaker open, and its attempts stop counting.
//
//	go run ./examples/outage -n 6000 -down 2s
//	go run ./examples/outage -n 20000 -down 5s -wait   then open the address it prints
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/dashboard"
)

var errDown = errors.New("503 service unavailable")

// service is a simulated dependency: 8 slots of 2 ms, down in [downFrom, downTo).
type service struct {
	start            time.Time
	downFrom, downTo time.Duration
	slots            chan struct{}
}

func (s *service) call(ctx context.Context, v int) (int, error) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-s.slots }()
	if at := time.Since(s.start); at >= s.downFrom && at < s.downTo {
		return 0, pipeline.Transient(errDown)
	}
	select {
	case <-time.After(2 * time.Millisecond):
		return v, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func main() {
	n := flag.Int("n", 6000, "items")
	down := flag.Duration("down", 2*time.Second, "how long the service is down")
	verbose := flag.Bool("v", false, "log every event (limit changes included)")
	web := flag.String("web", "127.0.0.1:0", `address of the live web view ("" for none)`)
	wait := flag.Bool("wait", false, "after the run, keep serving the web view until interrupted")
	flag.Parse()

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	svc := &service{start: time.Now(), downFrom: time.Second, downTo: time.Second + *down, slots: make(chan struct{}, 8)}
	dead := pipeline.NewDeadLetterBuffer[int](*n)
	var got atomic.Int64

	p := pipeline.New(pipeline.WithLogger(logger))
	items := make([]int, *n)
	for i := range items {
		items[i] = i
	}
	call := pipeline.NewStage("call", 32, svc.call,
		pipeline.WithRateLimit(rate.NewLimiter(2000, 20)),
		pipeline.WithAdaptiveWorkers(2),
		pipeline.WithRetry(8, pipeline.ExponentialBackoff(5*time.Millisecond, 100*time.Millisecond)), // more than Failures: see above
		pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 5, OpenFor: 250 * time.Millisecond, MaxOpen: time.Minute}),
		pipeline.WithDeadLetter(dead.Add))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, items), call), pipeline.NewSink("sink", 1, func(context.Context, int) error {
		got.Add(1)
		return nil
	}))

	if *web != "" {
		stopWeb, err := serveDashboard(*web, p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "outage:", err)
			os.Exit(2)
		}
		defer stopWeb()
	}

	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var err error
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-tick.C:
			fmt.Fprintln(os.Stderr, p.Snapshot().Line())
		}
	}
	rep := p.Report()
	fmt.Print(rep)
	fmt.Printf("delivered %d of %d, dead-lettered %d\n", got.Load(), *n, len(dead.Items()))
	if s, ok := rep.Stage("call"); ok {
		h := s.LimitHistory
		fmt.Printf("adaptive limit now %d; last changes: %v\n", s.Limit, h[max(0, len(h)-5):])
	}
	if *wait && *web != "" {
		fmt.Fprintln(os.Stderr, "outage: the run has ended; the web view stays up until interrupted (Ctrl-C)")
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		<-ctx.Done()
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// serveDashboard serves the live web view of p at addr and prints its address; the
// function it returns stops the server.
func serveDashboard(addr string, p *pipeline.Pipeline) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-web %s: %w", addr, err)
	}
	h := dashboard.New(dashboard.WithInterval(250 * time.Millisecond))
	h.Add("outage", p)
	mux := http.NewServeMux()
	mux.Handle("/debug/pipeline/", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	srv.RegisterOnShutdown(h.Close)
	go func() { _ = srv.Serve(ln) }()
	fmt.Fprintf(os.Stderr, "outage: live view at http://%s/debug/pipeline/\n", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
