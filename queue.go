package pipeline

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// DefaultBuffer is the capacity of a stage's input queue when neither the stage nor the
// pipeline sets one with [WithBuffer]. With it, a pipeline of k stages holds at most
// about k×64 items in its queues, plus one item per busy worker, whatever the input size.
const DefaultBuffer = 64

// WithBuffer sets the capacity of a stage's input queue: at most n items wait for the
// stage's workers, and a producer that finds the queue full blocks (backpressure). Zero
// makes the queue unbuffered. Given to [New], it sets the default for every stage. It
// panics if n is negative. The default is [DefaultBuffer].
func WithBuffer(n int) BufferOption {
	if n < 0 {
		panic(fmt.Sprintf("pipeline: WithBuffer(%d): the buffer must not be negative", n))
	}
	return BufferOption{n}
}

// counter is a statistic with exactly one writer (the goroutine that owns it) and any
// number of readers. The writer adds with a plain load and store, which on every
// platform Go supports costs no locked instruction; readers see a recent value.
type counter struct{ v atomic.Int64 }

func (c *counter) inc()        { c.v.Store(c.v.Load() + 1) }
func (c *counter) add(n int64) { c.v.Store(c.v.Load() + n) }
func (c *counter) load() int64 { return c.v.Load() }
func (c *counter) max(n int64) { // single writer, so no CAS loop is needed
	if n > c.v.Load() {
		c.v.Store(n)
	}
}

// send puts v on ch, blocking while ch is full, and gives up when ctx is done. The
// first, non-blocking attempt touches only ch's lock; only a full queue pays for the
// select over ctx's done channel, which every goroutine of the run shares.
func send[T any](ctx context.Context, ch chan<- T, v T) error {
	select {
	case ch <- v:
		return nil
	default:
	}
	select {
	case ch <- v:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// recv takes the next item from ch, blocking while ch is empty. ok is false when ch is
// closed and drained; err is the run's cause when ctx is done first.
func recv[T any](ctx context.Context, ch <-chan T) (v T, ok bool, err error) {
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

// push is how a producer hands an item to its consumer. It blocks while the consumer's
// queue is full and returns the run's cause once the run is stopping.
type pushFunc[T any] = func(v T, pos uint64) error

// inbox is a stage's bounded input: the upstream sends through pusher and calls close
// after its last send; each worker receives from the channel bind gives it.
type inbox[T any] interface {
	queueLen
	pusher(ctx context.Context) pushFunc[T]
	close()
	// bind returns worker i's channel: a plain one, or (ordered stages) one of items
	// tagged with their sequence number.
	bind(i int) (chan item[T], chan seqItem[T])
}

// queue is the plain inbox: one channel shared by all the stage's workers.
type queue[T any] struct {
	ch     chan item[T]
	unsent atomic.Int64 // items the upstream had for this stage but could not send (run stopped)
}

func newQueue[T any](capacity int) *queue[T] {
	return &queue[T]{ch: make(chan item[T], capacity)}
}

func (q *queue[T]) pusher(ctx context.Context) pushFunc[T] {
	return func(v T, pos uint64) error {
		if err := send(ctx, q.ch, item[T]{v, pos}); err != nil {
			q.unsent.Add(1) // rare: only when the run is stopping
			return err
		}
		return nil
	}
}

func (q *queue[T]) close()                                   { close(q.ch) }
func (q *queue[T]) bind(int) (chan item[T], chan seqItem[T]) { return q.ch, nil }
func (q *queue[T]) length() int                              { return len(q.ch) }
func (q *queue[T]) unsentCount() int64                       { return q.unsent.Load() }

// keyedQueue gives each worker its own channel and routes every item by the hash of its
// key, so that items with one key are handled by one worker, one at a time, in order.
// The stage's buffer bounds the items waiting in all the channels together: a producer
// takes a slot of slots before it sends, and a worker gives it back when it takes the
// item. Each channel can hold the whole buffer, so that a send after taking a slot never
// blocks. An unbuffered stage has unbuffered channels and no slots.
type keyedQueue[T any] struct {
	chs    []chan item[T]
	slots  chan struct{} // nil when unbuffered
	hash   func(T) uint64
	unsent atomic.Int64
}

func newKeyedQueue[T any](workers, capacity int, hash func(T) uint64) *keyedQueue[T] {
	q := &keyedQueue[T]{chs: make([]chan item[T], workers), hash: hash}
	for i := range q.chs {
		q.chs[i] = make(chan item[T], capacity)
	}
	if capacity > 0 {
		q.slots = make(chan struct{}, capacity)
	}
	return q
}

func (q *keyedQueue[T]) pusher(ctx context.Context) pushFunc[T] {
	n := uint64(len(q.chs))
	return func(v T, pos uint64) error {
		ch := q.chs[q.hash(v)%n]
		if q.slots == nil {
			if err := send(ctx, ch, item[T]{v, pos}); err != nil {
				q.unsent.Add(1)
				return err
			}
			return nil
		}
		if err := send(ctx, q.slots, struct{}{}); err != nil {
			q.unsent.Add(1)
			return err
		}
		ch <- item[T]{v, pos} // has room: at most cap(slots) items wait in all channels
		return nil
	}
}

func (q *keyedQueue[T]) close() {
	for _, ch := range q.chs {
		close(ch)
	}
}

func (q *keyedQueue[T]) bind(i int) (chan item[T], chan seqItem[T]) { return q.chs[i], nil }
func (q *keyedQueue[T]) unsentCount() int64                         { return q.unsent.Load() }

func (q *keyedQueue[T]) length() int {
	n := 0
	for _, ch := range q.chs {
		n += len(ch)
	}
	return n
}

// seqItem is an item of an ordered stage, tagged with its place in the input order.
type seqItem[T any] struct {
	item[T]
	seq uint64
}

// orderedQueue numbers items in the order they enter the channel. The number and the
// send happen under one mutex, so that the channel's order is the numbers' order even
// with several producers; a reorder window could otherwise wait for a number stuck
// behind it in a full channel.
type orderedQueue[T any] struct {
	mu     sync.Mutex
	next   uint64
	ch     chan seqItem[T]
	unsent atomic.Int64
}

func newOrderedQueue[T any](capacity int) *orderedQueue[T] {
	return &orderedQueue[T]{ch: make(chan seqItem[T], capacity)}
}

func (q *orderedQueue[T]) pusher(ctx context.Context) pushFunc[T] {
	return func(v T, pos uint64) error {
		q.mu.Lock()
		defer q.mu.Unlock()
		if err := send(ctx, q.ch, seqItem[T]{item[T]{v, pos}, q.next}); err != nil {
			q.unsent.Add(1)
			return err
		}
		q.next++
		return nil
	}
}

func (q *orderedQueue[T]) close()                                   { close(q.ch) }
func (q *orderedQueue[T]) bind(int) (chan item[T], chan seqItem[T]) { return nil, q.ch }
func (q *orderedQueue[T]) length() int                              { return len(q.ch) }
func (q *orderedQueue[T]) unsentCount() int64                       { return q.unsent.Load() }
