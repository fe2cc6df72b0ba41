package pipeline

import (
	"cmp"
	"fmt"
	"math"
	"time"
)

// inputTimes is a window worker's watermark per input ([WithWatermarkPer]): the
// greatest event time of each input's items, and the least of those over the inputs
// not left out as idle. It belongs to the worker's goroutine.
type inputTimes[T any] struct {
	input   func(T) int
	stage   string
	max     []int64     // per input: the greatest event time of its items; MinInt64 before the first
	out     []bool      // per input: left out of the least, idle (WithIdleTimeout)
	seen    []time.Time // per input: the run in which its last item arrived (WithIdleTimeout)
	touched []bool      // per input: an item of it arrived in the run in hand
	runAt   time.Time   // when the run in hand was taken
	least   int64       // the least of max over the inputs not out (MinInt64 while one has no item)
}

func newInputTimes[T any](n int, input func(T) int, stage string) *inputTimes[T] {
	it := &inputTimes[T]{
		input: input, stage: stage, max: make([]int64, n), out: make([]bool, n),
		seen: make([]time.Time, n), touched: make([]bool, n), least: math.MinInt64,
	}
	for i := range it.max {
		it.max[i] = math.MinInt64
	}
	return it
}

// see records an item v of event time t, and returns the watermark it leaves: the
// least over the inputs, less delay (MinInt64 while an input has sent nothing).
func (it *inputTimes[T]) see(v T, t, delay int64) int64 {
	i := it.input(v)
	if uint(i) >= uint(len(it.max)) {
		panic(fmt.Sprintf("pipeline: Window %q: WithWatermarkPer's function gave input %d for an item, outside [0, %d)", it.stage, i, len(it.max)))
	}
	it.touched[i] = true
	switch {
	case it.out[i]: // idle until now: back in the least
		it.out[i] = false
		it.max[i] = max(it.max[i], t)
		it.least = it.leastNow()
	case t > it.max[i]:
		was := it.max[i]
		it.max[i] = t
		if was == it.least {
			it.least = it.leastNow()
		}
	}
	if it.least == math.MinInt64 {
		return math.MinInt64
	}
	return it.least - delay
}

// leastNow is the least of max over the inputs not left out.
func (it *inputTimes[T]) leastNow() int64 {
	least := int64(math.MaxInt64)
	for i, m := range it.max {
		if !it.out[i] {
			least = min(least, m)
		}
	}
	return least
}

// idle is called as a run is taken, at now, with the stage's idle timeout d: an input
// none of whose items arrived for d is left out of the least until its next item.
func (it *inputTimes[T]) idle(now time.Time, d time.Duration) {
	changed := false
	for i := range it.max {
		switch {
		case it.touched[i] || it.seen[i].IsZero(): // an item in the last run, or the first run
			it.touched[i] = false
			it.seen[i] = cmp.Or(it.runAt, now) // the run it arrived in; now for the first
		case !it.out[i] && now.Sub(it.seen[i]) >= d:
			it.out[i], changed = true, true
		}
	}
	it.runAt = now
	if changed {
		it.least = it.leastNow()
	}
}
