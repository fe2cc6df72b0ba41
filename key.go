package pipeline

import (
	"context"
	"hash/maphash"
	"sync/atomic"
)

// WithKey routes each item to a worker chosen by the hash of key(item): items with the
// same key are processed one at a time and in input order, items with different keys
// concurrently (unless their keys hash to the same worker: like a broker's partitions,
// a slow key delays the keys that share its worker). Each worker has a queue of its
// own, and the stage's buffer ([WithBuffer]) bounds the items waiting in all of them
// together, at the cost of one more channel operation per item. In must be the stage's input
// type; the stage's constructor panics otherwise, and also when the stage has
// [WithOrdered] (per-key order is already kept).
func WithKey[In any, K comparable](key func(In) K) StageOption {
	if key == nil {
		panic("pipeline: WithKey(nil)")
	}
	seed := maphash.MakeSeed()
	hash := func(v In) uint64 { return maphash.Comparable(seed, key(v)) }
	return stageOpt(func(c *config) { c.key = hash })
}

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

func (q *keyedQueue[T]) unsentCount() int64 { return q.unsent.Load() }

// length counts the items waiting: those holding a slot, read at once (the channels'
// lengths, read one after the other, could count an item that moved between two).
func (q *keyedQueue[T]) length() int {
	if q.slots != nil {
		return len(q.slots)
	}
	n := 0
	for _, ch := range q.chs {
		n += len(ch)
	}
	return n
}
