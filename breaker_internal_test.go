package pipeline

import (
	"context"
	"errors"
	"slices"
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

// TestBreakerPerKeyParksUnderTheKeysStateNow pins where an item refused by its key's
// own state is held when that state is evicted before the item is parked: under the
// key's state then (here the shared one), where the key's later items go and are held
// behind it; never under the evicted state, whose slot is another key's by then. Keys:
// 1, three workers: k's state refuses k2 (worker 0) while k1's probe is in flight
// (worker 1); the probe closes it, j1 (worker 2) takes its slot, and then k2 parks.
func TestBreakerPerKeyParksUnderTheKeysStateNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := policyEnv{r: &run{p: New(), ctx: t.Context(), started: time.Now()}, row: &row{}, stage: "call", workers: 3}
		kb := newKeyBreakers(env, func(v string) string { return v[:1] }, Breaker{Failures: 1, OpenFor: time.Second}.normalized("test"), KeyBounds{Held: 4, Keys: 1})
		down := errors.New("down")
		tk, err := kb.beginAttempt(1, "k1", ticket{})
		if err != nil || !kb.endAttempt(1, tk, down, ClassTransient) {
			t.Fatalf("k1: %v, want admitted, then held as its failure opens k's breaker", err)
		}
		if _, err := kb.beginAttempt(1, "k1", ticket{}); !errors.Is(err, errHeld) {
			t.Fatalf("k1 again: %v, want errHeld", err)
		}
		if err := kb.park(1, "k1", 0, false); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // k's OpenFor
		_, _, probe, ok := kb.next(1)
		if !ok || !probe.probe {
			t.Fatalf("next: %v %+v, want k1 as k's probe", ok, probe)
		}
		if _, err := kb.beginAttempt(0, "k2", ticket{}); !errors.Is(err, errHeld) {
			t.Fatalf("k2: %v, want errHeld (k's probe in flight)", err)
		}
		kb.endAttempt(1, probe, nil, ClassItem) // k closes, holding nothing, none in flight
		kb.done(1)
		if _, err := kb.beginAttempt(2, "j1", ticket{}); err != nil { // j takes k's slot, and keeps it (in flight)
			t.Fatalf("j1: %v", err)
		}
		if err := kb.park(0, "k2", 1, false); err != nil {
			t.Fatal(err)
		}
		var s StageReport
		kb.fill(&s)
		if want := []KeyBreakerReport{{Key: "(other keys)", State: BreakerClosed, Holding: 1}}; !slices.Equal(s.Breaker.Keys, want) {
			t.Fatalf("keys %+v, want %+v", s.Breaker.Keys, want)
		}
		if _, err := kb.beginAttempt(1, "k3", ticket{}); !errors.Is(err, errHeld) {
			t.Fatalf("k3: %v, want errHeld (behind k2)", err)
		}
		if v, _, _, ok := kb.next(1); !ok || v != "k2" {
			t.Fatalf("next: %q %v, want k2", v, ok)
		}
	})
}
