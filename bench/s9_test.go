package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopipeline/pipeline"
)

// S9: windows (issue 23). 1,000,000 events over 1,000 keys, 1,000 per second of event
// time, 5 % of them up to 10 s out of order, summed per key over 1-minute tumbling
// windows with a watermark 10 s behind the latest event. impl=loop is one goroutine
// with a map of open windows per minute, fired by a hand-written watermark;
// impl=pipeline is a FromSlice source, a Window stage (1 and GOMAXPROCS workers keyed
// by key) and a sink that counts results; with one worker the stage folds inline, in
// the source's goroutine. impl=queued/workers=1 is that stage given a WithBuffer of its
// own, which keeps its queue and goroutine: the hop the inline stage saves.

const (
	s9Events = 1_000_000
	s9Keys   = 1_000
	s9Delay  = 10 * time.Second
)

type s9Event struct {
	Key int
	At  time.Time
	V   int64
}

func s9Stream() []s9Event {
	rng := rand.New(rand.NewPCG(9, 9))
	base := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	evs := make([]s9Event, s9Events)
	for i := range evs {
		at := base.Add(time.Duration(i) * time.Millisecond)
		if rng.IntN(20) == 0 {
			at = at.Add(-time.Duration(rng.Int64N(int64(s9Delay))))
		}
		evs[i] = s9Event{Key: rng.IntN(s9Keys), At: at, V: 1 + rng.Int64N(100)}
	}
	return evs
}

// s9Loop is the hand-written baseline: the open windows by minute, each a map of sums
// by key, fired in order once the watermark passes their end; emit gets each result.
func s9Loop(evs []s9Event, emit func(key int, start int64, sum int64)) {
	const minute = int64(time.Minute)
	open := map[int64]map[int]int64{}
	var starts []int64 // open minutes, ascending
	maxT, wm := int64(-1<<63), int64(-1<<63)
	for _, e := range evs {
		t := e.At.UnixNano()
		start := t - t%minute
		if start+minute <= wm {
			continue // late: none here, by construction
		}
		m := open[start]
		if m == nil {
			m = map[int]int64{}
			open[start] = m
			i := len(starts)
			for i > 0 && starts[i-1] > start {
				i--
			}
			starts = append(starts, 0)
			copy(starts[i+1:], starts[i:])
			starts[i] = start
		}
		m[e.Key] += e.V
		if t > maxT {
			maxT = t
			wm = t - int64(s9Delay)
			for len(starts) > 0 && starts[0]+minute <= wm {
				for k, s := range open[starts[0]] {
					emit(k, starts[0], s)
				}
				delete(open, starts[0])
				starts = starts[1:]
			}
		}
	}
	for _, st := range starts {
		for k, s := range open[st] {
			emit(k, st, s)
		}
	}
}

func BenchmarkS9Window(b *testing.B) {
	evs := s9Stream()
	var want int64
	s9Loop(evs, func(int, int64, int64) { want++ })
	measure := func(b *testing.B, run func() int64) {
		b.Helper()
		b.ReportAllocs()
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		for b.Loop() {
			if got := run(); got != want {
				b.Fatalf("%d results, want %d", got, want)
			}
		}
		runtime.ReadMemStats(&ms1)
		n := float64(b.N) * s9Events
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/event")
		b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "allocs/event")
	}
	b.Run("impl=loop", func(b *testing.B) {
		measure(b, func() int64 {
			var n int64
			s9Loop(evs, func(int, int64, int64) { n++ })
			return n
		})
	})
	for _, v := range []struct {
		impl    string
		workers int
		queued  bool
	}{{"pipeline", 1, false}, {"queued", 1, true}, {"pipeline", runtime.GOMAXPROCS(0), false}} {
		workers := v.workers
		b.Run(fmt.Sprintf("impl=%s/workers=%d", v.impl, workers), func(b *testing.B) {
			var n atomic.Int64
			p := pipeline.New()
			opts := []pipeline.WindowOption{pipeline.WithMaxDelay(s9Delay), pipeline.WithWindowWorkers(workers)}
			if v.queued {
				opts = append(opts, pipeline.WithBuffer(pipeline.DefaultBuffer))
			}
			w := pipeline.Window(pipeline.FromSlice(p, evs), pipeline.Tumbling(time.Minute),
				func(e s9Event) int { return e.Key }, func(e s9Event) time.Time { return e.At },
				pipeline.Fold(int64(0), func(s int64, e s9Event) int64 { return s + e.V }), opts...)
			pipeline.To(w, pipeline.NewSink("count", 1, func(context.Context, pipeline.WindowResult[int, int64]) error {
				n.Add(1)
				return nil
			}))
			measure(b, func() int64 {
				n.Store(0)
				if err := p.Run(b.Context()); err != nil {
					b.Fatal(err)
				}
				return n.Load()
			})
		})
	}
}
