package pipeline

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestBreakerWaitSendsTheRunsOutputsFirst: a worker whose breaker opens just before an
// attempt (another stage's failure, after the worker last looked at it) sends the
// outputs of its run's earlier items on before it waits for the breaker, as before
// any wait (DESIGN.md §3): they waited with it until the breaker closed.
func TestBreakerWaitSendsTheRunsOutputsFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		testBeforeAllow = func(p *breakerHook) {
			if calls++; calls == 3 { // item 2, after item 1 in the same run
				p.b.record(false, true, errors.New("down"), &p.env)
			}
		}
		defer func() { testBeforeAllow = nil }()
		first := make(chan struct{})
		got := make(chan int, 3)
		p := New()
		s := Then(FromSlice(p, []int{0, 1, 2}), NewStage("call", 1, func(_ context.Context, v int) (int, error) {
			if v == 0 {
				<-first // items 1 and 2 queue meanwhile: the worker's next run takes both
			}
			return v, nil
		}, WithCircuitBreaker(Breaker{Failures: 1, OpenFor: time.Hour})))
		To(s, NewSink("out", 1, func(_ context.Context, v int) error { got <- v; return nil }))
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() { errc <- p.Run(ctx) }()
		synctest.Wait()
		close(first)
		synctest.Wait() // the worker waits for the breaker, item 2 in hand
		if calls != 3 {
			t.Fatalf("%d attempts asked the breaker, want 3", calls)
		}
		for want := range 2 {
			select {
			case v := <-got:
				if v != want {
					t.Fatalf("the sink got %d, want %d", v, want)
				}
			default:
				t.Fatalf("item %d's output waits with its worker for the breaker", want)
			}
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
		if rep := p.Report(); rep.Stages[1].Failed != 1 || rep.Stages[1].Succeeded != 2 {
			t.Fatalf("call: %+v, want 2 succeeded and 1 failed (in hand at the cancel)", rep.Stages[1])
		}
	})
}
