// Package hist holds the arithmetic of the root package's latency histogram: which
// bucket a duration falls in, each bucket's bounds, and the quantiles of a histogram's
// counts. The histogram itself (a worker's counters, one per bucket) and the report's
// Latency stay in the root package.
//
// The histogram is log-linear: 8 sub-buckets per power of two of nanoseconds, so a
// reported percentile is within 12.5 % of the true value, in fixed memory (about
// 2.6 KiB per worker), from 1 ns up to 2^40 ns (about 18 minutes; longer counts there).
package hist

import (
	"math/bits"
	"time"
)

const (
	subBits = 3
	sub     = 1 << subBits
	maxExp  = 40
	// Buckets is the number of buckets of a histogram.
	Buckets = (maxExp + 1) * sub
)

// BucketOf returns the bucket of a duration of ns nanoseconds.
func BucketOf(ns int64) int {
	if ns < sub {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 1 // ns in [2^e, 2^(e+1))
	if e >= maxExp {
		return Buckets - 1
	}
	s := int(ns>>(e-subBits)) & (sub - 1)
	return (e-subBits+1)*sub + s
}

// BucketUpper is the largest value of bucket i.
func BucketUpper(i int) int64 {
	if i < sub {
		return int64(i)
	}
	e := i/sub + subBits - 1
	s := int64(i % sub)
	return (int64(1)<<e | s<<(e-subBits)) + int64(1)<<(e-subBits) - 1
}

// Quantile returns quantile q of the bucket counts sum, whose total is count (not 0),
// none above maxv: the upper bound of the bucket that holds the value of rank q×count.
func Quantile(sum *[Buckets]int64, count int64, maxv time.Duration, q float64) time.Duration {
	rank := int64(q * float64(count))
	var c int64
	for j, n := range sum {
		c += n
		if c > rank {
			return min(time.Duration(BucketUpper(j)), maxv)
		}
	}
	return maxv
}
