package pipeline

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// WithOrdered makes a concurrent stage emit its outputs in input order. Workers still
// process items concurrently; a reorder window holds finished items until every earlier
// item has finished (or was dead-lettered, filtered out or skipped, which never stalls
// the window). window is how many items, counted from the oldest unfinished one, may be
// in flight, finished, or being sent on; a worker waits before it starts an item beyond
// it. 0 means the stage's buffer plus 64 × workers: a worker takes as many waiting items
// at once as leave every worker's next run room in the window (at most 64), so this
// lets every queued item go ahead of a slow one, and each worker take runs of 32 items
// or more, before anything waits. Memory is therefore bounded by window items, whatever
// the input; the window's slots are made when the run starts, so a stage with many
// workers and large outputs may want a smaller one.
//
// A slow item at the head stalls the stage's output until it finishes (head-of-line
// blocking), and with it, once the window is full, the stage itself: choose the window
// from the spread of the stage's latency, and pair ordering with [WithTimeout]. It
// panics if window < 0.
//
// Ordering costs a lock in the window per run of items a worker takes, and an atomic
// load before each item starts.
func WithOrdered(window int) StageOption {
	if window < 0 {
		panic(fmt.Sprintf("pipeline: WithOrdered(%d): negative window", window))
	}
	return stageOpt(func(c *config) { c.ordered, c.window = true, window })
}

// slotState is the state of one place in the reorder window.
type slotState uint8

const (
	slotEmpty slotState = iota
	slotReady           // finished, with outputs
	slotSkip            // finished, no output (dead-lettered, filtered, skipped)
)

type slot[Out any] struct {
	state slotState
	pos   uint64
	out   Out   // one-to-one stages: the output
	outs  []Out // flat stages: every output
}

// entry is the outcome of one item of a one-to-one ordered stage, settled with the
// other items of its worker's run; its output is in its slot already (fill).
type entry struct {
	seq  uint64
	skip bool // no output
}

// reorder is the window of an ordered stage. Workers settle each item (or run of
// items) with its sequence number; whichever worker settles the head item flushes
// every consecutive finished item downstream, in order, while the others go on.
type reorder[Out any] struct {
	head     atomic.Uint64 // next, for admit's check without the lock (read per item)
	_        [56]byte      // head on a line of its own: the lock is written on every settle
	mu       sync.Mutex
	next     uint64 // sequence number of the oldest unsettled item
	slots    []slot[Out]
	flushing bool          // a worker is pushing outputs downstream
	waiting  []*waiter     // goroutines waiting for next to advance: each gets a token when it does
	spare    []*waiter     // waiters of earlier waits, for the next: a wait allocates nothing in steady state
	held     atomic.Int64  // items settled with outputs but not yet pushed
	flat     bool          // outputs in slot.outs, not slot.out
	out      sender[Out]   // used by the flusher only
	run      []Out         // the flusher's: outputs put a run at a time (out.putRun), when bulk
}

// newReorder returns the window of an ordered stage whose outputs go to out. tracked
// tells that the run tracks positions: without, and into a plain queue, the flusher
// puts each run of outputs in order with one putRun, not a put per item.
func newReorder[Out any](window int, out sender[Out], flat, tracked bool) *reorder[Out] {
	o := &reorder[Out]{slots: make([]slot[Out], window), out: out, flat: flat}
	if !flat && !tracked && out.putRun != nil {
		o.run = make([]Out, 0, chunk)
	}
	return o
}

// putRun puts the outputs gathered in o.run, and then, if the run stopped midway, offers
// the rest one by one, so that each is counted as sent or unsent; first keeps the first
// error.
func (o *reorder[Out]) putRun(first *error) {
	n, err := o.out.putRun(o.run, nothingBefore)
	if err != nil && *first == nil {
		*first = err
	}
	for _, v := range o.run[n:] {
		_ = o.out.put(v, noPos) // the run's cause again
	}
	clear(o.run)
	o.run = o.run[:0]
}

// nothingBefore is the before of a putRun with no counts to publish.
func nothingBefore(int) {}

// fill records the output of admitted item seq of a one-to-one stage in its slot. The
// slot is the worker's alone until it settles the item (settleRun): the item that had
// it before was pushed and its slot emptied before the head passed it, and the head had
// passed it when seq was admitted.
//
// i is seq's slot, seq modulo the window's size, which the worker follows through its
// run without a division per item.
func (o *reorder[Out]) fill(i int, pos uint64, out *Out) {
	s := &o.slots[i]
	s.pos, s.out = pos, *out
}

// inside reports whether item seq is inside the window, with an atomic load.
func (o *reorder[Out]) inside(seq uint64) bool { return seq < o.head.Load()+uint64(len(o.slots)) }

// admit blocks while item seq is beyond the window, before a worker starts it: the
// items started, finished and being pushed are at most the window. It returns the
// run's cause if the run stops meanwhile. It costs an atomic load when seq is inside.
func (o *reorder[Out]) admit(ctx context.Context, seq uint64) error {
	if o.inside(seq) {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.waitLocked(ctx, seq)
}

// waitLocked waits while seq is beyond the window; o.mu is held when it is called and
// when it returns (the run's cause if the run stops meanwhile).
func (o *reorder[Out]) waitLocked(ctx context.Context, seq uint64) error {
	if seq < o.next+uint64(len(o.slots)) {
		return nil
	}
	var w *waiter // one per wait, kept for the next (a channel per wait cost S5 cpu 4,000 allocations per run)
	if n := len(o.spare); n > 0 {
		w, o.spare = o.spare[n-1], o.spare[:n-1]
	} else {
		w = newWaiter()
	}
	defer func() { o.spare = append(o.spare, w) }()
	for seq >= o.next+uint64(len(o.slots)) {
		o.waiting = append(o.waiting, w)
		o.mu.Unlock()
		select {
		case <-w.ch:
			o.mu.Lock()
		case <-ctx.Done():
			o.mu.Lock()
			// Off the list, with no token left: the flusher wakes under the lock, so
			// either w is still listed or its token is in its channel.
			if i := slices.Index(o.waiting, w); i >= 0 {
				o.waiting = slices.Delete(o.waiting, i, i+1)
			} else {
				<-w.ch
			}
			return context.Cause(ctx)
		}
	}
	return nil
}

// settle records the outcome of item seq, admitted before (outs nil and skip true for
// no output) and, if it is the head, pushes what is now in order. It blocks while seq
// is beyond the window (never, for an admitted item), and returns the run's cause if
// the run stops meanwhile (entered false: the item never entered the window), or the
// first push error. stats counts the outputs this worker pushes. The caller counts the
// item before: once it is in the window, a panic while flushing (in an inline operator
// downstream) must not count it again.
func (o *reorder[Out]) settle(ctx context.Context, stats *workerStats, seq, pos uint64, outs []Out, skip bool) (entered bool, err error) {
	if !skip { // the slot is the worker's until it settles the item (see fill)
		s := &o.slots[seq%uint64(len(o.slots))]
		s.pos, s.outs = pos, append(s.outs[:0], outs...)
	}
	one := [1]entry{{seq: seq, skip: skip}}
	return o.settleRun(ctx, stats, one[:], nil)
}

// settleRun is settle for the items of a run of a one-to-one stage, under one lock:
// onEntered, if not nil, is called once they are in the window, before any flushing.
func (o *reorder[Out]) settleRun(ctx context.Context, stats *workerStats, es []entry, onEntered func()) (entered bool, err error) {
	w := uint64(len(o.slots))
	o.mu.Lock()
	last := es[0].seq
	for _, e := range es {
		last = max(last, e.seq)
	}
	if err := o.waitLocked(ctx, last); err != nil {
		o.mu.Unlock()
		return false, err
	}
	ready := 0
	i := es[0].seq % w // a run's items are consecutive: each slot follows the last, with no division
	for k, e := range es {
		if e.seq != es[0].seq+uint64(k) {
			panic("pipeline: internal error: a run's outcomes are not consecutive")
		}
		if k > 0 {
			if i++; i == w {
				i = 0
			}
		}
		s := &o.slots[i]
		if e.skip {
			s.state = slotSkip
			continue
		}
		s.state = slotReady // its output was filled in before
		ready++
	}
	o.held.Add(int64(ready))
	flush := !o.flushing && o.slots[o.next%w].state != slotEmpty
	o.flushing = o.flushing || flush
	o.mu.Unlock()
	if onEntered != nil {
		onEntered()
	}
	if !flush {
		return true, nil
	}
	return true, o.flush(stats)
}

// flush pushes the finished items at the head of the window, in order, until the head
// is unfinished; the caller has claimed the flush. The slots of the items being pushed
// stay taken until they are pushed, so that the window holds at most its size, pushing
// included; meanwhile only the flusher reads them (their workers are done with them).
func (o *reorder[Out]) flush(stats *workerStats) error {
	w := uint64(len(o.slots))
	// out counts the items pushed and not yet taken out of held; a panic (or Goexit)
	// in an inline operator downstream, in the middle of a run of items, leaves only
	// the rest held, and what the sender holds unsent.
	var out, emitted int64
	returned := false
	defer func() {
		o.held.Add(-out)
		stats.emitted.add(emitted)
		if !returned {
			o.out.drop()
		}
	}()
	o.mu.Lock()
	var first error
	i0 := o.next % w // the head's slot; the others follow it, with no division each
	for {
		end, i := o.next, i0
		for end-o.next < w && o.slots[i].state != slotEmpty {
			end++
			if i++; i == w {
				i = 0
			}
		}
		if end == o.next { // nothing settled in order since the last pass
			o.flushing = false
			o.mu.Unlock()
			returned = true
			return first
		}
		o.mu.Unlock()
		i = i0
		for seq := o.next; seq < end; seq, i = seq+1, i+1 {
			if i == w {
				i = 0
			}
			h := &o.slots[i]
			if h.state != slotReady {
				continue
			}
			if !o.flat {
				if o.run != nil { // put with the rest of the pass, or of its chunk (no user code)
					o.run = append(o.run, h.out)
					if len(o.run) == cap(o.run) {
						o.putRun(&first)
					}
				} else if err := o.out.put(h.out, h.pos); err != nil && first == nil {
					first = err // offer the rest too, so that each is counted as sent or unsent
				}
				var zero Out
				h.out = zero
				emitted++
				out++
				continue
			}
			for _, v := range h.outs {
				if err := o.out.put(v, h.pos); err != nil && first == nil {
					first = err
				}
				emitted++
			}
			clear(h.outs)
			h.outs = h.outs[:0]
			out++ // a flat item with no output too: nothing to push, out of the window
		}
		if len(o.run) > 0 {
			o.putRun(&first)
		}
		if err := o.out.flush(); err != nil && first == nil {
			first = err
		}
		o.held.Add(-out)
		out = 0
		o.mu.Lock()
		for ; o.next < end; o.next++ {
			o.slots[i0].state = slotEmpty
			if i0++; i0 == w {
				i0 = 0
			}
		}
		o.head.Store(o.next)
		wakeSome(&o.waiting, len(o.waiting))
	}
}

// heldCount returns the outputs finished but not pushed: after a run, these were in the
// window when it stopped.
func (o *reorder[Out]) heldCount() int64 { return o.held.Load() }
