package pipeline

import (
	"context"
	"fmt"
	"time"
)

// WithLinger makes a [Batch] flush a partial batch d after the batch's first item
// arrived, so that a slow trickle of items is not held back indefinitely. It panics if
// d <= 0.
func WithLinger(d time.Duration) BatchOption {
	if d <= 0 {
		panic(fmt.Sprintf("pipeline: WithLinger(%v): the linger must be positive", d))
	}
	return batchOpt(func(c *config) { c.linger = d })
}

// WithMaxBytes bounds a [Batch] by size as well as by count: size(item) is an item's
// size in bytes, and a batch is flushed before an item would take it past max. An item
// larger than max alone makes a batch of its own. T must be the batch's item type;
// [Batch] panics otherwise. It panics if max < 1 or size is nil.
func WithMaxBytes[T any](max int, size func(T) int) BatchOption {
	if max < 1 || size == nil {
		panic(fmt.Sprintf("pipeline: WithMaxBytes(%d, %p): need max >= 1 and a size function", max, size))
	}
	return batchOpt(func(c *config) { c.maxBytes, c.sizer = max, size })
}

// Flushes counts a batch stage's flushes by reason (see [StageReport]).
type Flushes struct {
	Size   int64 // the batch reached its item count
	Bytes  int64 // the next item would have passed WithMaxBytes
	Linger int64 // WithLinger expired
	End    int64 // the input ended
	// Checkpoint counts partial batches flushed because a checkpointed source was
	// waiting for a save that needed their items committed (see [WithMaxRedo]).
	Checkpoint int64
}

// flushCounters are a batch stage's flushes by reason, written by its goroutine.
type flushCounters struct{ size, bytes, linger, end, checkpoint counter }

func (f *flushCounters) load() Flushes {
	return Flushes{Size: f.size.load(), Bytes: f.bytes.load(), Linger: f.linger.load(), End: f.end.load(), Checkpoint: f.checkpoint.load()}
}

// Batch groups the items of s into slices of at most size items, in arrival order, on
// one goroutine with its own input queue ([WithBuffer]). A batch is flushed when it is
// full, before it would pass [WithMaxBytes], when [WithLinger] expires, and when the
// input ends. Each batch is a new slice that the consumer owns. The report counts the
// flushes by reason. When the run stops, the items of a partial batch count as failed.
// It panics if size < 1.
//
// Batching costs one allocation per batch and no lock; use it in front of sinks with a
// cost per call (databases, object stores, bulk APIs). See [ToBatches].
func Batch[T any](s *Stream[T], size int, opts ...BatchOption) *Stream[[]T] {
	if size < 1 {
		panic(fmt.Sprintf("pipeline: Batch(%d): the size must be at least 1", size))
	}
	s.check("Batch")
	cfg := configure("Batch", opts, BatchOption.batchOption)
	var sizer func(T) int
	if cfg.sizer != nil {
		sizer = typed[func(T) int, T](cfg.sizer, "Batch", "WithMaxBytes", "a batch")
	}
	p := s.p
	name := p.rowName(cfg.name, "Batch")
	desc := fmt.Sprintf("batch %q", name)
	s.consume(desc)
	buf := cfg.bufferOr(p.cfg.bufferOr(DefaultBuffer))
	out := newStream[[]T](p, desc)
	out.open = func(r *run, c into[[]T]) []*row {
		next, done := c.out, c.done
		q := newQueue[T](buf, 1)
		r.stoppers = append(r.stoppers, q.stop)
		rw := r.newRow(name, KindBatch, 1, buf, q)
		rw.flushes, rw.extra, rw.unit = new(flushCounters), size, size
		wireFed(r, rw, s, q.outlet(r.ctx), q.close, q.fedBy) // a FromSlice straight into a batch: taken in place
		r.addRow(rw)
		b := &batcher[T]{
			consumer: newConsumer(q, 0, 0, &rw.workers[0], buf),
			ctx:      r.ctx, size: size, maxBytes: cfg.maxBytes, sizer: sizer,
			linger: cfg.linger, down: next, row: rw, flushes: rw.flushes, tracked: r.tracked(),
		}
		r.goSafe(name, func() error {
			if err := b.loop(); err != nil {
				return err // no end of input downstream: the consumers stop with the run
			}
			done()
			return nil
		})
		return []*row{rw}
	}
	return out
}

type batcher[T any] struct {
	consumer[T] // its input, its run of items, its tally and statistics
	ctx         context.Context
	size        int
	maxBytes    int
	sizer       func(T) int
	linger      time.Duration
	down        outlet[[]T] // the consumer's
	out         sender[[]T]
	row         *row
	flushes     *flushCounters
	tracked     bool        // the run tracks positions: the batch keeps its items' (poss)
	timer       *time.Timer // WithLinger
	batch       []T
	poss        []uint64 // positions of the batch's items (checkpointed runs)
	bytes       int
	// judged is the hunger already judged not to concern this batch, moved closes
	// when the head moves on after that judgement (then it is judged again).
	judged, moved <-chan struct{}
	expired       <-chan time.Time // the linger timer's
}

func (b *batcher[T]) loop() error {
	b.out = b.down(&hand{row: b.row, waits: []func(){b.commit}}) // counts current while it waits
	returned := false
	defer func() {
		if !returned { // user code (the sizer, or downstream of a flush) panicked or exited: fail what is in hand
			b.t.discarded += int64(b.rest())
			b.commit()
			s := b.stats
			s.failed.add(s.received.load() - s.succeeded.load() - s.failed.load() - s.discarded.load())
			b.out.drop()
		}
	}()
	err := b.take()
	returned = true
	b.commit()
	return err
}

func (b *batcher[T]) take() (err error) {
	if b.linger > 0 {
		b.timer = time.NewTimer(time.Hour)
		b.timer.Stop()
		defer b.timer.Stop()
		b.expired = b.timer.C
	}
	for {
		_, ok, err := b.consumer.take(b.ctx, chunk, 0, b.idle)
		if ok {
			if err := b.items(); err != nil {
				return err
			}
			continue
		}
		if err == nil { // the input ended
			if len(b.batch) > 0 && b.ctx.Err() == nil {
				return b.flush(&b.flushes.end)
			}
			if len(b.batch) > 0 { // the run stopped: the partial batch fails
				b.t.failed += int64(len(b.batch))
				return context.Cause(b.ctx)
			}
			return nil
		}
		if b.ctx.Err() != nil { // the run stopped: the partial batch fails
			b.t.failed += int64(len(b.batch))
			b.batch = nil
		}
		return err
	}
}

// idle waits, parked, for input, for the linger to expire, for a checkpointed source
// that waits for a save that needs this batch's items, or for the run to stop (see
// consumer.take). A flush here happens parked: a producer that wakes the batcher
// meanwhile leaves a token that take drains (see queue.unpark) before it looks again.
func (b *batcher[T]) idle(wake <-chan struct{}) (bool, error) {
	// A checkpointed source waiting for a save may be waiting for an item this batch
	// holds: then flush it, whatever its size.
	var hungry, headMoved <-chan struct{}
	if len(b.poss) > 0 {
		if hungry = b.out.hungry(); hungry == b.judged {
			hungry, headMoved = nil, b.moved
		}
	}
	select {
	case <-wake:
		return true, nil
	case <-headMoved:
		b.judged, b.moved = nil, nil
		return false, nil
	case <-hungry:
		var holds bool
		if holds, b.moved = b.out.holdsHead(b.poss); !holds {
			b.judged = hungry // wait for input or the head to move; then judge again
			return false, nil
		}
		return false, b.flush(&b.flushes.checkpoint)
	case <-b.expired:
		if len(b.batch) == 0 {
			return false, nil
		}
		return false, b.flush(&b.flushes.linger)
	case <-b.ctx.Done():
		return false, context.Cause(b.ctx)
	}
}

// items adds the items of the run taken to batches, flushing each that is full.
func (b *batcher[T]) items() error {
	for b.j < b.k {
		e := b.next()
		v := e.v
		if b.sizer != nil {
			n := b.sizer(v)
			if len(b.batch) > 0 && b.bytes+n > b.maxBytes {
				if err := b.flush(&b.flushes.bytes); err != nil {
					b.t.failed++ // v, which made room for itself, is in no batch
					b.t.discarded += int64(b.rest())
					return err
				}
			}
			b.bytes += n
		}
		if len(b.batch) == 0 {
			b.batch = make([]T, 0, b.size)
			if b.timer != nil {
				b.timer.Reset(b.linger)
			}
		}
		b.batch = append(b.batch, v)
		if b.tracked {
			b.poss = append(b.poss, e.pos)
			b.judged, b.moved = nil, nil
		}
		if len(b.batch) == b.size {
			if err := b.flush(&b.flushes.size); err != nil {
				b.t.discarded += int64(b.rest())
				return err
			}
		}
	}
	return nil
}

// flush sends the current batch on; its items count as succeeded here, a batch at a
// time (as received, one by one, when they were taken).
func (b *batcher[T]) flush(reason *counter) error {
	if b.timer != nil {
		b.timer.Stop() // the batch is gone: its linger with it
	}
	n := int64(len(b.batch))
	reason.inc()
	batch, pos := b.batch, noPos
	if b.tracked {
		pos = b.out.group(b.poss)
		b.poss = nil
	}
	b.batch, b.bytes = nil, 0
	err := b.out.put(batch, pos) // counted after: a panic downstream leaves the items failed
	if ferr := b.out.flush(); err == nil {
		err = ferr
	}
	b.t.succeeded += n
	b.t.emitted++
	return err
}

// Flatten returns a stream of the items of the slices of s, in order (the reverse of
// [Batch]). Like [Map], it runs inline, in the goroutines that produce s.
func Flatten[T any](s *Stream[[]T]) *Stream[T] {
	s.check("Flatten")
	s.consume("Flatten")
	out := newStream[T](s.p, s.desc+" | Flatten")
	out.open = func(r *run, c into[T]) []*row {
		cs := c.rows // the first rows downstream: they count what a panic kept from them
		return s.open(r, into[[]T]{out: func(h *hand) sender[[]T] {
			snd := c.out(h)
			return wrap(snd, func(vs []T, pos uint64) error { return flattenPush(r, h, &snd, vs, pos, cs) })
		}, done: c.done, rows: c.rows})
	}
	return out
}

// flattenPush hands the items of vs on one by one. A panic in the inline operators
// after Flatten (a Map, a Filter's keep, the next stage's key function) at item i
// fails the run under the name of the row vs came from (whose goroutine h is), like
// one on a [Tee] branch: the upstream counts vs as sent, since items 0..i-1 already
// reached the next rows, and items i and after, which the panic kept from them, count
// as failed there. A runtime.Goexit goes on unwinding: the upstream fails vs.
func flattenPush[T any](r *run, h *hand, snd *sender[T], vs []T, pos uint64, next []*row) (err error) {
	poss := snd.ungroup(pos, len(vs))
	i := 0
	defer guard(nil, func(perr error) { // a panic only: a Goexit goes on unwinding
		for _, c := range next {
			c.lost.Add(int64(len(vs) - i))
		}
		serr := &StageError{Stage: r.producerOf(h, next), Err: perr}
		r.fail(serr)
		err = serr
	})
	var first error
	for ; i < len(vs); i++ {
		if poss != nil {
			pos = poss[i]
		}
		if err := snd.put(vs[i], pos); err != nil && first == nil {
			first = err // offer the rest too, so that each is counted
		}
	}
	return first
}

// ToBatches ends s in a sink that takes batches: Batch(s, size, opts...) then [To]. Give
// the sink [WithRetry] and [WithDeadLetter] to retry or set aside whole batches.
func ToBatches[T any](s *Stream[T], size int, sink *Stage[[]T, struct{}], opts ...BatchOption) {
	To(Batch(s, size, opts...), sink)
}
