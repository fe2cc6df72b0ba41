package hist

import "testing"

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
		ia, ib := BucketOf(a), BucketOf(b)
		if ia > ib {
			t.Fatalf("BucketOf(%d)=%d > BucketOf(%d)=%d", a, ia, b, ib)
		}
		up := BucketUpper(ia)
		if up < a || float64(up-a) > 0.125*float64(a)+1 {
			t.Fatalf("value %d in bucket %d with upper bound %d", a, ia, up)
		}
		if ia > 0 && BucketUpper(ia-1) >= a {
			t.Fatalf("value %d also fits the bucket below (%d)", a, BucketUpper(ia-1))
		}
	})
}
