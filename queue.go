package pipeline

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// DefaultBuffer is the capacity of a stage's input queue when neither the stage nor the
// pipeline sets one with [WithBuffer]. With it, a pipeline of k stages holds at most
// about k×64 items in its queues, plus the items each producer and worker has in hand,
// whatever the input size.
const DefaultBuffer = 64

// WithBuffer sets the capacity of a stage's input queue: at most n items wait for the
// stage's workers, and a producer that finds the queue full blocks (backpressure). Zero
// makes the queue unbuffered: a producer waits until a worker has taken its item. Given
// to [New], it sets the default for every stage. It panics if n is negative. The default
// is [DefaultBuffer].
func WithBuffer(n int) BufferOption {
	if n < 0 {
		panic(fmt.Sprintf("pipeline: WithBuffer(%d): the buffer must not be negative", n))
	}
	return BufferOption{n}
}

// chunk is the most items a producer holds before it hands them over, and the most a
// worker takes from its queue at once. Moving items in runs is what keeps the cost of a
// queue per item a fraction of a channel operation's: one lock per run, not per item.
const chunk = 64

// counter is a statistic with exactly one writer (the goroutine that owns it) and any
// number of readers. The writer adds with a plain load and store; on amd64 the store is
// an XCHG, a locked instruction, so hot paths add once per run of items, not per item.
type counter struct{ v atomic.Int64 }

func (c *counter) inc()        { c.v.Store(c.v.Load() + 1) }
func (c *counter) add(n int64) { c.v.Store(c.v.Load() + n) }

// addNonZero adds n unless it is 0: the store is a locked instruction on amd64, and
// most of a tally's counts are 0 in most runs.
func (c *counter) addNonZero(n int64) {
	if n != 0 {
		c.add(n)
	}
}
func (c *counter) load() int64 { return c.v.Load() }
func (c *counter) max(n int64) { // single writer, so no CAS loop is needed
	if n > c.v.Load() {
		c.v.Store(n)
	}
}

// recv takes the next item from ch, blocking while ch is empty. ok is false when ch is
// closed and drained; err is the run's cause when ctx is done first. It takes nothing
// once ctx is done: a select with a value ready takes it even then, and the value,
// emitted into a stopped run, was lost to the caller's channel (FromChan leaves what it
// has not taken in ch).
func recv[T any](ctx context.Context, ch <-chan T) (v T, ok bool, err error) {
	if ctx.Err() != nil {
		return v, false, context.Cause(ctx)
	}
	select {
	case v, ok = <-ch:
		return v, ok, nil
	default:
	}
	select {
	case v, ok = <-ch:
		return v, ok, nil
	case <-ctx.Done():
		return v, false, context.Cause(ctx)
	}
}

// noPos is the position of an item that no checkpoint tracks.
const noPos = ^uint64(0)

// item is what a queue carries: the value and, in a checkpointed run, the position in
// the source of the item it derives from (noPos otherwise). Carrying it always keeps one
// code path; it costs 8 bytes per queued item.
type item[T any] struct {
	v   T
	pos uint64
}

// pushFunc hands one item on. It blocks while the consumer's queue is full and returns
// the run's cause once the run is stopping.
type pushFunc[T any] = func(v T, pos uint64) error

// sender is one producing goroutine's way into the queue (or queues, through a Tee) of
// its consumer: put hands an item on, or holds it until the next flush; flush hands over
// everything held; drop counts what is held as never sent, for a goroutine that is
// failing (a panic in user code). A sender belongs to one goroutine: it is not safe for
// concurrent use. Every put is followed, sooner or later, by a flush or a drop.
type sender[T any] struct {
	put   pushFunc[T]
	flush func() error
	drop  func()
	// putRun, when not nil, puts untracked items vs as put would one by one, with no
	// call per item (a plain queue's sender, an inline window's, a ForEach's): it
	// returns how many it took, all unless the run stops or fn of a ForEach fails one
	// (that one included, counted unsent or failed as by put). Before it may wait for
	// room to put vs[done], it calls before(done), so that the producer's counts show
	// that item in flight while it waits; a ForEach calls it too when fn panics at
	// vs[done].
	putRun func(vs []T, before func(done int)) (int, error)
	// track is the run's tracker: the sender is how a producer derives and settles the
	// positions of what it sends (split, group, ungroup, settle, setAside, in
	// tracker.go; DESIGN.md, section 4). Every sender of a run carries it; the methods pass over noPos, so
	// that an untracked run makes no call.
	track tracker
}

// outlet makes a sender for each goroutine that produces a stream, given the
// goroutine's hand. Inline operators wrap the outlet of their consumer.
type outlet[T any] = func(h *hand) sender[T]

// hand is what one producing goroutine holds for the queues it sends into (several,
// through a Tee): before it waits for room in one, it places what it holds for the
// others, so that no item waits in the hand of a blocked goroutine when it could be in
// a queue.
type hand struct {
	row     *row // the row whose goroutine this is: an inline operator's panic is its (nil: unknown)
	last    bool // the goroutine hands over its next item at once (the last of its run)
	placers []func()
	waits   []func() // before the goroutine waits: publish its counts
}

// placeAll places what the goroutine holds for every queue, and publishes its counts:
// it is about to wait.
func (h *hand) placeAll() {
	for _, place := range h.placers {
		place()
	}
	for _, f := range h.waits {
		f()
	}
}

// waiter is how a goroutine sleeps on a queue: the queue wakes it with a token in ch.
// Each goroutine has its own, so a wake is never lost to another waiter.
type waiter struct{ ch chan struct{} }

func newWaiter() *waiter { return &waiter{ch: make(chan struct{}, 1)} }

func (w *waiter) wake() {
	select {
	case w.ch <- struct{}{}:
	default: // a token is already there
	}
}

// lane is one consumer group's part of a queue: the only one of a plain or ordered
// stage, one per worker of a keyed stage.
type lane[T any] struct {
	buf     []item[T] // a ring
	head, n int
	waiting []*waiter // consumers waiting for an item
}

// queue is a stage's bounded input: a ring of items under one mutex, which producers
// fill and workers empty in runs. capacity bounds the items in it: those waiting in
// the ring, the room producers have reserved for items they hold, and the items workers
// have taken in a run but not started yet. So a worker busy with an item holds one item
// beyond its queue, and a producer waiting for room one item, as with a channel; 0 is a
// rendezvous: a producer waits until a worker has taken its item.
//
// A producer reserves room for several items under the lock (grant), then puts items
// in its own buffer without it, and places them in the ring at the next reservation or
// flush; a worker takes a run of items under the lock and gives back each item's room
// as it starts the item: the first at once (consumer.take), each other one with a store to a
// count of its own (started) before its function is called, since the function may wait
// for the producers. A keyed queue (hash) has a lane per worker; items are numbered in
// the order they enter (ordered stages take from one lane).
type queue[T any] struct {
	mu        sync.Mutex
	lanes     []lane[T]
	capacity  int
	n         int            // items in the ring
	reserved  int            // room reserved by producers, not yet filled
	starts    []startCount   // per worker: items taken and then started (or dropped)
	hash      func(T) uint64 // WithKey: the lane of an item
	puts      uint64         // items placed: the sequence number of the next (ordered stages)
	takes     uint64         // items taken by the workers
	early     uint64         // items taken that counted as started at once (consumer.take)
	earlyBy   []int64        // per worker: its part of early (for the report)
	closed    bool
	stopped   bool      // the run is stopping: no one sleeps any more
	producers []*waiter // waiting for room, or for their item to be taken
	feed      *feed[T]  // a slice source's items, taken in place (FromSlice straight into a stage)
	unsent    atomic.Int64
	_         [64]byte     // pwait is read by every worker for every item: a line of its own
	pwait     atomic.Int32 // 1 while producers may wait for room: a worker that starts an item wakes them
	_         [60]byte
}

// startCount is one worker's count of the items it started, on a cache line of its
// own: written with a plain load and store by its worker alone, read by producers and
// by the report (a worker's items in flight, see row.inFlight).
type startCount struct {
	v atomic.Int64
	_ [56]byte
}

// add counts k items started, and reports whether producers wait for room (pwait):
// then the caller wakes them. Not generic, so that it inlines where an item starts.
func (c *startCount) add(k int, pwait *atomic.Int32) bool {
	c.v.Store(c.v.Load() + int64(k))
	return pwait.Load() != 0
}

// feed is the items of a slice source that sends straight into a stage's plain queue:
// no goroutine puts them in the ring; a worker that finds the ring empty takes its next
// run of them in place (takeFedLocked), as if the source had placed them just before,
// and counts them sent in the source's row. It is the queue's, under q.mu.
type feed[T any] struct {
	items []T
	next  int          // the first not taken
	src   *workerStats // the source's counts: received, and sent as they are taken
	drain *atomic.Bool // the source's row's: a drained budget, take no more
}

// left returns how many of the feed's items a worker may still take.
func (f *feed[T]) left() int {
	if f == nil || f.drain.Load() {
		return 0
	}
	return len(f.items) - f.next
}

// fedBy makes items, the items of the slice source whose row is src, the queue's feed,
// and reports whether it did: only a plain queue with room takes one, and only one
// (a Merge of several inputs gives its sources no feed). The source then has nothing
// left to send: it calls done at once.
func (q *queue[T]) fedBy(items []T, src *row) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.hash != nil || q.capacity == 0 || q.feed != nil {
		return false
	}
	q.feed = &feed[T]{items: items, src: &src.workers[0], drain: &src.drain}
	return true
}

// takeFedLocked is takeOrPark's take of a run of the feed's items into dst, at most
// left of them, when the ring is empty: they are numbered from puts, as if placed, and
// counted taken. The bound holds as for the ring's items: beyond the first, which it
// starts at once, a worker takes only as many as the queue has room for (at least
// one, never waiting). It unlocks q.mu.
func (q *queue[T]) takeFedLocked(dst []item[T], left, first int) (k int, seq uint64, queued int) {
	f := q.feed
	used := q.usedLocked()
	queued = used + min(left, q.capacity) // as the source kept the ring full
	k = min(len(dst), left, max(q.limit()-q.reserved-used, 0)+1)
	for j, v := range f.items[f.next : f.next+k] {
		dst[j] = item[T]{v, noPos}
	}
	f.next += k
	seq = q.puts
	q.puts += uint64(k)
	q.takes += uint64(k)
	if first >= 0 {
		q.early++
		q.earlyBy[first]++
	}
	f.src.received.add(int64(k)) // one writer at a time: under q.mu
	f.src.succeeded.add(int64(k))
	f.src.emitted.add(int64(k))
	q.mu.Unlock()
	return k, seq, queued
}

// newQueue returns a queue of one lane taken by takers workers.
func newQueue[T any](capacity, takers int) *queue[T] {
	q := &queue[T]{capacity: capacity, lanes: make([]lane[T], 1), starts: make([]startCount, takers), earlyBy: make([]int64, takers)}
	q.lanes[0] = lane[T]{buf: make([]item[T], max(capacity, 1))}
	return q
}

// newKeyedQueue returns a queue with a lane per worker, chosen by hash. Each lane can
// hold the whole capacity (every item may have one key).
func newKeyedQueue[T any](workers, capacity int, hash func(T) uint64) *queue[T] {
	q := &queue[T]{capacity: capacity, lanes: make([]lane[T], workers), hash: hash, starts: make([]startCount, workers), earlyBy: make([]int64, workers)}
	for i := range q.lanes {
		q.lanes[i] = lane[T]{buf: make([]item[T], max(capacity, 1))}
	}
	return q
}

// limit is how many items the queue may hold at once: a rendezvous holds one, whose
// producer waits for it to be taken.
func (q *queue[T]) limit() int { return max(q.capacity, 1) }

// grant is how much room a producer reserves at once: a chunk, or less in a small
// queue, so that several producers share it.
func (q *queue[T]) grant() int { return max(1, min(chunk, q.limit()/2)) }

// wakeSome wakes up to n waiters of list.
func wakeSome(list *[]*waiter, n int) {
	for ; n > 0 && len(*list) > 0; n-- {
		last := len(*list) - 1
		(*list)[last].wake()
		(*list)[last] = nil
		*list = (*list)[:last]
	}
}

// wakeOne wakes the last waiter of list, which is not empty: wakeSome(list, 1) without
// its loop.
func wakeOne(list *[]*waiter) {
	last := len(*list) - 1
	w := (*list)[last]
	(*list)[last] = nil
	*list = (*list)[:last]
	w.wake()
}

// usedLocked is how many items the bound counts now: in the ring, and taken by
// workers but not started.
func (q *queue[T]) usedLocked() int {
	var started int64
	for i := range q.starts {
		started += q.starts[i].v.Load()
	}
	return q.n + int(int64(q.takes-q.early)-started)
}

// wakeProducersLocked wakes every producer that waits.
func (q *queue[T]) wakeProducersLocked() {
	q.pwait.Store(0)
	wakeSome(&q.producers, len(q.producers))
}

// reserve places items (for which room was reserved before) in the ring and reserves
// room for up to want more, waiting until there is some: it returns the room reserved,
// or the run's cause if the run stops first. lanes, for a keyed queue, has each item's
// lane. w is the producer's waiter.
func (q *queue[T]) reserve(ctx context.Context, w *waiter, items []item[T], lanes []uint32, want int, h *hand) (int, error) {
	return q.reservePlace(ctx, w, items, lanes, want, h, nil, 0)
}

// reservePlace is reserve that, once it has room, also places now (with its lane) in
// it, under the same lock: an item a producer would hand over right after.
//
// It unlocks by hand, not deferred (a producer of a trickle calls it for every item:
// S5 latency about 15 instructions a call), and only where it returns or lets other
// queues be placed: nothing it calls under the lock runs user code.
func (q *queue[T]) reservePlace(ctx context.Context, w *waiter, items []item[T], lanes []uint32, want int, h *hand, now *item[T], nowLane uint32) (int, error) {
	q.mu.Lock()
	if len(items) > 0 {
		q.placeLocked(items, lanes)
	}
	placed := false // what the goroutine holds for other queues
	for {
		room := q.limit() - q.reserved - q.usedLocked()
		if room <= 0 {
			// pwait is set before the workers' counts are read again: a worker that
			// starts an item after this read sees it, and wakes the producers.
			q.pwait.Store(1)
			room = q.limit() - q.reserved - q.usedLocked()
		}
		if room > 0 {
			if len(q.producers) == 0 && q.pwait.Load() != 0 {
				q.pwait.Store(0)
			}
			r := min(room, want)
			q.reserved += r
			if now != nil {
				one, ln := [1]item[T]{*now}, [1]uint32{nowLane}
				var lanes []uint32
				if q.hash != nil {
					lanes = ln[:]
				}
				q.placeLocked(one[:], lanes)
				r--
			}
			q.mu.Unlock()
			return r, nil
		}
		if !placed && h != nil { // place the rest first, unlocked
			placed = true
			q.mu.Unlock()
			h.placeAll()
			q.mu.Lock()
			continue
		}
		if !q.sleepLocked(ctx, w, &q.producers) {
			q.mu.Unlock()
			return 0, context.Cause(ctx)
		}
	}
}

// placeOne places it in a plain queue's ring, if there is room for it now, under one
// lock, and reports whether it did: the common case of reservePlace for an item handed
// over at once (a producer's last, a trickle's every item), in one lane, without its
// reservation, its loop and its calls (S5 latency: a producer's hop from about 250
// instructions to about 100). Without room it places nothing: reservePlace then waits.
func (q *queue[T]) placeOne(it item[T]) bool {
	q.mu.Lock()
	if q.limit()-q.reserved-q.usedLocked() <= 0 {
		q.mu.Unlock()
		return false
	}
	if len(q.producers) == 0 && q.pwait.Load() != 0 {
		q.pwait.Store(0) // as reservePlace: no producer waits for room
	}
	q.checkOpenLocked()
	l := &q.lanes[0]
	l.buf[l.tail()] = it
	l.n++
	q.n++
	q.puts++
	if len(l.waiting) > 0 {
		wakeOne(&l.waiting) // as placedLocked: one worker
	}
	q.mu.Unlock()
	return true
}

// sleepLocked puts w on list and sleeps until a waker takes it off and wakes it; q.mu
// is held when it is called and when it returns. It returns false, without sleeping or
// after waking, when the run is stopping (stop wakes every sleeper). A plain receive
// costs less than a select over the run's done channel as well.
func (q *queue[T]) sleepLocked(ctx context.Context, w *waiter, list *[]*waiter) bool {
	if q.stopped || ctx.Err() != nil {
		return false
	}
	*list = append(*list, w)
	q.mu.Unlock()
	<-w.ch
	q.mu.Lock()
	return !q.stopped && ctx.Err() == nil
}

// stop wakes every goroutine that sleeps on the queue, for good: the run is stopping.
func (q *queue[T]) stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopped = true
	for i := range q.lanes {
		l := &q.lanes[i]
		wakeSome(&l.waiting, len(l.waiting))
	}
	q.wakeProducersLocked()
}

// placeLocked puts items, for which room was reserved, in the ring and wakes workers.
func (q *queue[T]) placeLocked(items []item[T], lanes []uint32) {
	if len(items) == 0 {
		return
	}
	q.checkOpenLocked()
	if lanes == nil {
		q.lanes[0].push(items)
	} else {
		for i, it := range items {
			l := &q.lanes[lanes[i]]
			l.buf[l.tail()] = it
			l.n++
		}
	}
	q.reserved -= len(items)
	q.placedLocked(len(items))
}

// checkOpenLocked panics if q is closed: nothing is sent after that.
func (q *queue[T]) checkOpenLocked() {
	if q.closed {
		panic("pipeline: internal error: an item was sent after its queue was closed")
	}
}

// placedLocked counts k items just pushed into the lanes' rings, and wakes a waiting
// worker of each lane that has items.
func (q *queue[T]) placedLocked(k int) {
	q.n += k
	q.puts += uint64(k)
	for i := range q.lanes {
		if l := &q.lanes[i]; l.n > 0 && len(l.waiting) > 0 {
			wakeSome(&l.waiting, 1) // one worker; it wakes another if it leaves items
		}
	}
}

// finish places items and gives back unused room; for a rendezvous, it waits until a
// worker has taken the last item placed (the run's cause if the run stops first: the
// item is then taken back, and counted as unsent by the caller).
func (q *queue[T]) finish(ctx context.Context, w *waiter, items []item[T], lanes []uint32, unused int, h *hand) (placed int, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.placeLocked(items, lanes)
	if unused > 0 {
		q.reserved -= unused
		if len(q.producers) > 0 {
			q.wakeProducersLocked()
		}
	}
	if q.capacity > 0 || len(items) == 0 {
		return len(items), nil
	}
	others := h != nil
	for mine := q.puts; q.takes < mine; {
		if others { // place what the goroutine holds for other queues first, unlocked
			others = false
			q.mu.Unlock()
			h.placeAll()
			q.mu.Lock()
			continue
		}
		if !q.sleepLocked(ctx, w, &q.producers) {
			if q.takes < mine { // still there: the only item of the ring
				for i := range q.lanes {
					if l := &q.lanes[i]; l.n > 0 {
						l.n--
						l.buf[l.tail()] = item[T]{}
					}
				}
				q.n--
				q.puts--
				return len(items) - 1, context.Cause(ctx)
			}
			return len(items), nil
		}
	}
	return len(items), nil
}

// takeOrPark moves up to n items of c's lane into c.run without waiting: k items, the
// first with sequence number seq (ordered stages), and queued, the items that were in
// the queue before. closed is true when the lane is empty and no item will come. The
// items keep their room until the consumer starts them (started). Finding the lane
// empty and open, it puts c.wt (if not nil) on its waiting list, under the same lock
// (parked), unless the queue is stopped; a slice source's feed goes first, while ctx
// is not done. Parking does not read ctx: the run stops every queue once its context
// is done (queue.stop, from context.AfterFunc), which wakes every consumer parked
// before, so one that parks as the run stops is woken at once (a call of the context's
// Err cost S5 latency about 20 instructions a park, 4 parks per item).
//
// share, when other workers of the lane wait, is the least run worth waking one of
// them for: the worker then takes an equal share of what waits, but at least that, and
// leaves the rest to them (0: take all it asked for). With c.id >= 0, the first item
// taken counts as started at once by worker c.id (who starts it next): its room is
// free.
//
// It is the consumer's method, reading its lane, run, waiter and id from it, rather
// than the queue's with them as arguments: an idle consumer calls it twice per item it
// takes (to park, then to take), and the arguments' set-up and spills cost S5 latency
// about 20 instructions a call. It unlocks by hand, not deferred (a deferred unlock
// cost about 30 a call). Nothing between the lock and the unlocks calls user code.
func (c *consumer[T]) takeOrPark(ctx context.Context, n, share int) (k int, seq uint64, queued int, closed, parked bool) {
	q := c.q
	q.mu.Lock()
	l := &q.lanes[c.lane]
	if l.n == 0 {
		if left := q.feed.left(); left > 0 && !q.stopped && ctx.Err() == nil {
			k, seq, queued = q.takeFedLocked(c.run[:n], left, c.id)
			return k, seq, queued, false, false
		}
		if c.wt != nil && !q.closed && !q.stopped {
			l.waiting = append(l.waiting, c.wt)
			parked = true
		}
		closed = q.closed && q.feed.left() == 0 // a feed with items left: the run is stopping, its input has not ended
		q.mu.Unlock()
		return 0, 0, 0, closed, parked
	}
	queued = q.usedLocked()
	seq = q.puts - uint64(q.n) // one lane when ordered: its head is the oldest item
	// As much as the worker asked for: waking another worker costs more than a run of
	// fast items, and a slow function asks for few (the rest goes to the next worker).
	k = min(n, l.n)
	if share > 0 && len(l.waiting) > 0 {
		k = min(k, max(share, (l.n+len(l.waiting))/(len(l.waiting)+1)))
	}
	if k == 1 { // a trickle's item: without pop's call
		l.popOne(&c.run[0])
	} else {
		l.pop(c.run[:k])
	}
	q.n -= k
	q.takes += uint64(k)
	if c.id >= 0 {
		q.early++
		q.earlyBy[c.id]++
		if len(q.producers) > 0 {
			q.wakeProducersLocked()
		}
	}
	if l.n > 0 && len(l.waiting) > 0 {
		wakeOne(&l.waiting) // items are left: the next worker, who wakes the next
	}
	if q.capacity == 0 && len(q.producers) > 0 {
		q.wakeProducersLocked() // a rendezvous: the item is taken
	}
	q.mu.Unlock()
	return k, seq, queued, false, false
}

// started gives back the room of k items worker i took and has now started (or will
// never start), waking the producers if they wait for it. It costs a store on the
// worker's own cache line and a load.
func (q *queue[T]) started(i, k int) {
	if q.starts[i].add(k, &q.pwait) {
		q.wakeProducers()
	}
}

// wakeProducers wakes every producer that waits for room.
func (q *queue[T]) wakeProducers() {
	q.mu.Lock()
	q.wakeProducersLocked()
	q.mu.Unlock()
}

// unpark ends a consumer's wait on lane i that no token ended (consumer.take's idle
// returned not woken): it takes w off the waiting list or, if a waker took it off
// first, drains the token that waker sent.
//
// The protocol: a waiter's channel holds a token only from the moment a waker takes it
// off a list (wakeSome, which sends under q.mu) until its consumer receives it, so a
// consumer that parks has an empty channel, and a token it receives means it is off
// the list. A wait that ends otherwise (a breaker's signal, a timer) may end just after
// a waker took w off: under q.mu, w is then off the list and its token is in its
// channel. Left there, the next wait would take it for a wake while w was parked again,
// and take would park w a second time: a later wake could go to that second entry
// while the worker was busy, and leave its item queued while another worker slept.
// Draining it loses no wake: take looks at the lane again, under the lock, before it
// waits again. Unless it leaves take (leaving: its idle hook returned an error, such as
// a breaker's held items to try): then the wake goes on to a worker that waits, if the
// lane still holds items, rather than leave them queued until this one comes back.
func (q *queue[T]) unpark(i int, w *waiter, leaving bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := &q.lanes[i]
	if j := slices.Index(l.waiting, w); j >= 0 {
		l.waiting = slices.Delete(l.waiting, j, j+1)
		return
	}
	select {
	case <-w.ch: // a waker's token, sent as the wait ended otherwise
		if leaving && l.n > 0 {
			wakeSome(&l.waiting, 1) // the items it was woken for: to a worker that waits
		}
	default:
	}
}

// takeWait takes a run of items of lane i into dst, waiting while the lane is empty.
// ok is false when the lane is closed and drained, or (with ctx's cause) when the
// queue is stopped first. Consumers take through a consumer; tests of the queue alone use this.
func (q *queue[T]) takeWait(ctx context.Context, i int, w *waiter, dst []item[T], share int) (k int, seq uint64, queued int, ok bool, err error) {
	c := consumer[T]{q: q, lane: i, id: -1, wt: w, run: dst} // no worker counts its first item started
	for {
		k, seq, queued, closed, parked := c.takeOrPark(ctx, len(dst), share)
		if k > 0 {
			return k, seq, queued, true, nil
		}
		if closed {
			return 0, 0, 0, false, nil
		}
		if !parked { // the run is stopping
			return 0, 0, 0, false, context.Cause(ctx)
		}
		<-w.ch // woken by a producer, by close, or by stop
	}
}

// close marks the end of the input: the workers take what is left, then stop.
func (q *queue[T]) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for i := range q.lanes {
		l := &q.lanes[i]
		wakeSome(&l.waiting, len(l.waiting))
	}
}

// length returns the items waiting in the ring, not yet taken by a worker.
func (q *queue[T]) length() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return min(q.n, q.capacity) // a rendezvous's item is its producer's, still
}

// occupancy returns the items in the queue as its bound counts them: in the ring, and
// taken by workers but not started. A feed's items not taken count too, as far as the
// bound has room, as if its source had kept the ring full (after a stop as well: the
// ring would have held them); they are the source's in the accounting (length).
func (q *queue[T]) occupancy() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return min(q.usedLocked()+q.feed.left(), q.capacity)
}

func (q *queue[T]) unsentCount() int64 { return q.unsent.Load() }

// startedBy returns the items worker i took and then started or gave back, the first
// of each of its runs included (for the report).
func (q *queue[T]) startedBy(i int) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.starts[i].v.Load() + q.earlyBy[i]
}

// outlet returns the queue's outlet: each sender reserves room for a chunk of items at
// once, holds them, and places them in the ring together. Its senders carry no tracker:
// wireInput gives them the run's.
func (q *queue[T]) outlet(ctx context.Context) outlet[T] {
	return func(h *hand) sender[T] {
		s := &queueSender[T]{q: q, ctx: ctx, w: newWaiter(), h: h}
		if h != nil {
			h.placers = append(h.placers, s.place)
		}
		snd := sender[T]{put: s.putMore, drop: s.drop}
		snd.flush = func() error {
			if len(s.buf) == 0 && s.avail == 0 {
				return nil // nothing held (a trickle's every run): one call, not the method value's two
			}
			return s.flush()
		}
		if q.hash == nil && q.capacity > 0 { // one lane, room for more than one item
			// An item for which room is reserved joins the buffer in the function the
			// producer calls (the method value alone would add a call per item).
			snd.put = func(v T, pos uint64) error {
				if s.avail > 0 {
					s.avail--
					s.buf = append(s.buf, item[T]{v, pos})
					return nil
				}
				if len(s.buf) == 0 && s.h != nil && s.h.last && q.placeOne(item[T]{v, pos}) {
					return nil // handed over at once, the queue having room (a trickle's item)
				}
				return s.putMore(v, pos)
			}
			snd.putRun = s.putRun
		}
		return snd
	}
}

// queueSender is a producer's sender into one queue.
type queueSender[T any] struct {
	q     *queue[T]
	ctx   context.Context
	w     *waiter
	buf   []item[T] // held, in reserved room
	lanes []uint32  // keyed queues: the lane of each item of buf
	avail int       // room reserved and not yet used
	h     *hand
	busy  bool // in reserve: its items are being placed
}

// place puts the items held in the ring, keeping the room reserved for more.
func (s *queueSender[T]) place() {
	if s.busy || len(s.buf) == 0 {
		return
	}
	s.q.mu.Lock()
	s.q.placeLocked(s.buf, s.lanes)
	s.q.mu.Unlock()
	s.reset()
}

// putMore is the sender's put (outlet) for an item that needs more than its place in
// the buffer: room to reserve, a lane, a rendezvous.
func (s *queueSender[T]) putMore(v T, pos uint64) error {
	var lane uint32
	if s.q.hash != nil { // user code: in the producer's goroutine, outside the lock
		lane = uint32(s.q.hash(v) % uint64(len(s.q.lanes)))
	}
	if s.avail == 0 && len(s.buf) == 0 && s.h != nil && s.h.last && s.q.capacity > 0 {
		// The item is handed over at once: reserve its room and place it in one lock.
		it := item[T]{v, pos}
		if _, err := s.q.reservePlace(s.ctx, s.w, nil, nil, 1, s.h, &it, lane); err != nil {
			s.q.unsent.Add(1)
			return err
		}
		return nil
	}
	if s.avail == 0 {
		if err := s.refill(); err != nil {
			return err
		}
	}
	s.avail--
	s.buf = append(s.buf, item[T]{v, pos})
	if s.q.hash != nil {
		s.lanes = append(s.lanes, lane)
	}
	if s.q.capacity == 0 { // a rendezvous: the put waits until a worker takes the item
		return s.flush()
	}
	return nil
}

// refill places what the sender holds and reserves room for more, waiting for it; when
// the run stops first, the item the caller was about to put is counted unsent (rare).
func (s *queueSender[T]) refill() error {
	if s.buf == nil {
		s.buf = make([]item[T], 0, min(chunk, s.q.grant()))
	}
	s.busy = true
	r, err := s.q.reserve(s.ctx, s.w, s.buf, s.lanes, s.q.grant(), s.h)
	s.busy = false
	s.reset()
	if err != nil {
		s.q.unsent.Add(1)
		return err
	}
	s.avail = r
	return nil
}

// putRun is put for untracked items vs, into a plain queue with room for more than one
// (see sender.putRun). Holding nothing, it places what the ring has room for straight
// into it (placeNow); the rest goes through its buffer, in reserved room, as put's
// items do.
func (s *queueSender[T]) putRun(vs []T, before func(done int)) (int, error) {
	done := 0
	for done < len(vs) {
		if s.avail == 0 {
			if len(s.buf) == 0 { // nothing held that must go first
				if done += s.placeNow(vs[done:]); done == len(vs) {
					break
				}
			}
			before(done)
			if err := s.refill(); err != nil {
				return done + 1, err
			}
		}
		n := min(s.avail, len(vs)-done)
		b := len(s.buf)
		s.buf = slices.Grow(s.buf, n)[:b+n] // no append per item: its length and capacity tests
		src, dst := vs[done:done+n], s.buf[b:b+n]
		for k := range dst {
			dst[k] = item[T]{src[k], noPos}
		}
		s.avail -= n
		done += n
	}
	return done, nil
}

// placeNow places as many of vs as the queue has room for in its ring, under one lock,
// and returns how many: no reservation and no copy into the sender's buffer, so that a
// run handed on whole (a window's stretch of outputs, a slice source's chunk) is
// copied once, into the ring. It never waits. The sender holds nothing (buf empty, no
// room reserved), so vs come after everything it sent.
func (s *queueSender[T]) placeNow(vs []T) int {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	k := min(q.limit()-q.reserved-q.usedLocked(), len(vs))
	if k <= 0 {
		return 0
	}
	q.checkOpenLocked()
	q.lanes[0].pushValues(vs[:k])
	q.placedLocked(k)
	return k
}

func (s *queueSender[T]) flush() error {
	if len(s.buf) == 0 && s.avail == 0 {
		return nil
	}
	n := len(s.buf)
	s.busy = true
	placed, err := s.q.finish(s.ctx, s.w, s.buf, s.lanes, s.avail, s.h)
	s.busy = false
	if placed < n {
		s.q.unsent.Add(int64(n - placed))
	}
	s.avail = 0
	s.reset()
	return err
}

// drop gives back what the sender holds: its items are never sent.
func (s *queueSender[T]) drop() {
	if len(s.buf) == 0 && s.avail == 0 {
		return
	}
	s.q.unsent.Add(int64(len(s.buf)))
	s.q.mu.Lock()
	s.q.reserved -= len(s.buf) + s.avail
	s.q.wakeProducersLocked()
	s.q.mu.Unlock()
	s.avail = 0
	s.reset()
}

func (s *queueSender[T]) reset() {
	clear(s.buf)
	s.buf, s.lanes = s.buf[:0], s.lanes[:0]
}

// A run of items is copied into a lane's ring, and out of it, in at most two pieces,
// with no division per item (in an alternating A/B of 6 this took S5 1xP from 48.9 to
// 43.9 ns/item on the README's machine).

// tail is the index of the lane's first free place.
func (l *lane[T]) tail() int {
	t := l.head + l.n
	if t >= len(l.buf) {
		t -= len(l.buf)
	}
	return t
}

// push appends items to the lane's ring, which has room for them.
func (l *lane[T]) push(items []item[T]) {
	if len(items) == 1 { // a trickle's item: no copy's runtime call (S5 latency, per hop)
		l.buf[l.tail()] = items[0]
		l.n++
		return
	}
	n := copy(l.buf[l.tail():], items)
	copy(l.buf, items[n:])
	l.n += len(items)
}

// pushValues appends untracked items of values vs to the lane's ring, which has room
// for them.
func (l *lane[T]) pushValues(vs []T) {
	t := l.tail()
	a := l.buf[t:min(t+len(vs), len(l.buf))]
	for k := range a {
		a[k] = item[T]{vs[k], noPos}
	}
	b := l.buf[:len(vs)-len(a)]
	for k := range b {
		b[k] = item[T]{vs[len(a)+k], noPos}
	}
	l.n += len(vs)
}

// popOne moves the oldest item of the ring into dst and clears its place.
func (l *lane[T]) popOne(dst *item[T]) {
	*dst = l.buf[l.head]
	l.buf[l.head] = item[T]{}
	if l.head++; l.head == len(l.buf) {
		l.head = 0
	}
	l.n--
}

// pop moves the oldest len(dst) items of the ring into dst and clears their places.
func (l *lane[T]) pop(dst []item[T]) {
	k := len(dst)
	if k == 1 { // as push: no copy's or clear's runtime call
		l.popOne(&dst[0])
		return
	}
	n := copy(dst, l.buf[l.head:min(l.head+k, len(l.buf))])
	clear(l.buf[l.head : l.head+n])
	if n < k {
		copy(dst[n:], l.buf[:k-n])
		clear(l.buf[:k-n])
	}
	l.head += k
	if l.head >= len(l.buf) {
		l.head -= len(l.buf)
	}
	l.n -= k
}

// consumer is one goroutine's end of a queue: a stage's worker, the batcher and the
// collecting end of Collect and All all take their input through one. It takes a run
// of items at a time (take), hands them out in order (next), giving back each one's
// room in the queue as it is started (the first at take, since it is started next),
// gives back the room of those never started (rest), parks while its lane is empty,
// and keeps its goroutine's counts in a tally that it adds to the row's statistics
// before each take, so before every wait (commit): see DESIGN.md, section 3.
type consumer[T any] struct {
	q        *queue[T]
	lane     int       // its lane of q (keyed stages: a worker's own)
	id       int       // its index among the queue's takers
	wt       *waiter   // how it sleeps on q
	run      []item[T] // the run of items taken from q
	k, j     int       // the run's length, and the index of its next item
	t        tally     // outcomes since the last commit
	stats    *workerStats
	capacity int         // the queue's, for the peak it records
	starts   *startCount // its count in q.starts (worker.items gives back each item's room itself)
}

// newConsumer makes the consumer id of q. With q nil, it is the consumer of an inline
// window stage (window_inline.go), whose producer fills its run: it only hands out the
// run's items (next, rest) and keeps its tally (commit).
func newConsumer[T any](q *queue[T], lane, id int, stats *workerStats, capacity int) consumer[T] {
	c := consumer[T]{q: q, lane: lane, id: id, run: make([]item[T], chunk), stats: stats, capacity: capacity}
	if q != nil {
		c.wt, c.starts = newWaiter(), &q.starts[id]
	}
	return c
}

// take commits the counts of the last run and takes the next run of at most n items
// (0 < n <= chunk); share is takeOrPark's. While the lane is empty it parks: with idle
// nil it waits for a producer's token; otherwise idle is called, parked, with the
// waiter's channel to select on besides what else the consumer waits for, and reports
// whether that channel's token woke it (if not, take unparks it, which also drains a
// token that came as the wait ended otherwise: see unpark) and an error that ends the
// take. ok is false when the lane is closed and drained (err nil), when the run is
// stopping (its cause), or with idle's error. The run's first item is counted as
// started at once; seq is its sequence number (ordered stages).
func (c *consumer[T]) take(ctx context.Context, n, share int, idle func(wake <-chan struct{}) (woken bool, err error)) (seq uint64, ok bool, err error) {
	c.commit()
	for {
		k, seq, queued, closed, parked := c.takeOrPark(ctx, n, share)
		if k > 0 {
			c.k, c.j = k, 0
			c.stats.received.add(int64(k))
			c.stats.peak.max(int64(min(queued, c.capacity)))
			return seq, true, nil
		}
		if closed {
			return 0, false, nil
		}
		if !parked { // the run is stopping
			return 0, false, context.Cause(ctx)
		}
		if idle == nil {
			<-c.wt.ch // woken by a producer, by close, or by stop
			continue
		}
		woken, err := idle(c.wt.ch)
		if !woken {
			c.q.unpark(c.lane, c.wt, err != nil)
		}
		if err != nil {
			return 0, false, err
		}
	}
}

// next returns the run's next item, started: its room in the queue is free (the first
// item's since take).
func (c *consumer[T]) next() item[T] {
	j := c.j
	c.j = j + 1
	e := &c.run[j]
	it := *e
	*e = item[T]{}
	if j > 0 && c.q != nil {
		c.q.started(c.id, 1)
	}
	return it
}

// left returns how many items of the run are taken and not started.
func (c *consumer[T]) left() int { return c.k - c.j }

// rest forgets the items of the run not started, gives back their room, and returns
// how many they were: the caller counts them as not started.
func (c *consumer[T]) rest() int {
	n := c.k - c.j
	clear(c.run[c.j:c.k])
	if n > 0 && c.q != nil {
		c.q.started(c.id, n)
	}
	c.j = c.k
	return n
}

// commit adds the tally to the statistics and clears it.
func (c *consumer[T]) commit() {
	t, s := &c.t, c.stats
	s.succeeded.addNonZero(t.succeeded)
	s.emitted.addNonZero(t.emitted)
	if t.retried|t.deadLettered|t.handedBack|t.failed|t.discarded != 0 { // rare: one test for the five
		s.retried.addNonZero(t.retried)
		s.deadLettered.addNonZero(t.deadLettered)
		s.handedBack.addNonZero(t.handedBack)
		s.failed.addNonZero(t.failed)
		s.discarded.addNonZero(t.discarded)
	}
	*t = tally{}
}
