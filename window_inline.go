package pipeline

import (
	"errors"
	"math"
	"sync/atomic"
)

// This file is the inline form of a one-worker [Window] stage: when it can, the stage
// folds its items in the goroutine that produces them, as Map runs, with no queue and
// no goroutine of its own, and hands its results on through that goroutine's sender to
// its consumer. It can when it has one worker, no idle clock (WithIdleTimeout: only a
// goroutine of its own can wait for it, and WithWindowBackpressure needs it), no
// WithBuffer of its own (which asks for a queue), the run tracks no positions (a
// tracked source waiting for a save needs the stage to fire the windows that hold it
// back, which a stage folding in that very source's goroutine cannot), and a single
// goroutine produces its input (so that folds never run concurrently, with no lock).
// Otherwise it is the windower's goroutine behind a queue (window_state.go). See
// DESIGN.md, "Windows".

// windowInput is the input of a one-worker Window stage that may fold inline: whether
// it does is known once its input is wired, when the rows that feed it say how many
// goroutines produce it. A sender made before that (a stage's worker makes its sender
// while it is wired) takes its way at its first use, once every goroutine runs.
type windowInput[T any, K comparable, V any] struct {
	track tracker
	w     *windower[T, K, V] // inline: the stage's state; nil when queued
	q     outlet[T]          // queued: the stage's queue
	close func()             // queued: the queue's end of input
	set   bool               // w or q is set
}

// inline makes the stage fold in its producer's goroutine; done is its consumer's end
// of input.
func (in *windowInput[T, K, V]) inline(w *windower[T, K, V], r *run, done func()) {
	w.r, w.finished, w.untaken = r, done, new(atomic.Int64)
	in.w, in.set = w, true
}

// queued makes the stage take its input from a queue, through out.
func (in *windowInput[T, K, V]) queued(out outlet[T], closeq func()) {
	in.q, in.close, in.set = out, closeq, true
}

// outlet is the stage's outlet: a sender made while the input is being wired waits for
// its first use to know which sender it is.
func (in *windowInput[T, K, V]) outlet(h *hand) sender[T] {
	if in.set {
		return in.make(h)
	}
	var got *sender[T]
	get := func() *sender[T] {
		if got == nil {
			snd := in.make(h)
			got = &snd
		}
		return got
	}
	return sender[T]{
		put: func(v T, pos uint64) error { return get().put(v, pos) },
		flush: func() error {
			if got == nil {
				return nil
			}
			return got.flush()
		},
		drop: func() {
			if got != nil {
				got.drop()
			}
		},
		track: in.track,
	}
}

func (in *windowInput[T, K, V]) make(h *hand) sender[T] {
	var snd sender[T]
	if in.w != nil {
		snd = in.w.inlineSender(h)
	} else {
		snd = in.q(h)
	}
	snd.track = in.track
	return snd
}

// inputDone is the end of the stage's input (the into's done).
func (in *windowInput[T, K, V]) inputDone() {
	if in.w != nil {
		in.w.inlineFinish()
		return
	}
	in.close()
}

// inlineLen is the queueLen of an inline window stage's row: it has no queue; the
// items of the run in hand that it has not started yet count as taken, not started.
type inlineLen struct {
	stats   *workerStats
	untaken *atomic.Int64
}

func (inlineLen) length() int        { return 0 }
func (inlineLen) occupancy() int     { return 0 }
func (inlineLen) unsentCount() int64 { return 0 }
func (l inlineLen) startedBy(int) int64 {
	return l.stats.received.load() - l.untaken.Load()
}

// inlineSender is a producer's sender into an inline window stage: its items are folded
// at once, and the results go on through down, the producer's sender to the stage's
// consumer.
type inlineSender[T any, K comparable, V any] struct {
	w    *windower[T, K, V]
	down sender[WindowResult[K, V]]
}

// inlineSender makes the sender of the producer whose hand is h: the stage's counts
// are current while the producer waits.
func (w *windower[T, K, V]) inlineSender(h *hand) sender[T] {
	s := &inlineSender[T, K, V]{w: w, down: w.down(h)}
	if h != nil {
		h.waits = append(h.waits, w.commit, w.publish)
	}
	w.bind(s)
	return sender[T]{put: s.put, putRun: s.putRun, flush: s.flush, drop: s.drop}
}

// bind makes s's the sender the stage's results go through.
func (w *windower[T, K, V]) bind(s *inlineSender[T, K, V]) {
	if w.cur != s {
		w.cur, w.out = s, s.down
		w.track.s = &w.out
	}
}

func (s *inlineSender[T, K, V]) put(v T, _ uint64) error {
	w := s.w
	if w.broken != nil { // the stage failed: the run is stopping
		w.recv++
		w.t.discarded++
		return w.broken
	}
	w.bind(s)
	one := [1]T{v}
	return w.foldInline(one[:])
}

// putRun folds vs, untracked items, as put would one by one: it takes them all (those
// it did not start when the stage failed count as not started).
func (s *inlineSender[T, K, V]) putRun(vs []T, _ func(int)) (int, error) {
	w := s.w
	if w.broken != nil {
		w.recv += int64(len(vs))
		w.t.discarded += int64(len(vs))
		return len(vs), w.broken
	}
	w.bind(s)
	return len(vs), w.foldInline(vs)
}

func (s *inlineSender[T, K, V]) flush() error {
	w := s.w
	if w.broken != nil {
		w.out.drop() // the results it holds are never sent: counted so
		w.commit()
		return w.broken
	}
	w.bind(s)
	w.publish() // before the results reach a reader of the report
	err := w.out.flush()
	w.commit()
	return err
}

func (s *inlineSender[T, K, V]) drop() {
	w := s.w
	w.bind(s)
	w.out.drop()
	w.commit()
}

// foldInline folds vs, read in place, in the producer's goroutine. A panic in
// user code (key, at, the aggregate, the late items' destination, an inline operator
// downstream) fails the run under the stage's name, as it does in the stage's own
// goroutine: the item in hand counts as failed, the rest of the run as not started, and
// the producer gets the error. A runtime.Goexit is counted the same and goes on.
func (w *windower[T, K, V]) foldInline(vs []T) (err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		v := recover()
		w.t.discarded += int64(w.rest())
		w.commit()
		s := w.stats
		s.failed.add(s.received.load() - s.succeeded.load() - s.deadLettered.load() - s.failed.load() - s.discarded.load())
		w.publish()
		e := &StageError{Stage: w.name, Err: ErrGoexit}
		if v != nil {
			e.Err = newPanicError(v)
		}
		w.broken = e
		w.r.fail(e)
		err = e // a Goexit goes on unwinding
	}()
	w.k, w.j = len(vs), 0
	w.recv += int64(len(vs))
	if w.fast {
		err = w.foldTumbling(vs)
	} else {
		err = w.foldEach(vs)
	}
	returned = true
	if err != nil {
		w.broken = err
		if se, ok := errors.AsType[*StageError](err); ok && w.ctx.Err() == nil {
			w.r.fail(se) // the stage's own error, not the run's cause: it stops the run, under the stage's name
		}
	}
	return err
}

// inlineFinish ends the stage's input: it fires every window left and ends its
// consumer's input, unless the stage failed.
func (w *windower[T, K, V]) inlineFinish() {
	if w.broken != nil || w.ctx.Err() != nil { // the run stopped: what the windows hold fails
		w.commit()
		w.publish()
		return
	}
	if w.cur == nil { // no producer made a sender
		w.out = w.down(&hand{row: w.row})
		w.track.s = &w.out
	}
	returned := false
	defer func() {
		if returned {
			return
		}
		v := recover()
		w.commit()
		w.publish()
		w.out.drop()
		e := &StageError{Stage: w.name, Err: ErrGoexit}
		if v != nil {
			e.Err = newPanicError(v)
		}
		w.broken = e
		w.r.fail(e)
	}()
	err := w.finish()
	w.commit()
	returned = true
	if err != nil { // the run's cause: its consumers stop with the run
		w.broken = err
		w.out.drop()
		return
	}
	w.finished()
}

// foldEach folds vs into their windows one by one (add), in place: w.j follows the item in
// hand. On an error the item in hand is counted, and the rest of vs as not started.
func (w *windower[T, K, V]) foldEach(vs []T) error {
	for i := range vs {
		w.j = i + 1
		w.inHand = true
		if err := w.add(vs[i], noPos); err != nil {
			if w.inHand { // stopped before it was counted
				w.t.failed++
				w.inHand = false
			}
			w.t.discarded += int64(w.rest())
			return err
		}
	}
	return nil
}

// foldTumbling is foldEach for tumbling windows kept for no lateness (itemsTumbling, in
// place): an item whose window is open is folded in after one look-up, in this loop;
// the rest go through addAt.
func (w *windower[T, K, V]) foldTumbling(vs []T) error {
	size, delay := int64(w.kind.size), int64(w.cfg.maxDelay)
	at, key, fold, first := w.at, w.key, w.agg.fold, w.agg.first
	// The state the loop reads per item, in locals, read again after anything else
	// may have changed it (addAt, fireDue).
	var (
		bStart, bound, due int64 // bound: a window must end after it to be open; due: the heap's first
		b                  map[K]*win[K, V]
	)
	reload := func() {
		bStart, b, bound, due = w.lastStart, w.lastBucket, max(w.floor, w.wm), math.MaxInt64
		if len(w.due) > 0 {
			due = w.due[0].due
		}
	}
	reload()
	for i := range vs {
		w.j = i + 1
		v := &vs[i]
		t := at(*v).UnixNano()
		k := key(*v)
		var s int64
		if b != nil && t >= bStart && t < bStart+size { // the bucket in hand: no division
			s = bStart
		} else if s = t - t%size; s > t {
			s -= size
		}
		var wn *win[K, V]
		if s+size > bound {
			if s != bStart || b == nil {
				if b = w.bucket(s); b != nil {
					bStart = s
				}
			}
			wn = b[k]
		}
		if wn == nil || wn.n == 0 && first != nil { // a window to open, a late item, a first item to reduce
			w.inHand = true
			if err := w.addAt(*v, noPos, k, t); err != nil {
				if w.inHand { // stopped before it was counted
					w.t.failed++
					w.inHand = false
				}
				w.t.discarded += int64(w.rest())
				return err
			}
			reload()
			continue
		}
		wn.val = fold(wn.val, *v)
		wn.n++
		wn.owns++
		w.heldN++
		w.t.succeeded++
		if t > w.maxEvent {
			w.maxEvent = t
			if wm := t - delay; wm > w.wm {
				w.wm = wm
				bound = max(bound, wm)
				if due <= wm {
					if err := w.fireDue(); err != nil {
						w.t.discarded += int64(w.rest())
						return err
					}
					reload()
				}
			}
		}
	}
	return nil
}
