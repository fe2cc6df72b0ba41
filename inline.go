package pipeline

import (
	"context"
	"sync"
	"sync/atomic"
)

// Map returns a stream of fn applied to each item of s. It is an inline operator: fn
// runs in the goroutines that produce s (a source's, or the upstream stage's workers),
// with no queue and no goroutine of its own, so it costs one function call per item.
// Use it for cheap, non-failing transformations; fn must be safe for concurrent use
// when s comes from a stage with several workers. A panic in fn fails the run under
// the upstream's name. For work that can fail, block or retry, use a [Stage].
func Map[In, Out any](s *Stream[In], fn func(In) Out) *Stream[Out] {
	s.check("Map")
	if fn == nil {
		panic("pipeline: Map(nil)")
	}
	s.consume("Map")
	out := newStream[Out](s.p, s.desc+" | Map")
	out.open = func(r *run, c into[Out]) []*row {
		return s.open(r, into[In]{out: func(h *hand) sender[In] {
			snd := c.out(h)
			return wrap(snd, func(v In, pos uint64) error { return snd.put(fn(v), pos) })
		}, done: c.done, rows: c.rows})
	}
	return out
}

// Filter returns a stream of the items of s for which keep returns true. Like [Map], it
// runs inline. Dropped items are counted in the [Report], in a row of kind [KindFilter]
// named by [WithName], or else "Filter" ("Filter#2", ... when there are several); its
// In is what reached it, its Out what it let through. It counts them per chunk of
// items, so an item costs no atomic operation.
func Filter[T any](s *Stream[T], keep func(T) bool, opts ...FilterOption) *Stream[T] {
	s.check("Filter")
	if keep == nil {
		panic("pipeline: Filter(nil)")
	}
	cfg := configure("Filter", opts, FilterOption.filterOption)
	s.consume("Filter")
	name := s.p.rowName(cfg.name, "Filter")
	out := newStream[T](s.p, s.desc+" | Filter")
	out.open = func(r *run, c into[T]) []*row {
		next, done := c.out, c.done
		rw := r.newRow(name, KindFilter, 0, 0, nil)
		rw.filtered, rw.arrived = new(atomic.Int64), new(atomic.Int64)
		wireInput(r, rw, s, func(h *hand) sender[T] {
			snd := next(h)
			// arrived and filtered count the items of the producer's current chunk, added
			// to the row when it flushes (or drops) them.
			var arrived, filtered int64
			commit := func() {
				if arrived != 0 {
					rw.arrived.Add(arrived)
				}
				if filtered != 0 {
					rw.filtered.Add(filtered)
				}
				arrived, filtered = 0, 0
			}
			return sender[T]{
				put: func(v T, pos uint64) error {
					// A panic in keep, or in an inline operator after the filter, fails the
					// item upstream (in the row whose goroutine runs it): then it never
					// arrived here.
					if keep(v) {
						err := snd.put(v, pos)
						arrived++
						return err
					}
					arrived++
					filtered++
					snd.settle(pos) // dropped: done with
					return nil
				},
				flush: func() error { err := snd.flush(); commit(); return err },
				drop:  func() { snd.drop(); commit() },
				track: snd.track,
			}
		}, done)
		r.addRow(rw)
		return []*row{rw}
	}
	return out
}

// ForEach ends s in fn, which runs inline, as [Map] runs: in the goroutine that
// produces each item (a source's, the upstream stage's workers, or the reorder window's
// flusher of an ordered stage), with no queue and no goroutine of its own. Calls of fn
// never overlap, so fn may keep state without a lock; after an ordered stage
// ([WithOrdered]) or a source, fn sees the items in their order. It is the end to use
// for a cheap consumer, such as a sum or a buffered writer: a sink stage ([NewSink]
// attached by [To]) costs a queue and a hand-off between goroutines per item, which a
// CPU-bound stage of short items can feel.
//
// An item is done with when fn returns nil: its position settles (an acknowledged
// source is told it was processed, a checkpoint passes it). An error from fn fails the
// run with a [*StageError] naming the ForEach; the item counts as failed, and the items
// that reach ForEach after that are not started. A panic in fn fails the run under the
// name of the row whose goroutine ran it, as for Map. ForEach has none of a stage's
// policies (timeouts, retries, dead letters, [Commit], [SetAside]): for work that can
// fail, block or retry, use a sink stage.
//
// Its row in the [Report] is a [KindSink] named by [WithName], or else "ForEach"
// ("ForEach#2", ... when there are several), with one worker and no queue; it counts
// its items per run of items of the goroutine that calls it, so that an item costs
// no atomic operation beyond fn's lock, and a run handed on whole (an ordered stage's
// outputs in an untracked run, a [FromSlice]'s chunk) takes the lock once. It panics
// like [Filter].
func ForEach[T any](s *Stream[T], fn func(T) error, opts ...FilterOption) {
	s.check("ForEach")
	if fn == nil {
		panic("pipeline: ForEach(nil)")
	}
	cfg := configure("ForEach", opts, FilterOption.filterOption)
	s.consume("ForEach")
	p := s.p
	name := p.rowName(cfg.name, "ForEach")
	p.terminals = append(p.terminals, func(r *run) {
		rw := r.newRow(name, KindSink, 1, 0, nil)
		e := &forEach[T]{fn: fn, r: r, rw: rw}
		rw.q = forEachLen[T]{e}
		feeders := wireInput(r, rw, s, e.outlet, func() {})
		// One goroutine at a time produces s: a row of one worker (a source, Batch, a
		// stage or a Window of one worker), or an ordered stage, whose flusher is one at a
		// time (reorder.flush). Then fn's calls never overlap without a lock. A Window
		// of several workers also has a held count, but each worker sends its own
		// results.
		f := feeders
		e.serial = len(f) == 1 && (len(f[0].workers) == 1 || f[0].kind == KindStage && f[0].held != nil)
		r.addRow(rw)
	})
}

// forEach is the end a [ForEach] puts its run's items into.
type forEach[T any] struct {
	fn     func(T) error
	r      *run
	rw     *row         // its one worker's counts are added to by every producer's sender
	serial bool         // one goroutine at a time produces the stream: no lock
	mu     sync.Mutex   // held while fn runs, unless serial: its calls never overlap
	unsent atomic.Int64 // items offered once the run was stopping: never started
}

// forEachLen is the queueLen of a ForEach's row: it has no queue; the items offered
// after the run began to stop count as unsent (In and NotStarted).
type forEachLen[T any] struct{ e *forEach[T] }

func (forEachLen[T]) length() int           { return 0 }
func (forEachLen[T]) occupancy() int        { return 0 }
func (l forEachLen[T]) unsentCount() int64  { return l.e.unsent.Load() }
func (l forEachLen[T]) startedBy(int) int64 { return l.e.rw.workers[0].received.load() }

// call runs fn on v, under the lock unless the stream is serial; a panic in fn
// releases it too.
func (e *forEach[T]) call(v T) error {
	if e.serial {
		return e.fn(v)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fn(v)
}

// forEachSender is one producing goroutine's sender into a ForEach: it keeps the
// counts of its items and the positions of those done with (a sink's runSettler)
// until it flushes, drops, or waits.
type forEachSender[T any] struct {
	e                         *forEach[T]
	done                      sender[struct{}] // settles the positions of the items fn returned nil for
	received, succeeded, fail int64
}

// outlet makes the sender of the producer whose hand is h.
func (e *forEach[T]) outlet(h *hand) sender[T] {
	s := &forEachSender[T]{e: e, done: runSettler(e.r.track)}
	if h != nil { // counts current, and positions settled, while the producer waits
		h.placers = append(h.placers, func() { _ = s.done.flush() })
		h.waits = append(h.waits, s.commit)
	}
	return sender[T]{put: s.put, putRun: s.putRun, flush: s.flush, drop: s.drop} // wireInput adds the tracker
}

func (s *forEachSender[T]) put(v T, pos uint64) error {
	e := s.e
	if e.r.ctx.Err() != nil { // the run is stopping: start nothing new
		e.unsent.Add(1)
		return context.Cause(e.r.ctx)
	}
	err := e.call(v) // a panic: counted by the producer's row, never here
	s.received++
	if err != nil {
		return s.failed(err)
	}
	s.succeeded++
	if pos == noPos { // an untracked run: nothing to settle (no call per item)
		return nil
	}
	return s.done.put(struct{}{}, pos)
}

// putRun is put for a run of untracked items vs (an ordered stage's window, a slice
// source's chunk), under one lock: fn on each in turn, with no call of put per item.
// It returns how many it took: all, unless fn fails one (that one included) or the
// run stops (the one it could not start included, counted unsent). A panic in fn
// tells before how many fn returned for, as a sender that waits would, so that the
// producer counts those sent and the rest not.
func (s *forEachSender[T]) putRun(vs []T, before func(done int)) (n int, err error) {
	e := s.e
	if !e.serial {
		e.mu.Lock()
		defer e.mu.Unlock()
	}
	returned := false
	defer func() {
		if !returned {
			before(n)
		}
	}()
	stop := e.r.ctx
	for ; n < len(vs); n++ {
		if stop.Err() != nil { // the run is stopping: start nothing new
			e.unsent.Add(1)
			returned = true
			return n + 1, context.Cause(stop)
		}
		if err = e.fn(vs[n]); err != nil {
			s.received++
			returned = true
			return n + 1, s.failed(err)
		}
		s.received++
		s.succeeded++
	}
	returned = true
	return n, nil
}

// failed counts the item fn returned err for, and fails the run.
func (s *forEachSender[T]) failed(err error) error {
	e := s.e
	s.fail++
	s.commit()
	e.rw.addError(errTypeName(err), func(c *ErrorCount) { c.Failed++ })
	serr := &StageError{Stage: e.rw.name, Err: err}
	e.r.fail(serr)
	return serr
}

// commit adds the sender's counts to the row's.
func (s *forEachSender[T]) commit() {
	st := &s.e.rw.workers[0]
	if s.received != 0 {
		st.received.v.Add(s.received)
		s.received = 0
	}
	if s.succeeded != 0 {
		st.succeeded.v.Add(s.succeeded)
		s.succeeded = 0
	}
	if s.fail != 0 {
		st.failed.v.Add(s.fail)
		s.fail = 0
	}
}

func (s *forEachSender[T]) flush() error {
	err := s.done.flush()
	s.commit()
	return err
}

func (s *forEachSender[T]) drop() {
	s.done.drop() // the items fn returned nil for are done with all the same
	s.commit()
}
