package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
)

// orderSpin yields the processor a pseudo-random number of times in [0, most), chosen
// by seed with a PCG, so that concurrent items finish in a scrambled but repeatable
// amount of work, without any sleep.
func orderSpin(seed uint64, most int) {
	r := rand.New(rand.NewPCG(seed, 0x6f7264))
	for range r.IntN(most) {
		runtime.Gosched()
	}
}

// errOrderStop is the cause with which the ordering tests cancel a run's parent.
var errOrderStop = errors.New("stopped by the test")

// TestOrderedKeepsInputOrder runs an ordered stage (one-to-one, and flat with 0, 1 or 3
// outputs per item) with random per-item work, for several worker counts and windows:
// the outputs come out in input order, dead-lettered and filtered items leave no gap
// and never stall the window, and the report accounts for every item.
func TestOrderedKeepsInputOrder(t *testing.T) {
	t.Parallel()
	const n = 300
	dead := func(i int) bool { return i%11 == 5 }
	fanout := func(i int) int { return [...]int{1, 0, 3}[i%3] } // 0: the item is filtered out
	for _, kind := range []string{"stage", "flat"} {
		for _, workers := range []int{1, 4, 8} {
			for _, window := range []int{0, 1, 3, 64} {
				t.Run(fmt.Sprintf("%s/workers=%d/window=%d", kind, workers, window), func(t *testing.T) {
					t.Parallel()
					p := pipeline.New(pipeline.WithBuffer(8))
					src := pipeline.FromSlice(p, ints(n))
					opts := []pipeline.StageOption{pipeline.WithOrdered(window), discardDead[int]()}
					var (
						out  *pipeline.Stream[int]
						want []int
						dl   int64
					)
					for i := range n {
						if dead(i) {
							dl++
							continue
						}
						if kind == "stage" {
							want = append(want, i)
							continue
						}
						for j := range fanout(i) {
							want = append(want, 10*i+j)
						}
					}
					if kind == "stage" {
						out = pipeline.Then(src, pipeline.NewStage("ord", workers, func(_ context.Context, i int) (int, error) {
							orderSpin(uint64(i), 32)
							if dead(i) {
								return 0, pipeline.Permanent(fmt.Errorf("item %d: %w", i, errBoom))
							}
							return i, nil
						}, opts...))
					} else {
						out = pipeline.Then(src, pipeline.NewFlatStage("ord", workers, func(_ context.Context, i int, emit func(int)) error {
							orderSpin(uint64(i), 32)
							if dead(i) {
								return pipeline.Permanent(fmt.Errorf("item %d: %w", i, errBoom))
							}
							for j := range fanout(i) {
								emit(10*i + j)
							}
							return nil
						}, opts...))
					}

					got, err := pipeline.Collect(t.Context(), out)
					require.NoError(t, err)
					assert.Equal(t, want, got, "outputs out of input order")

					rep := p.Report()
					checkAccounting(t, rep)
					checkChain(t, rep)
					if kind == "stage" {
						checkConservation(t, rep)
					}
					ord := row(t, rep, "ord")
					assert.Equal(t, int64(n), ord.In)
					assert.Equal(t, dl, ord.DeadLettered)
					assert.Equal(t, int64(n)-dl, ord.Succeeded)
					assert.Equal(t, int64(len(want)), ord.Out)
					assert.Zero(t, ord.Window, "nothing is left in the window after a success")
				})
			}
		}
	}
}

// TestOrderedSkipsDoNotStall gives an ordered stage a window of 1 and items most of
// which are dead-lettered or filtered out, with the surviving ones slow: each item
// that leaves no output must free its place at once. Inside a synctest bubble, a stall
// would be reported as a deadlock instead of hanging until the test timeout.
func TestOrderedSkipsDoNotStall(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 200
		p := pipeline.New(pipeline.WithBuffer(2))
		st := pipeline.NewFlatStage("ord", 4, func(_ context.Context, i int, emit func(int)) error {
			switch i % 4 {
			case 0:
				time.Sleep(time.Duration(n-i) * time.Millisecond) // virtual: later items finish first
				emit(i)
			case 1:
				return pipeline.Permanent(errBoom)
			}
			return nil // 2, 3: filtered out
		}, pipeline.WithOrdered(1), discardDead[int]())
		got, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(n)), st))
		require.NoError(t, err)
		var want []int
		for i := 0; i < n; i += 4 {
			want = append(want, i)
		}
		assert.Equal(t, want, got)
		rep := p.Report()
		checkAccounting(t, rep)
		checkChain(t, rep)
		assert.Equal(t, int64(n/4), row(t, rep, "ord").DeadLettered)
	})
}

// TestOrderedWindowBoundsMemory blocks the head item of an ordered stage and lets the
// others finish at once. While the head is blocked, the stage starts at most window +
// workers items, exactly: the head, the window-1 items after it (finished, held in the
// window) and one more item per other worker, finished and waiting for room in the
// window (with one worker, only the head). The window it reports never exceeds its
// size, nothing passes the head, and once released every item arrives in order.
func TestOrderedWindowBoundsMemory(t *testing.T) {
	t.Parallel()
	const (
		n   = 1000 // more than any window + workers + buffer below
		buf = 4
	)
	for _, workers := range []int{1, 4, 8} {
		for _, window := range []int{0, 1, 3, 64} {
			t.Run(fmt.Sprintf("workers=%d/window=%d", workers, window), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					release := make(chan struct{})
					var started atomic.Int64
					hold := scenario.HoldHead(release)
					fn := func(ctx context.Context, i int) (int, error) {
						started.Add(1)
						return hold(ctx, i)
					}
					p := pipeline.New()
					s := pipeline.Then(pipeline.FromSlice(p, ints(n)),
						pipeline.NewStage("ord", workers, fn, pipeline.WithOrdered(window), pipeline.WithBuffer(buf)))
					var c collector[int]
					pipeline.To(s, pipeline.NewSink("sink", 1, c.add))
					errc := runAsync(t.Context(), p)

					synctest.Wait() // every goroutine is blocked behind the head item
					size := window
					if size == 0 {
						size = buf + 64*workers // the documented default
					}
					// Items start only inside the window: the head, and size-1 after it
					// that finish and wait for it.
					wantStarted, wantHeld := 1, 0
					if workers > 1 {
						wantStarted, wantHeld = size, size-1
					}
					assert.LessOrEqual(t, started.Load(), int64(size), "items started while the head is blocked")
					assert.Equal(t, int64(wantStarted), started.Load(), "items started while the head is blocked")
					snap := p.Snapshot()
					ord := row(t, snap, "ord")
					assert.LessOrEqual(t, ord.Window, int64(size), "the window holds more than its size")
					assert.Equal(t, int64(wantHeld), ord.Window, "items held in the window")
					assert.LessOrEqual(t, ord.PeakQueue, buf)
					assert.Empty(t, c.got(), "an item passed the blocked head")

					close(release)
					require.NoError(t, <-errc)
					assert.Equal(t, ints(n), c.got())
					rep := p.Report()
					checkReport(t, rep)
					assert.Zero(t, row(t, rep, "ord").Window)
				})
			})
		}
	}
}

// TestOrderedStopLeavesNoLeak stops a run while an ordered stage's head item is blocked,
// its window is full and other workers wait for room in it: by a fatal error of the head,
// of a later item, or by canceling the parent. Run returns the right error, every
// goroutine exits (the synctest bubble fails otherwise), nothing passes the head, and
// each row's identity holds.
func TestOrderedStopLeavesNoLeak(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"head fails", "later item fails", "parent canceled"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			testOrderedStop(t, how, false)
		})
	}
}

// TestOrderedStopConservation is TestOrderedStopLeavesNoLeak's scenario checked for
// conservation: every source item has exactly one outcome over the chain. The items
// that finished and were waiting for room in the window when the run stopped were never
// sent on, yet they count as succeeded by the ordered stage (and so as nothing at all
// downstream), while the items held in the window count as failed.
func TestOrderedStopConservation(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"head fails", "later item fails", "parent canceled"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			testOrderedStop(t, how, true)
		})
	}
}

// testOrderedStop runs source → ord (4 workers, window 3, ordered) → sink and stops it
// the way how says, once the head item blocks everything: the head, then items 1 and 2
// (held in the window) and items 3, 4 and 5 (one per other worker, waiting for room in
// the window; with how "later item fails", item 5 is still running and fails). It
// does so twice: with a source of its own goroutine (FromSeq), whose items wait in the
// stage's queue, and with FromSlice, whose items the workers take in place.
func testOrderedStop(t *testing.T, how string, conserve bool) {
	for _, src := range []string{"seq", "slice"} {
		t.Run("source="+src, func(t *testing.T) {
			testOrderedStopFrom(t, src, how, conserve)
		})
	}
}

func testOrderedStopFrom(t *testing.T, src, how string, conserve bool) {
	synctest.Test(t, func(t *testing.T) {
		const n, workers, window = 100, 4, 3
		headGo := make(chan struct{})
		laterGo := make(chan struct{})
		fn := func(ctx context.Context, i int) (int, error) {
			switch {
			case i == 0:
				select {
				case <-headGo:
					return 0, errBoom
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			case i == window-1 && how == "later item fails":
				// The last item the window lets a worker start: it fails
				// while the others wait for the head.
				select {
				case <-laterGo:
					return 0, errBoom
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}
			return i, nil
		}
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		p := pipeline.New(pipeline.WithBuffer(2))
		var in *pipeline.Stream[int]
		if src == "seq" {
			in = pipeline.FromSeq(p, slices.Values(ints(n)))
		} else {
			in = pipeline.FromSlice(p, ints(n))
		}
		s := pipeline.Then(in, pipeline.NewStage("ord", workers, fn, pipeline.WithOrdered(window)))
		var c collector[int]
		pipeline.To(s, pipeline.NewSink("sink", 2, c.add))
		errc := runAsync(ctx, p)

		synctest.Wait()
		switch how {
		case "head fails":
			close(headGo)
		case "later item fails":
			close(laterGo)
		case "parent canceled":
			cancel(errOrderStop)
		}
		err := <-errc
		if how == "parent canceled" {
			require.ErrorIs(t, err, errOrderStop)
		} else {
			require.ErrorIs(t, err, errBoom)
			serr, ok := errors.AsType[*pipeline.StageError](err)
			require.True(t, ok, "want a *StageError, got %T", err)
			assert.Equal(t, "ord", serr.Stage)
		}
		assert.Empty(t, c.got(), "an item passed the blocked head")
		rep := p.Report()
		checkAccounting(t, rep)
		checkChain(t, rep)
		ord := row(t, rep, "ord")
		// Each worker holds one item (in progress, or waiting for room in the window),
		// the window holds the finished ones, and with a source of its own goroutine 2
		// are queued, and the source was sending one: not started. A slice's items
		// reach the stage only as its workers take them.
		running := 1 // the head
		if how == "later item fails" {
			running = 2
		}
		queued := 2 + 1
		if src == "slice" {
			queued = 0
		}
		assert.Equal(t, int64(workers+window-running+queued), ord.In, "items that reached the stage")
		assert.GreaterOrEqual(t, ord.Failed, int64(window), "the head and the items held in the window failed")
		assert.Zero(t, ord.Out)
		if conserve {
			checkConservation(t, rep)
		}
	})
}

// TestKeyedOneAtATimeInOrder checks WithKey and WithPartition: with a per-key in-flight
// gauge, no two items of one key ever run at once, each key's items are processed and
// delivered in input order, and every item arrives.
func TestKeyedOneAtATimeInOrder(t *testing.T) {
	t.Parallel()
	const n, keys = 400, 8
	routes := map[string]pipeline.StageOption{
		"WithKey":       pipeline.WithKey(func(i int) string { return fmt.Sprintf("key-%d", i%keys) }),
		"WithPartition": pipeline.WithPartition(func(i int) int { return i % keys }),
	}
	for _, c := range []struct {
		route   string
		workers int
	}{{"WithKey", 1}, {"WithKey", 4}, {"WithPartition", 1}, {"WithPartition", 3}} {
		workers := c.workers
		t.Run(fmt.Sprintf("%s/workers=%d", c.route, workers), func(t *testing.T) {
			t.Parallel()
			var (
				active  [keys]atomic.Int32
				peak    [keys]atomic.Int32
				mu      sync.Mutex
				started [keys][]int // per key, the items in the order they started
			)
			fn := func(_ context.Context, i int) (int, error) {
				k := i % keys
				a := active[k].Add(1)
				for {
					m := peak[k].Load()
					if a <= m || peak[k].CompareAndSwap(m, a) {
						break
					}
				}
				mu.Lock()
				started[k] = append(started[k], i)
				mu.Unlock()
				orderSpin(uint64(i), 32)
				active[k].Add(-1)
				return i, nil
			}
			p := pipeline.New(pipeline.WithBuffer(16))
			s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("keyed", workers, fn, routes[c.route]))
			got, err := pipeline.Collect(t.Context(), s)
			require.NoError(t, err)
			assert.ElementsMatch(t, ints(n), got)
			var delivered [keys][]int
			for _, i := range got {
				delivered[i%keys] = append(delivered[i%keys], i)
			}
			for k := range keys {
				assert.LessOrEqualf(t, peak[k].Load(), int32(1), "key %d had items in flight at once", k)
				assert.Truef(t, slices.IsSorted(started[k]), "key %d processed out of order: %v", k, started[k])
				assert.Truef(t, slices.IsSorted(delivered[k]), "key %d delivered out of order: %v", k, delivered[k])
				assert.Len(t, started[k], n/keys)
			}
			checkReport(t, p.Report())
		})
	}
}

// TestKeyedDifferentKeysConcurrent checks that WithKey runs items of different keys at
// once. Each item waits, at a barrier, until items of two different keys are in flight
// together. The keys' worker is chosen by a seeded hash, so the test uses 16 keys over 4
// workers: all 16 landing on one worker (odds about 1e-9) is the only way the barrier
// cannot be met, and then the wait times out after a minute of virtual time.
func TestKeyedDifferentKeysConcurrent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n, keys, workers = 64, 16, 4
		var (
			mu          sync.Mutex
			inflight    = map[int]int{} // key -> items in flight
			maxDistinct int
			metOnce     bool
		)
		met := make(chan struct{})
		errNoConcurrency := errors.New("no two keys ran at once")
		fn := func(ctx context.Context, i int) (int, error) {
			k := i % keys
			mu.Lock()
			inflight[k]++
			maxDistinct = max(maxDistinct, len(inflight))
			if len(inflight) >= 2 && !metOnce {
				metOnce = true
				close(met)
			}
			mu.Unlock()
			defer func() {
				mu.Lock()
				if inflight[k]--; inflight[k] == 0 {
					delete(inflight, k)
				}
				mu.Unlock()
			}()
			if err := meet(ctx, met, errNoConcurrency); err != nil {
				return 0, err
			}
			return i, nil
		}
		p := pipeline.New()
		s := pipeline.Then(pipeline.FromSlice(p, ints(n)),
			pipeline.NewStage("keyed", workers, fn, pipeline.WithKey(func(i int) int { return i % keys })))
		got, err := pipeline.Collect(t.Context(), s)
		require.NoError(t, err)
		assert.ElementsMatch(t, ints(n), got)
		mu.Lock()
		assert.GreaterOrEqual(t, maxDistinct, 2, "items of different keys in flight at once")
		mu.Unlock()
	})
}

// TestKeyedMisuse checks the programmer errors of WithKey and WithOrdered.
func TestKeyedMisuse(t *testing.T) {
	t.Parallel()
	fn := func(_ context.Context, v int) (int, error) { return v, nil }
	flat := func(context.Context, int, func(int)) error { return nil }
	byLen := pipeline.WithKey(func(s string) int { return len(s) })
	byMod := pipeline.WithKey(func(i int) int { return i % 3 })

	msg := assertPanicsPipeline(t, func() { pipeline.NewStage("s", 2, fn, byLen) })
	assert.Contains(t, msg, "WithKey")
	msg = assertPanicsPipeline(t, func() { pipeline.NewFlatStage("s", 2, flat, byLen) })
	assert.Contains(t, msg, "WithKey")
	msg = assertPanicsPipeline(t, func() { pipeline.NewStage("s", 2, fn, byMod, pipeline.WithOrdered(4)) })
	assert.Contains(t, msg, "WithOrdered")
	msg = assertPanicsPipeline(t, func() { pipeline.NewStage("s", 2, fn, pipeline.WithOrdered(0), byMod) })
	assert.Contains(t, msg, "WithOrdered")
	assertPanicsPipeline(t, func() { pipeline.WithKey[int, int](nil) })
	assertPanicsPipeline(t, func() { pipeline.WithOrdered(-1) })

	byLane := pipeline.WithPartition(func(i int) int { return i % 2 })
	msg = assertPanicsPipeline(t, func() {
		pipeline.NewStage("s", 2, fn, pipeline.WithPartition(func(s string) int { return len(s) }))
	})
	assert.Contains(t, msg, "WithPartition")
	msg = assertPanicsPipeline(t, func() { pipeline.NewStage("s", 2, fn, byLane, pipeline.WithOrdered(4)) })
	assert.Contains(t, msg, "WithPartition and WithOrdered together")
	for _, opts := range [][]pipeline.StageOption{{byMod, byLane}, {byLane, byMod}, {byLane, byLane}, {byMod, byMod}} {
		msg = assertPanicsPipeline(t, func() { pipeline.NewStage("s", 2, fn, opts...) })
		assert.Contains(t, msg, "together; give one way to route items to workers")
	}
	assertPanicsPipeline(t, func() { pipeline.WithPartition[int](nil) })
}

// TestPartitionWorkerEach checks that WithPartition gives n partitions numbered 0 to
// n-1 on n workers a worker each: every item waits, at a barrier, until items of all
// n partitions are in flight together, which two partitions on one worker can never
// meet (the wait then ends with an error after a minute of virtual time). It also checks
// the partitions past n and below 0 (modulo n), and one at a time per worker.
func TestPartitionWorkerEach(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		shift int // partition(i) = i%workers + shift*workers
	}{{"0 to n-1", 0}, {"n to 2n-1", 1}, {"negative", -1 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const workers, n = 4, 64
				var (
					mu       sync.Mutex
					inflight [workers]int
					peak     int
					all      = make(chan struct{})
				)
				errApart := errors.New("the partitions were never all in flight together")
				fn := func(ctx context.Context, i int) (int, error) {
					k := i % workers
					mu.Lock()
					inflight[k]++
					peak = max(peak, inflight[k])
					if !isClosed(all) && !slices.Contains(inflight[:], 0) {
						close(all)
					}
					mu.Unlock()
					defer func() {
						mu.Lock()
						inflight[k]--
						mu.Unlock()
					}()
					if err := meet(ctx, all, errApart); err != nil {
						return 0, err
					}
					return i, nil
				}
				p := pipeline.New()
				s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("lanes", workers, fn,
					pipeline.WithPartition(func(i int) int { return i%workers + tc.shift*workers })))
				got, err := pipeline.Collect(t.Context(), s)
				require.NoError(t, err)
				assert.ElementsMatch(t, ints(n), got)
				mu.Lock()
				assert.Equal(t, 1, peak, "items of one partition in flight at once")
				mu.Unlock()
			})
		})
	}
}

// meet waits until ch is closed (nil): the items a test needs in flight together are.
// It returns apart once a minute of virtual time has passed (only when nothing else
// can run), or ctx's error when ctx is done first.
func meet(ctx context.Context, ch <-chan struct{}, apart error) error {
	select {
	case <-ch:
		return nil
	case <-time.After(time.Minute):
		return apart
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isClosed reports whether ch is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestOrderedFlushSecondPass: the next item settles while the flusher is pushing the
// one before it downstream (held in a Filter, which runs in the flusher's goroutine), so
// the flusher must find it on its next pass through the window, with the window's head
// moved on by the first.
func TestOrderedFlushSecondPass(t *testing.T) {
	t.Parallel()
	for _, window := range []int{0, 2, 3} { // item 0 waits for item 1: at least 2
		t.Run(fmt.Sprintf("window=%d", window), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				started1, release1 := make(chan struct{}), make(chan struct{})
				p := pipeline.New(pipeline.WithBuffer(4))
				s := pipeline.Then(pipeline.FromSlice(p, []int{0, 1, 2}), pipeline.NewStage("s", 2, func(ctx context.Context, v int) (int, error) {
					switch v {
					case 0: // finishes once item 1 is under way in the other worker
						<-started1
					case 1:
						close(started1)
						<-release1
					}
					return v, nil
				}, pipeline.WithOrdered(window)))
				first := true
				f := pipeline.Filter(s, func(v int) bool {
					if first { // pushing item 0: item 1 settles meanwhile, and cannot flush
						first = false
						close(release1)
						synctest.Wait() // item 1 is settled, and its worker waits for more
					}
					return true
				})
				got, err := pipeline.Collect(t.Context(), f)
				require.NoError(t, err)
				assert.Equal(t, []int{0, 1, 2}, got)
			})
		})
	}
}

// TestOrderedStopSettlesFinishedRun stops the run while an ordered one-to-one stage's
// worker is between two items of a long run (the parent canceled, or the sink failed):
// the items it had finished in that run were never settled nor counted, so the stage's
// In did not add up.
func TestOrderedStopSettlesFinishedRun(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"parent canceled", "sink fails", "ordered sink"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const n, stopAt = 300, 10
				ctx, cancel := context.WithCancelCause(t.Context())
				defer cancel(nil)
				gate, reached := make(chan struct{}), make(chan struct{})
				fn := func(ctx context.Context, i int) (int, error) {
					switch i {
					case 0: // until the queue is full: the next run is long
						<-gate
					case stopAt: // the run stops while this item is under way; it finishes
						close(reached)
						if how != "sink fails" {
							cancel(errOrderStop)
						}
						<-ctx.Done()
					}
					return i, nil
				}
				p := pipeline.New()
				src := pipeline.FromSlice(p, ints(n))
				if how == "ordered sink" {
					pipeline.To(src, pipeline.NewSink("ord", 1, func(ctx context.Context, i int) error {
						_, err := fn(ctx, i)
						return err
					}, pipeline.WithOrdered(0)))
				} else {
					ord := pipeline.Then(src, pipeline.NewStage("ord", 1, fn, pipeline.WithOrdered(0)))
					pipeline.To(ord, pipeline.NewSink("sink", 1, func(context.Context, int) error {
						if how == "sink fails" {
							<-reached // fail once the stage is inside item stopAt, not before
							return errBoom
						}
						return nil
					}))
				}
				errc := runAsync(ctx, p)
				synctest.Wait() // the source waits for room: the queue is full
				close(gate)
				err := <-errc
				if how == "sink fails" {
					require.ErrorIs(t, err, errBoom)
				} else {
					require.ErrorIs(t, err, errOrderStop)
				}
				rep := p.Report()
				checkReport(t, rep)
				o := row(t, rep, "ord")
				assert.GreaterOrEqual(t, o.Succeeded+o.Failed, int64(stopAt+1), "the items the run finished\n%v", rep)
				for _, s := range rep.Stages {
					assert.Zerof(t, s.InFlight, "row %q: in flight once the run ended\n%v", s.Name, rep)
				}
			})
		})
	}
}

// A panic in an inline operator after an ordered stage counts the item failed once. It was
// counted failed by its worker AND, still "held" in the reorder window, moved again from
// Succeeded to Failed by the final report: Succeeded went negative.
func TestOrderedInlinePanicCountsItemOnce(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, []int{1})
	st := pipeline.Then(src, pipeline.NewStage("ord", 1, func(_ context.Context, v int) (int, error) { return v, nil },
		pipeline.WithOrdered(0)))
	m := pipeline.Map(st, func(int) int { panic("map") })
	pipeline.To(m, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	err := p.Run(context.Background())
	var pe *pipeline.PanicError
	require.ErrorAs(t, err, &pe)
	checkAccounting(t, p.Report())
}

// A keyed stage's queue holds at most what WithBuffer says, whatever the workers.
func TestKeyedQueueWithinBuffer(t *testing.T) {
	t.Parallel()
	for _, buf := range []int{0, 1, 3} {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			p := pipeline.New()
			s := pipeline.Then(pipeline.FromSlice(p, ints(100)), pipeline.NewStage("keyed", 4,
				func(ctx context.Context, i int) (int, error) {
					select {
					case <-release:
					case <-ctx.Done():
					}
					return i, nil
				}, pipeline.WithKey(func(i int) int { return i }), pipeline.WithBuffer(buf)))
			pipeline.To(s, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
			errc := runAsync(t.Context(), p)
			synctest.Wait()
			k := row(t, p.Snapshot(), "keyed")
			assert.Equal(t, buf, k.QueueCap)
			assert.LessOrEqual(t, k.QueueLen, buf, "items waiting in a keyed stage's queues")
			close(release)
			require.NoError(t, <-errc)
			assert.LessOrEqual(t, row(t, p.Report(), "keyed").PeakQueue, buf)
		})
	}
}

// An ordered stage holds at most its window of finished or started items, also while the
// window's items are being pushed to a slow consumer.
func TestOrderedWindowBoundWithSlowConsumer(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 4, 16} {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			var started, taken atomic.Int64
			p := pipeline.New()
			s := pipeline.Then(pipeline.FromSlice(p, ints(200)), pipeline.NewStage("ord", 4,
				func(_ context.Context, i int) (int, error) { started.Add(1); return i, nil },
				pipeline.WithOrdered(window)))
			pipeline.To(s, pipeline.NewSink("sink", 1, func(ctx context.Context, _ int) error {
				taken.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}, pipeline.WithBuffer(0)))
			errc := runAsync(t.Context(), p)
			synctest.Wait() // the sink holds one item; the window fills behind it
			assert.LessOrEqual(t, started.Load()-taken.Load(), int64(window), "items started and not yet taken by the sink")
			close(release)
			require.NoError(t, <-errc)
		})
	}
}

// orderedFlushInto returns a pipeline whose ordered stage "ord" (3 workers) holds item 0
// back for 10 ms, so that its reorder window flushes 0, 1 and 2 in one run, into a Map
// that calls at1 for item 1, and a sink "sink".
func orderedFlushInto(at1 func()) *pipeline.Pipeline {
	p := pipeline.New()
	src := pipeline.FromSlice(p, []int{0, 1, 2})
	st := pipeline.Then(src, pipeline.NewStage("ord", 3, func(_ context.Context, v int) (int, error) {
		if v == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		return v, nil
	}, pipeline.WithOrdered(0)))
	m := pipeline.Map(st, func(v int) int {
		if v == 1 {
			at1()
		}
		return v
	})
	pipeline.To(m, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	return p
}

// An inline panic while the reorder window flushes a run of several items: the items pushed
// before the panic are counted once (they stayed "held" and were counted Failed in the
// ordered row, while downstream received them).
func TestOrderedFlushInlinePanicCountsPushedItemsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := orderedFlushInto(func() { panic("map") })
		_ = p.Run(context.Background())
		rep := p.Report()
		t.Log("\n", rep)
		checkAccounting(t, rep)
		ord, sink := row(t, rep, "ord"), row(t, rep, "sink")
		assert.Equal(t, ord.Out, sink.In, "ord sent = sink In")
		assert.LessOrEqual(t, ord.Out, ord.Succeeded, "one-to-one stage: Out <= Succeeded")
		assert.Equal(t, int64(3), ord.Failed+ord.Succeeded-ord.Out+sink.In, "each item once")
	})
}

// A keyed stage with WithBuffer(n): no more than n items wait, whatever the keys.
func TestKeyedBufferBoundsWaitingItems(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		src := pipeline.FromSlice(p, ints(50))
		var snaps []pipeline.StageReport
		st := pipeline.NewSink("k", 3, func(ctx context.Context, v int) error {
			time.Sleep(time.Millisecond)
			return nil
		}, pipeline.WithBuffer(2), pipeline.WithKey(func(v int) int { return v % 2 }))
		pipeline.To(src, st)
		done := runAsync(context.Background(), p)
		for {
			select {
			case err := <-done:
				require.NoError(t, err)
				for _, s := range snaps {
					assert.LessOrEqual(t, s.QueueLen, 2)
				}
				checkAccounting(t, p.Report())
				return
			case <-time.After(300 * time.Microsecond):
				if s, ok := p.Snapshot().Stage("k"); ok {
					snaps = append(snaps, s)
				}
			}
		}
	})
}

// runtime.Goexit in an inline operator while the reorder window flushes a run fails the run
// with ErrGoexit, and the ordered row's Out stays within its Succeeded.
func TestOrderedFlushGoexitKeepsOutWithinSucceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := orderedFlushInto(runtime.Goexit)
		err := p.Run(context.Background())
		require.ErrorIs(t, err, pipeline.ErrGoexit)
		rep := p.Report()
		t.Log("\n", rep)
		ord := row(t, rep, "ord")
		assert.LessOrEqual(t, ord.Out, ord.Succeeded, "one-to-one stage: Out <= Succeeded")
	})
}
