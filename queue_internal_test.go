package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestQueueExactlyOnceWithinBound drives a queue directly with several producers, each
// with a sender of its own that flushes at random, and several workers that take runs
// of random size and start their items one by one. Every item arrives exactly once, and
// the room in use (in the ring, reserved by producers, taken and not started) never
// exceeds the capacity.
func TestQueueExactlyOnceWithinBound(t *testing.T) {
	for _, capacity := range []int{0, 1, 3, 64} {
		for _, keyed := range []bool{false, true} {
			const producers, workers, perProducer = 3, 4, 2000
			var q *queue[int]
			if keyed {
				q = newKeyedQueue(workers, capacity, func(v int) uint64 { return uint64(v) })
			} else {
				q = newQueue[int](capacity, workers)
			}
			ctx := t.Context()
			out := q.outlet(ctx)
			check, exceeded := roomWatch(q)
			var pwg, wwg sync.WaitGroup
			for p := range producers {
				pwg.Go(func() {
					snd := out(new(hand))
					r := rand.New(rand.NewPCG(uint64(p), 1))
					for i := range perProducer {
						if err := snd.put(p*perProducer+i, noPos); err != nil {
							t.Errorf("put: %v", err)
							return
						}
						if r.IntN(8) == 0 {
							if err := snd.flush(); err != nil {
								t.Errorf("flush: %v", err)
								return
							}
						}
						check()
					}
					if err := snd.flush(); err != nil {
						t.Errorf("flush: %v", err)
					}
				})
			}
			seen := make([]int, producers*perProducer)
			var mu sync.Mutex
			for i := range workers {
				wwg.Go(func() {
					lane := 0
					if keyed {
						lane = i
					}
					r := rand.New(rand.NewPCG(uint64(i), 2))
					run, w := make([]item[int], chunk), newWaiter()
					for {
						k, _, _, ok, err := q.takeWait(ctx, lane, w, run[:1+r.IntN(chunk)], r.IntN(3))
						if err != nil {
							t.Errorf("take: %v", err)
						}
						if !ok {
							return
						}
						for _, it := range run[:k] {
							q.started(i, 1)
							check()
							mu.Lock()
							seen[it.v]++
							mu.Unlock()
						}
					}
				})
			}
			pwg.Wait()
			q.close()
			wwg.Wait()
			if exceeded() {
				t.Errorf("capacity %d, keyed %v: more room in use than the capacity", capacity, keyed)
			}
			for v, n := range seen {
				if n != 1 {
					t.Fatalf("capacity %d, keyed %v: item %d arrived %d times", capacity, keyed, v, n)
				}
			}
			if q.unsentCount() != 0 || q.length() != 0 {
				t.Errorf("unsent %d, left %d", q.unsentCount(), q.length())
			}
		}
	}
}

// TestQueueRendezvousStopped checks an unbuffered queue whose run stops while a
// producer waits for a worker to take its item: the put returns the run's cause, the
// item is taken back out of the queue and counted as unsent, and nothing is left behind.
func TestQueueRendezvousStopped(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) { rendezvousStopped(t, keyed) })
	}
}

func rendezvousStopped(t *testing.T, keyed bool) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		q := newQueue[int](0, 1)
		if keyed {
			q = newKeyedQueue(3, 0, func(v int) uint64 { return uint64(v) })
		}
		ctx, cancel := context.WithCancelCause(t.Context())
		snd := q.outlet(ctx)(new(hand))
		errc := make(chan error, 1)
		go func() { errc <- snd.put(7, noPos) }()
		synctest.Wait() // the producer waits for a taker
		if got := q.length(); got != 0 {
			t.Fatalf("length %d: a rendezvous's item is its producer's", got)
		}
		cause := errors.New("stop")
		cancel(cause)
		q.stop()
		if err := <-errc; !errors.Is(err, cause) {
			t.Fatalf("put = %v, want the run's cause", err)
		}
		q.mu.Lock()
		n, used := q.n, q.usedLocked()
		q.mu.Unlock()
		if n != 0 || used != 0 || q.unsentCount() != 1 {
			t.Fatalf("n %d, used %d, unsent %d; want 0, 0, 1", n, used, q.unsentCount())
		}
		for i := range q.lanes { // the item taken back keeps nothing alive
			if l := &q.lanes[i]; l.n != 0 || l.buf[0] != (item[int]{}) {
				t.Fatalf("lane %d: %d items, place %v; want 0 and empty", i, l.n, l.buf[0])
			}
		}
	})
}

// TestLaneRing pushes and pops runs of random length through rings of several sizes,
// wrapping around many times, against a slice: the items come out in order, and every
// place an item left is cleared (nothing kept alive for the garbage collector).
func TestLaneRing(t *testing.T) {
	for _, size := range []int{1, 2, 5, 64, 100} {
		rng := rand.New(rand.NewPCG(uint64(size), 7))
		l := lane[int]{buf: make([]item[int], size)}
		var model []int
		next := 0
		for range 2000 {
			if rng.IntN(2) == 0 { // push what fits, or less
				k := rng.IntN(size - l.n + 1)
				items := make([]item[int], k)
				for i := range items {
					items[i] = item[int]{v: next, pos: uint64(next)}
					model = append(model, next)
					next++
				}
				l.push(items)
			} else {
				k := rng.IntN(l.n + 1)
				dst := make([]item[int], k)
				l.pop(dst)
				for i, it := range dst {
					if it.v != model[i] || it.pos != uint64(model[i]) {
						t.Fatalf("size %d: got %v at %d of the run, want %d", size, it, i, model[i])
					}
				}
				model = model[k:]
			}
			if l.n != len(model) {
				t.Fatalf("size %d: %d items in the ring, want %d", size, l.n, len(model))
			}
			for i := range size { // the free places are zero
				if (i-l.head+size)%size >= l.n && l.buf[i] != (item[int]{}) {
					t.Fatalf("size %d: free place %d holds %v", size, i, l.buf[i])
				}
			}
		}
	}
}

// TestConsumerWaitEndedOtherwiseParksOnce: a worker whose wait ends for another reason
// (idle returns not woken: a breaker's signal, a timer) just as a producer has woken it
// parks once at its next wait, and a later item wakes a worker that waits. The token
// the producer sent stayed in the waiter's channel: the next wait took it for a wake
// and parked the worker a second time, and a later wake went to that second entry while
// the worker was busy, the item waiting while another worker slept.
func TestConsumerWaitEndedOtherwiseParksOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		q := newQueue[int](4, 2)
		snd := q.outlet(ctx)(new(hand))
		send := func(v int) {
			if err := snd.put(v, noPos); err != nil {
				t.Errorf("put: %v", err)
			}
			if err := snd.flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
		}
		stats := make([]workerStats, 2)
		a, b := newConsumer(q, 0, 0, &stats[0], 4), newConsumer(q, 0, 1, &stats[1], 4)
		// forWake is how a worker waits when nothing else ends its wait.
		forWake := func(wake <-chan struct{}) (bool, error) {
			select {
			case <-wake:
				return true, nil
			case <-ctx.Done():
				return false, context.Cause(ctx)
			}
		}
		// otherwise is a wait that another signal ends, as if its select had picked that
		// signal an instant before the producer's token came: it does not look at wake.
		other := make(chan struct{})
		otherwise := func(<-chan struct{}) (bool, error) {
			<-other
			return false, nil
		}
		var mu sync.Mutex
		by := map[int][]string{} // item -> the workers that took it
		release := make(chan struct{})
		var wg sync.WaitGroup
		work := func(name string, c *consumer[int], first func(<-chan struct{}) (bool, error)) {
			idle := first
			for {
				if _, ok, err := c.take(ctx, 1, 0, idle); !ok {
					if err != nil {
						t.Errorf("%s: take: %v", name, err)
					}
					return
				}
				idle = forWake
				v := c.next().v
				mu.Lock()
				by[v] = append(by[v], name)
				mu.Unlock()
				if v == 2 { // busy with item 2 until the end
					<-release
				}
			}
		}
		wg.Go(func() { work("b", &b, forWake) })
		synctest.Wait() // b waits
		wg.Go(func() { work("a", &a, otherwise) })
		synctest.Wait() // a waits, last on the list

		send(1)      // wakes a: off the list, its token sent
		close(other) // and a's wait ends on the other signal
		synctest.Wait()
		// a took item 1, and waits again; b waits still.
		q.mu.Lock()
		parked := 0
		for _, w := range q.lanes[0].waiting {
			if w == a.wt {
				parked++
			}
		}
		waiting := len(q.lanes[0].waiting)
		q.mu.Unlock()
		assert.Equal(t, 1, parked, "a is on the waiting list %d times", parked)
		assert.Equal(t, 2, waiting, "waiting list")

		send(2) // wakes a, which stays busy with it
		synctest.Wait()
		send(3) // must wake b, the one worker that waits
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, []string{"b"}, by[3], "item 3, sent while a was busy and b waited, taken by")
		mu.Unlock()

		close(release)
		q.close()
		wg.Wait()
		for v := 1; v <= 3; v++ {
			assert.Len(t, by[v], 1, "item %d taken by %v", v, by[v])
		}
	})
}

// A worker whose wait ends otherwise just after a producer woke it, and that then leaves
// take to do something else (a breaker's held items), passes the wake on: the item is
// taken by the worker that still waits, not left in the lane until the first comes back.
func TestConsumerLeavingAWakePassesItOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		q := newQueue[int](4, 2)
		snd := q.outlet(ctx)(new(hand))
		stats := make([]workerStats, 2)
		a, b := newConsumer(q, 0, 0, &stats[0], 4), newConsumer(q, 0, 1, &stats[1], 4)
		errElsewhere := errors.New("something else to do")
		other := make(chan struct{})
		var took []int
		var wg sync.WaitGroup
		wg.Go(func() { // b: waits for items only
			for {
				if _, ok, _ := b.take(ctx, 1, 0, nil); !ok {
					return
				}
				took = append(took, b.next().v)
			}
		})
		synctest.Wait() // b waits
		aErr := make(chan error, 1)
		wg.Go(func() { // a: its wait ends on another signal, and it leaves take
			_, _, err := a.take(ctx, 1, 0, func(<-chan struct{}) (bool, error) {
				<-other
				return false, errElsewhere
			})
			aErr <- err
		})
		synctest.Wait() // a waits, last on the list: the next put wakes it

		if err := snd.put(1, noPos); err != nil {
			t.Fatalf("put: %v", err)
		}
		if err := snd.flush(); err != nil {
			t.Fatalf("flush: %v", err)
		}
		close(other) // a's wait ends on the other signal, after its wake was sent
		synctest.Wait()
		require.ErrorIs(t, <-aErr, errElsewhere)
		assert.Equal(t, []int{1}, took, "taken by b while a was away")

		q.close()
		wg.Wait()
	})
}

// TestQueueFeedStopIsNoEnd: a queue fed by a slice source is closed from the start
// (the source has nothing left to send), yet while items are left a worker's take
// reports the end of its input only once they are all taken, not when the run stops:
// then it reports the stop, so that the stage does not close the next queue as if its
// input had ended. A drained budget ends the feed: then it is the end.
func TestQueueFeedStopIsNoEnd(t *testing.T) {
	t.Parallel()
	src := &row{workers: make([]workerStats, 1)}
	q := newQueue[int](4, 1)
	require.True(t, q.fedBy([]int{1, 2, 3, 4, 5, 6}, src))
	require.False(t, q.fedBy([]int{7}, src), "a second feed")
	q.close()
	c := consumer[int]{q: q, id: 0, wt: newWaiter(), run: make([]item[int], chunk)}
	k, seq, _, closed, _ := c.takeOrPark(t.Context(), chunk, 0)
	require.Equal(t, 5, k, "the first item and the room for 4 more")
	assert.Zero(t, seq)
	assert.False(t, closed)
	assert.Equal(t, int64(5), src.workers[0].emitted.load(), "sent, in the source's row")
	q.started(0, 4)

	q.stop()
	k, _, _, closed, parked := c.takeOrPark(t.Context(), chunk, 0)
	assert.Zero(t, k)
	assert.False(t, closed, "the run stopped with an item left: not the end of the input")
	assert.False(t, parked)

	src.drain.Store(true)
	_, _, _, closed, _ = c.takeOrPark(t.Context(), chunk, 0)
	assert.True(t, closed, "a drained budget ends the feed")
}

// TestQueueItemsHandedOverAtOnce drives a plain queue with producers that hand each
// item over at once (their hand's last set, as a trickle's every item: placeOne, or
// reservePlace when the queue is full) and workers that take runs of one item through
// their consumer and start them later. Every item arrives exactly once, the room in use
// never exceeds the capacity, and no item waits in the ring while its worker sleeps
// (synctest fails a run whose goroutines all block).
func TestQueueItemsHandedOverAtOnce(t *testing.T) {
	for _, capacity := range []int{1, 2, 64} {
		t.Run(fmt.Sprintf("capacity=%d", capacity), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const producers, workers, perProducer = 3, 2, 500
				q := newQueue[int](capacity, workers)
				out := q.outlet(t.Context())
				var mu sync.Mutex
				check, exceeded := roomWatch(q)
				var pwg, wwg sync.WaitGroup
				for p := range producers {
					pwg.Go(func() {
						snd := out(&hand{last: true})
						for i := range perProducer {
							if err := snd.put(p*perProducer+i, noPos); err != nil {
								t.Errorf("put: %v", err)
								return
							}
							check()
							if i%7 == 0 {
								time.Sleep(time.Microsecond) // some items find the workers parked
							}
						}
						if err := snd.flush(); err != nil {
							t.Errorf("flush: %v", err)
						}
					})
				}
				seen := make([]int, producers*perProducer)
				stats := make([]workerStats, workers)
				for i := range workers {
					c := newConsumer(q, 0, i, &stats[i], capacity)
					wwg.Go(func() {
						for {
							if _, ok, err := c.take(t.Context(), 1, 0, nil); !ok {
								if err != nil {
									t.Errorf("take: %v", err)
								}
								return
							}
							check()
							v := c.next().v
							mu.Lock()
							seen[v]++
							mu.Unlock()
						}
					})
				}
				pwg.Wait()
				q.close()
				wwg.Wait()
				assert.False(t, exceeded(), "more room in use than the capacity")
				for v, n := range seen {
					if n != 1 {
						t.Fatalf("item %d arrived %d times", v, n)
					}
				}
				assert.Zero(t, q.unsentCount(), "unsent")
				assert.Zero(t, q.length(), "left in the ring")
			})
		})
	}
}

// TestConsumerParkedAfterCancelIsWokenByStop: a consumer does not read its run's
// context when it parks on an empty lane; one that parks after the context is done is
// woken by the queue's stop, which the run calls once its context is done, and its take
// returns the run's cause.
func TestConsumerParkedAfterCancelIsWokenByStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(t.Context())
		cause := errors.New("stop")
		cancel(cause)
		q := newQueue[int](4, 1)
		var stats workerStats
		c := newConsumer(q, 0, 0, &stats, 4)
		errc := make(chan error, 1)
		go func() {
			_, ok, err := c.take(ctx, 1, 0, nil)
			if ok {
				err = errors.New("took an item from an empty queue")
			}
			errc <- err
		}()
		synctest.Wait() // parked, or returned
		q.stop()
		require.ErrorIs(t, <-errc, cause)
		_, ok, err := c.take(ctx, 1, 0, nil) // a stopped queue parks no one
		assert.False(t, ok)
		require.ErrorIs(t, err, cause)
	})
}

// roomWatch returns check, which notes whether the room in use in q (in the ring,
// reserved, taken and not started) exceeds its bound now, and exceeded, which reports
// whether it ever did.
func roomWatch[T any](q *queue[T]) (check func(), exceeded func() bool) {
	var over atomic.Bool
	return func() {
		q.mu.Lock()
		if q.usedLocked()+q.reserved > q.limit() {
			over.Store(true)
		}
		q.mu.Unlock()
	}, over.Load
}
