package pipeline

import (
	"context"
	"fmt"
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
