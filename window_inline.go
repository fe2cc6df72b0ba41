package pipeline

import (
	"errors"
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
// Otherwise it is the windower's goroutine behind a queue (window_state.go). Inline, it
// folds with the queued stage's own code (items, itemsTumbling): the producer's sender
// fills the windower's run, or hands itemsTumbling its values in place. See DESIGN.md,
// "Windows".

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

func (s *inlineSender[T, K, V]) put(v T, pos uint64) error {
	w := s.w
	if w.broken != nil { // the stage failed: the run is stopping
		w.stats.received.inc()
		w.t.discarded++
		return w.broken
	}
	w.bind(s)
	w.run[0] = item[T]{v: v, pos: pos}
	return w.foldRun(1, nil)
}

// putRun folds vs, untracked items, as put would one by one, a chunk at a time: it
// takes them all (those it did not start when the stage failed count as not started).
func (s *inlineSender[T, K, V]) putRun(vs []T, _ func(int)) (int, error) {
	w := s.w
	if w.broken != nil {
		w.stats.received.add(int64(len(vs)))
		w.t.discarded += int64(len(vs))
		return len(vs), w.broken
	}
	w.bind(s)
	for i := 0; i < len(vs); i += chunk {
		part := vs[i:min(i+chunk, len(vs))]
		if !w.fast { // items, add: through the run
			for j, v := range part {
				w.run[j] = item[T]{v: v, pos: noPos}
			}
		}
		if err := w.foldRun(len(part), part); err != nil {
			if rest := int64(len(vs) - i - len(part)); rest > 0 { // taken, never started
				w.stats.received.add(rest)
				w.t.discarded += rest
			}
			return len(vs), err
		}
	}
	return len(vs), nil
}

func (s *inlineSender[T, K, V]) flush() error {
	w := s.w
	if w.broken != nil {
		w.out.drop() // the results it holds are never sent: counted so
		w.commit()
		w.publish()
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
	w.publish()
}

// foldRun folds the first k items of the consumer's run, which the producer filled, in
// the producer's goroutine, with the queued stage's code (items); for tumbling windows
// kept for no lateness, vals (untracked) in place instead, when not nil. A panic in user code
// (key, at, the aggregate, the late items' destination, an inline operator downstream)
// fails the run under the stage's name, as it does in the stage's own goroutine: the
// item in hand counts as failed, the rest of the run as not started, and the producer
// gets the error. A runtime.Goexit is counted the same and goes on.
func (w *windower[T, K, V]) foldRun(k int, vals []T) (err error) {
	returned := false
	defer guard(&returned, func(perr error) {
		w.t.discarded += int64(w.rest())
		w.commit()
		s := w.stats
		s.failed.add(s.received.load() - s.succeeded.load() - s.deadLettered.load() - s.failed.load() - s.discarded.load())
		w.publish()
		w.fail(perr)
		err = w.broken // a Goexit goes on unwinding
	})
	w.k, w.j = k, 0
	w.stats.received.add(int64(k))
	if w.fast && vals != nil {
		err = w.itemsTumbling(vals)
	} else {
		err = w.items()
	}
	w.k, w.j = 0, 0
	returned = true
	if err != nil {
		w.broken = err
		if se, ok := errors.AsType[*StageError](err); ok && w.ctx.Err() == nil {
			w.r.fail(se) // the stage's own error, not the run's cause: it stops the run, under the stage's name
		}
	}
	return err
}

// fail stops the stage and the run with err, a panic or Goexit of user code that
// guard caught in the producer's goroutine, under the stage's name.
func (w *windower[T, K, V]) fail(err error) {
	e := &StageError{Stage: w.name, Err: err}
	w.broken = e
	w.r.fail(e)
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
	defer guard(&returned, func(perr error) {
		w.commit()
		w.publish()
		w.out.drop()
		w.fail(perr)
	})
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
