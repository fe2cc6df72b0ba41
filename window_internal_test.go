package pipeline

import (
	"context"
	"hash/maphash"
	"iter"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// TestWindowRunsInlineWhenItCan checks which way each configuration of a Window stage
// runs: inline (its row's queue is an inlineLen: no queue, no goroutine of its own) only
// with one worker, one producing goroutine, an untracked run, no idle clock and no
// WithBuffer of its own; otherwise behind a queue.
func TestWindowRunsInlineWhenItCan(t *testing.T) {
	type wev struct {
		k  int
		at time.Time
	}
	evs := []wev{{0, time.Unix(1, 0)}}
	key := func(e wev) int { return e.k }
	at := func(e wev) time.Time { return e.at }
	count := Fold(0, func(n int, _ wev) int { return n + 1 })
	for _, tc := range []struct {
		name   string
		in     func(p *Pipeline) *Stream[wev]
		opts   []WindowOption
		inline bool
	}{
		{"a source", func(p *Pipeline) *Stream[wev] { return FromSlice(p, evs) }, nil, true},
		{"a source and Map", func(p *Pipeline) *Stream[wev] { return Map(FromSlice(p, evs), func(e wev) wev { return e }) }, nil, true},
		{"a stage of one worker", func(p *Pipeline) *Stream[wev] {
			return Then(FromSlice(p, evs), NewStage("id", 1, func(_ context.Context, e wev) (wev, error) { return e, nil }))
		}, nil, true},
		{
			"sliding windows, lateness, a bound", func(p *Pipeline) *Stream[wev] { return FromSlice(p, evs) },
			[]WindowOption{WithAllowedLateness(time.Second), WithMaxWindows(10), WithMaxDelay(time.Second)},
			true,
		},
		// A Filter's row has no workers of its own: the stage cannot tell how many
		// goroutines feed it, and keeps its queue.
		{"a source and Filter", func(p *Pipeline) *Stream[wev] { return Filter(FromSlice(p, evs), func(wev) bool { return true }) }, nil, false},
		{"a stage of two workers", func(p *Pipeline) *Stream[wev] {
			return Then(FromSlice(p, evs), NewStage("id", 2, func(_ context.Context, e wev) (wev, error) { return e, nil }))
		}, nil, false},
		{"two sources merged", func(p *Pipeline) *Stream[wev] { return Merge(FromSlice(p, evs), FromSlice(p, evs)) }, nil, false},
		{"WithBuffer", func(p *Pipeline) *Stream[wev] { return FromSlice(p, evs) }, []WindowOption{WithBuffer(8)}, false},
		{"WithIdleTimeout", func(p *Pipeline) *Stream[wev] { return FromSlice(p, evs) }, []WindowOption{WithIdleTimeout(time.Hour)}, false},
		{"two workers", func(p *Pipeline) *Stream[wev] { return FromSlice(p, evs) }, []WindowOption{WithWindowWorkers(2)}, false},
		{"a checkpointed source", func(p *Pipeline) *Stream[wev] {
			return FromCheckpoint(p, NewFileCheckpoint(t.TempDir()+"/ck"), func(_ context.Context, pos int64) iter.Seq2[wev, error] {
				return func(yield func(wev, error) bool) {
					for _, e := range evs[pos:] {
						if !yield(e, nil) {
							return
						}
					}
				}
			})
		}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New()
			kind := Tumbling(time.Minute)
			if tc.name == "sliding windows, lateness, a bound" {
				kind = Sliding(time.Minute, 30*time.Second)
			}
			var inline, seen bool
			To(Window(tc.in(p), kind, key, at, count, tc.opts...), NewSink("sink", 1, func(context.Context, WindowResult[int, int]) error {
				for _, rw := range p.cur.Load().rows {
					if rw.kind == KindWindow {
						_, inline = rw.q.(inlineLen)
						seen = true
					}
				}
				return nil
			}))
			if err := p.Run(t.Context()); err != nil {
				t.Fatal(err)
			}
			if !seen {
				t.Fatal("no result")
			}
			if inline != tc.inline {
				t.Errorf("inline: %v, want %v", inline, tc.inline)
			}
		})
	}
}

// TestWindowBucketAgreesWithAMap drives a bucket's table (window_state.go: linear
// probing, growth, backward-shift deletion) with random adds, removes and look-ups of
// few keys, so that probes collide and wrap, and checks it against a map after every
// step: what it finds, its count, and each window's entry pointing back at it. Integer
// keys of 64 bits take the table's own hash (wordHash), others maphash's.
func TestWindowBucketAgreesWithAMap(t *testing.T) {
	t.Run("int", func(t *testing.T) { checkBucketAgainstMap(t, func(k int) int { return k }) })
	t.Run("uint64", func(t *testing.T) { checkBucketAgainstMap(t, func(k int) uint64 { return uint64(k) << 40 }) })
	t.Run("string", func(t *testing.T) { checkBucketAgainstMap(t, strconv.Itoa) })
	t.Run("int32", func(t *testing.T) { checkBucketAgainstMap(t, func(k int) int32 { return int32(-k) }) })
}

func checkBucketAgainstMap[K comparable](t *testing.T, keyOf func(int) K) {
	t.Helper()
	for _, keys := range []int{3, 20, 200} {
		rng := rand.New(rand.NewPCG(uint64(keys), 7))
		b := newBucket[K, int](maphash.MakeSeed())
		model := map[K]*win[K, int]{}
		for step := range 20_000 {
			n := rng.IntN(keys)
			k := keyOf(n)
			if wn, ok := model[k]; ok && rng.IntN(2) == 0 {
				b.remove(wn)
				delete(model, k)
				if wn.b != nil {
					t.Fatalf("keys %d, step %d: a removed window keeps its bucket", keys, step)
				}
			} else if !ok {
				wn := &win[K, int]{key: k}
				b.add(k, wn, 10*n)
				model[k] = wn
			}
			if b.n != len(model) {
				t.Fatalf("keys %d, step %d: %d entries, want %d", keys, step, b.n, len(model))
			}
			if keys > 20 && step%50 != 0 {
				continue
			}
			for n := range keys {
				if got, want := b.window(keyOf(n)), model[keyOf(n)]; got != want {
					t.Fatalf("keys %d, step %d: window(%v) = %p, want %p", keys, step, keyOf(n), got, want)
				}
			}
			for k, wn := range model {
				if e := b.ents[wn.slot]; wn.b != b || e.key != k || e.c != 1 || b.wins[wn.slot] != wn {
					t.Fatalf("keys %d, step %d: key %v's window points at entry %d = %+v", keys, step, k, wn.slot, e)
				}
			}
		}
		for _, wn := range model {
			b.remove(wn)
		}
		for i, e := range b.ents {
			if e != (bucketEnt[K, int]{}) || b.wins[i] != nil {
				t.Fatalf("keys %d: emptied bucket's entry %d is %+v", keys, i, e)
			}
		}
	}
}
