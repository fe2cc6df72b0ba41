package pipeline

import (
	"context"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"
)

func TestLatencyPercentiles(t *testing.T) {
	t.Parallel()
	ws := make([]workerStats, 3)
	rng := rand.New(rand.NewPCG(3, 4))
	// 1000 durations: 1..1000 µs, spread over the workers in random order.
	for _, i := range rng.Perm(1000) {
		ws[i%3].lat.record(time.Duration(i+1) * time.Microsecond)
	}
	l := latencyOf(ws)
	if l.Count != 1000 || l.Max != 1000*time.Microsecond {
		t.Fatalf("count %d max %v", l.Count, l.Max)
	}
	for _, c := range []struct {
		got  time.Duration
		want time.Duration
	}{{l.P50, 500 * time.Microsecond}, {l.P90, 900 * time.Microsecond}, {l.P99, 990 * time.Microsecond}} {
		if c.got < c.want || float64(c.got) > 1.125*float64(c.want) {
			t.Errorf("percentile %v, want within 12.5 %% above %v", c.got, c.want)
		}
	}
}

// TestSnapshotOfAnEndedRunKeepsTheNextRunsSamples takes a Snapshot of a run that has
// ended while the next run has begun and sampled (a Snapshot that read the run in
// progress just before it ended): the next run's rate and latency samples stay. They
// were dropped, so the next run's rates and Recent started over.
func TestSnapshotOfAnEndedRunKeepsTheNextRunsSamples(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		p := New()
		To(FromSlice(p, []int{1, 2, 3}), NewSink("hold", 1, func(ctx context.Context, v int) error {
			if v == 3 {
				select {
				case <-gate:
				case <-ctx.Done():
				}
			}
			return nil
		}))
		start := func() (*run, <-chan error) {
			errc := make(chan error, 1)
			go func() { errc <- p.Run(t.Context()) }()
			synctest.Wait() // the sink waits at item 3
			return p.cur.Load(), errc
		}
		first, errc := start()
		gate <- struct{}{}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		second, errc := start()
		for range 3 {
			time.Sleep(time.Second)
			p.snapshot(second)
		}
		p.mu.Lock()
		samples, recent := len(p.samples), len(p.recent)
		p.mu.Unlock()
		rep := p.snapshot(first) // read while first was running
		if !rep.Running || rep.Stages[len(rep.Stages)-1].Out != 3 {
			t.Errorf("the first run's snapshot: %+v", rep)
		}
		p.mu.Lock()
		if len(p.samples) != samples || p.samples[0].run != second || p.recentRun != second || len(p.recent) != recent {
			t.Errorf("the second run's samples: %d of run %p, %d latency samples of run %p; want %d of %p, %d of %p",
				len(p.samples), p.samples[0].run, len(p.recent), p.recentRun, samples, second, recent, second)
		}
		p.mu.Unlock()
		gate <- struct{}{}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	})
}
