package pipeline

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkHotPath measures, on the machine it runs on, what each kind of per-item work
// on the engine's hot path costs, so that the design can be judged by numbers: on
// amd64 an atomic store is an XCHG, a locked instruction like an atomic add, while an
// atomic load is a plain load; a clock read goes through the vDSO. Run it with
// go test -run '^$' -bench HotPath .
func BenchmarkHotPath(b *testing.B) {
	var (
		v    atomic.Int64
		f    atomic.Int32
		c    counter
		mu   sync.Mutex
		sink int64
	)
	base := time.Now()
	ctx := b.Context()
	ch := make(chan int, 1)
	for _, bc := range []struct {
		name string
		fn   func()
	}{
		{"plain-increment", func() { sink++ }},
		{"atomic-load", func() { sink += int64(f.Load()) }},
		{"atomic-store(XCHG)", func() { v.Store(sink) }},
		{"atomic-add", func() { v.Add(1) }},
		{"counter-inc(load+store)", func() { c.inc() }},
		{"mutex-lock-unlock", func() { mu.Lock(); sink++; mu.Unlock() }},
		{"ctx.Err", func() {
			if ctx.Err() != nil {
				sink++
			}
		}},
		{"time.Now", func() { sink += int64(time.Now().Nanosecond()) }},
		{"time.Since", func() { sink += int64(time.Since(base)) }},
		{"chan-send+recv(buffered)", func() { ch <- 1; sink += int64(<-ch) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				bc.fn()
			}
		})
	}
	_ = sink
}
