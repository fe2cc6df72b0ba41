package pipeline

import (
	"context"
	"sync/atomic"
)

// DefaultBuffer is the capacity of a stage's input queue when neither the stage nor the
// pipeline sets one with [WithBuffer]. With it, a pipeline of k stages holds at most
// about k×64 items in its queues, plus one item per busy worker, whatever the input size.
const DefaultBuffer = 64

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

// queue is a stage's bounded input: a channel with one logical sender (the upstream,
// which closes it) and the stage's workers as receivers.
type queue[T any] struct {
	ch     chan T
	unsent atomic.Int64 // items the upstream had for this stage but could not send (run stopped)
}

func newQueue[T any](capacity int) *queue[T] {
	return &queue[T]{ch: make(chan T, capacity)}
}

// pusher returns the function upstream producers call for each item.
func (q *queue[T]) pusher(ctx context.Context) func(T) error {
	return func(v T) error {
		if err := send(ctx, q.ch, v); err != nil {
			q.unsent.Add(1) // rare: only when the run is stopping
			return err
		}
		return nil
	}
}
