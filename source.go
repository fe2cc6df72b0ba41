package pipeline

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync/atomic"
)

// errDraining is what a source's emit returns once a drained budget has tripped.
var errDraining = errors.New("pipeline: draining after the error budget tripped")

// isDraining reports whether err is, or wraps, the error emit returns after a drained
// budget tripped: fn may wrap it (fmt.Errorf("read: %w", err)), as Generate's body may.
func isDraining(err error) bool { return errors.Is(err, errDraining) }

// FromSlice returns a source of the items of a slice, in order. The slice is read
// during each run and must not change meanwhile. Items not sent when a run stops are
// counted as not started in the [Report]. Since every item is at hand, the source hands
// them on in chunks; and when it is the one input of a stage or a [Batch] (no
// operator, [Merge] or checkpoint in between; a queue of room for one or more,
// unkeyed), it has no goroutine at all: the stage's workers (or the batcher) take its
// items in place, a run at a time, within the queue's bound, and the queue reads as
// full while any are left.
func FromSlice[T any](p *Pipeline, items []T, opts ...SourceOption) *Stream[T] {
	n := int64(len(items))
	return newSourceOf(p, "FromSlice", opts, &n, items, func(_ context.Context, emit func(T) error) error {
		for _, v := range items {
			if err := emit(v); err != nil {
				return err
			}
		}
		return nil
	})
}

// sendRuns sends items a chunk at a time through snd.putRun, as emit would one by one:
// it stops with errDraining once a drained budget has tripped, and with the run's cause
// once the run stops (the item it was about to send counted as taken and not started).
// received and sent are the source's counts of the current chunk, added by commit.
func sendRuns[T any](ctx context.Context, rw *row, items []T, snd sender[T], received, sent *int64, commit func()) error {
	st := &rw.workers[0]
	c := &chunkCounts{received: received, sent: sent}
	before := c.before // made once: putRun is called per chunk
	for i := 0; i < len(items); i += chunk {
		if rw.drain.Load() {
			return errDraining
		}
		if ctx.Err() != nil {
			*received++
			st.discarded.inc()
			return context.Cause(ctx)
		}
		c.cr, c.cs = 0, 0
		n, err := snd.putRun(items[i:min(i+chunk, len(items))], before)
		*received += int64(n) - c.cr
		*sent += int64(n) - c.cs
		if ferr := snd.flush(); err == nil {
			err = ferr
		}
		commit()
		if err != nil {
			return err
		}
	}
	return nil
}

// chunkCounts keeps a source's received and sent counts current while it waits for room
// in the middle of a chunk (sendRuns): cr and cs are how many of the chunk they count
// already; the item it waits to put is in flight (received, not sent).
type chunkCounts struct {
	received, sent *int64
	cr, cs         int64
}

func (c *chunkCounts) before(done int) {
	*c.received += int64(done) + 1 - c.cr
	*c.sent += int64(done) - c.cs
	c.cr, c.cs = int64(done)+1, int64(done)
}

// FromSeq returns a source of the values of seq. When the run stops early, the loop
// over seq is broken, so seq's cleanup runs. seq must not block without end: it is not
// given the run's context (use [Generate] for a source that waits on something).
func FromSeq[T any](p *Pipeline, seq iter.Seq[T], opts ...SourceOption) *Stream[T] {
	if seq == nil {
		panic("pipeline: FromSeq(nil)")
	}
	return newSource(p, "FromSeq", opts, nil, false, func(_ context.Context, emit func(T) error) error {
		for v := range seq {
			if err := emit(v); err != nil {
				return err
			}
		}
		return nil
	})
}

// FromSeq2 returns a source of the values of seq; the first non-nil error seq yields
// stops the run as a [*StageError] of the source (the value paired with it is not sent).
func FromSeq2[T any](p *Pipeline, seq iter.Seq2[T, error], opts ...SourceOption) *Stream[T] {
	if seq == nil {
		panic("pipeline: FromSeq2(nil)")
	}
	return newSource(p, "FromSeq2", opts, nil, false, func(_ context.Context, emit func(T) error) error {
		for v, err := range seq {
			if err != nil {
				return err
			}
			if err := emit(v); err != nil {
				return err
			}
		}
		return nil
	})
}

// FromChan returns a source of the values received from ch until it is closed. The
// caller owns ch and closes it; when the run stops early, values still in ch stay there.
func FromChan[T any](p *Pipeline, ch <-chan T, opts ...SourceOption) *Stream[T] {
	if ch == nil {
		panic("pipeline: FromChan(nil)")
	}
	return newSource(p, "FromChan", opts, nil, false, func(ctx context.Context, emit func(T) error) error {
		for {
			v, ok, err := recv(ctx, ch)
			if !ok {
				return err
			}
			if err := emit(v); err != nil {
				return err
			}
		}
	})
}

// Generate returns a source that runs fn once per run, in its own goroutine. fn sends
// items with emit, which blocks while the next queue is full and returns an error once
// the run is stopping; fn should then return that error (or nil). An error fn returns
// otherwise stops the run as a [*StageError] of the source. ctx is canceled when the run
// stops.
//
// emit is not safe for concurrent use: call it from fn's goroutine, or from goroutines
// that fn starts if they take turns (under a mutex, say) and fn waits for them before it
// returns; for several independent producers, use a source each and [Merge]. Concurrent
// calls are a data race that loses or mixes up items (the race detector reports it).
// emit must not be called once fn has returned: it panics then.
func Generate[T any](p *Pipeline, fn func(ctx context.Context, emit func(T) error) error, opts ...SourceOption) *Stream[T] {
	if fn == nil {
		panic("pipeline: Generate(nil)")
	}
	return newSource(p, "Generate", opts, nil, false, fn)
}

// newSource makes a source stream named by [WithName], or else after ctor, its
// constructor's name (numbered when the name is taken: FromSlice, FromSlice#2, ...).
// given, when known, is how many items the source holds, for the not-started count.
// chunked tells that body never waits between two items but on emit: then items are
// handed on in chunks; otherwise each is handed on at once, since the next may be long
// in coming.
func newSource[T any](p *Pipeline, ctor string, opts []SourceOption, given *int64, chunked bool, body func(ctx context.Context, emit func(T) error) error) *Stream[T] {
	cfg := configure(ctor, opts, SourceOption.sourceOption)
	return newSourceNamed(p, ctor, cfg.name, given, cfg.total, chunked, nil, body)
}

// newSourceOf is newSource for a source of the items of a slice (chunked): when its
// consumer's sender takes runs of items and the source is not checkpointed, the items
// go on a chunk at a time, with no call per item; otherwise body emits them.
func newSourceOf[T any](p *Pipeline, ctor string, opts []SourceOption, given *int64, items []T, body func(ctx context.Context, emit func(T) error) error) *Stream[T] {
	cfg := configure(ctor, opts, SourceOption.sourceOption)
	if cfg.total != 0 {
		panic(fmt.Sprintf("pipeline: %s: WithTotal: the source's total is its length", ctor))
	}
	return newSourceNamed(p, ctor, cfg.name, given, 0, true, items, body)
}

// newSourceNamed is newSource with the name already chosen by options; items are the
// source's items, if it is a slice's (newSourceOf; an empty one emits nothing either way).
// total is the total declared by WithTotal, 0 if none.
func newSourceNamed[T any](p *Pipeline, ctor, given string, n *int64, total int64, chunked bool, items []T, body func(ctx context.Context, emit func(T) error) error) *Stream[T] {
	if p == nil {
		panic(fmt.Sprintf("pipeline: %s: nil *Pipeline", ctor))
	}
	name := p.rowName(given, ctor)
	s := newStream[T](p, "source "+name)
	s.open = func(r *run, c into[T]) []*row {
		out, done := c.out, c.done
		rw := r.newRow(name, KindSource, 1, 0, nil)
		if n != nil {
			rw.given = *n
		}
		rw.declared = total
		st := &rw.workers[0]
		pos, bound := noPos, noPos // untracked, unless this is the checkpointed source
		tracked := r.p.ck != nil && r.p.ck.source == s
		if tracked {
			pos, bound = uint64(r.p.ck.loaded), 0 // admit the first item
			rw.resumed = &atomic.Int64{}
			rw.resumed.Store(int64(pos))
			rw.lag = r.p.ck.lag
		}
		r.addRow(rw) // complete: a report may read it from now on
		if len(items) > 0 && !tracked && c.feed != nil && c.feed(items, rw) {
			// The stage's workers take the items in place (queue.feed): no goroutine,
			// and nothing left to send.
			done()
			return []*row{rw}
		}
		var snd sender[T]
		// received and sent count the items of the current chunk, added to the row's
		// counters when the chunk is handed on (and when the goroutine ends).
		var received, sent int64
		var ended bool // body returned: emit is misused after
		commit := func() {
			if received != 0 {
				st.received.add(received)
			}
			if sent != 0 {
				st.succeeded.add(sent)
				st.emitted.add(sent)
			}
			received, sent = 0, 0
		}
		emit := func(v T) error {
			if ended {
				panic(fmt.Sprintf("pipeline: %s: emit called after the source's function returned", name))
			}
			if rw.drain.Load() {
				return errDraining
			}
			if r.ctx.Err() != nil { // the run is stopping: send nothing more
				received++
				st.discarded.inc() // taken from the input, never sent: not started
				return context.Cause(r.ctx)
			}
			if tracked && snd.skipped(pos) { // committed in an earlier run (commit.go)
				pos++
				if rw.resumed != nil {
					rw.resumed.Add(1)
				}
				return nil
			}
			if tracked && pos >= bound { // WithMaxRedo: wait for a save
				err := snd.flush() // the save may wait for what the source holds
				commit()
				if err != nil {
					return err
				}
				if bound, err = snd.admit(r.ctx, pos, nil); err != nil {
					return err
				}
			}
			received++
			err := snd.put(v, pos)
			sent++ // after put: a panic in an inline operator leaves it failed
			if pos != noPos {
				pos++
			}
			if !chunked || sent == chunk {
				if ferr := snd.flush(); err == nil {
					err = ferr
				}
				commit()
			}
			return err
		}
		r.goSafe(name, func() (err error) {
			h := &hand{row: rw, last: !chunked} // a source that may wait hands each item over at once
			h.waits = append(h.waits, commit)   // counts are current while the source waits
			snd = out(h)
			returned := false
			defer func() {
				ended = true
				if !returned { // a panic or Goexit: what the source holds is never sent
					snd.drop()
				}
				commit()
			}()
			// Only an input that ended closes the queue: after a failure (or a panic)
			// the consumers stop with the run's context instead, and take nothing for an
			// end of input.
			if len(items) > 0 && !tracked && snd.putRun != nil {
				err = sendRuns(r.ctx, rw, items, snd, &received, &sent, commit)
			} else {
				err = body(r.ctx, emit)
			}
			if ferr := snd.flush(); err == nil && ferr != nil {
				err = ferr
			}
			returned = true
			return sourceEnded(r, name, err, done)
		})
		return []*row{rw}
	}
	return s
}

// sourceEnded is how a source's goroutine ends after its body returned err: an input
// that ended (or a drained budget, which ends it early) closes the next queues (done);
// a stopped run returns its cause, and any other error fails the run under the
// source's name. Only an ended input calls done: after a failure the consumers stop
// with the run's context and take nothing for an end of input.
func sourceEnded(r *run, name string, err error, done func()) error {
	switch {
	case err == nil, isDraining(err):
		done()
		return nil
	case r.ctx.Err() != nil:
		return context.Cause(r.ctx)
	}
	return &StageError{Stage: name, Err: err}
}
