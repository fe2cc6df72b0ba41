package pipeline

import (
	"math/rand/v2"
	"testing"
	"time"
)

// FuzzHistogramBucket checks the histogram's buckets: every value falls in a bucket
// whose upper bound is at least the value and at most 12.5 % above it, and buckets are
// ordered like their values.
func FuzzHistogramBucket(f *testing.F) {
	for _, v := range []int64{0, 1, 7, 8, 9, 15, 16, 1000, 1 << 20, 1<<40 - 1} {
		f.Add(v, v+1)
	}
	f.Fuzz(func(t *testing.T, a, b int64) {
		a, b = max(a, 0)%(1<<40), max(b, 0)%(1<<40)
		if a > b {
			a, b = b, a
		}
		ia, ib := bucketOf(a), bucketOf(b)
		if ia > ib {
			t.Fatalf("bucketOf(%d)=%d > bucketOf(%d)=%d", a, ia, b, ib)
		}
		up := bucketUpper(ia)
		if up < a || float64(up-a) > 0.125*float64(a)+1 {
			t.Fatalf("value %d in bucket %d with upper bound %d", a, ia, up)
		}
		if ia > 0 && bucketUpper(ia-1) >= a {
			t.Fatalf("value %d also fits the bucket below (%d)", a, bucketUpper(ia-1))
		}
	})
}

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
