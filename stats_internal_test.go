package pipeline

import (
	"math/rand/v2"
	"testing"
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
