package pipeline

import (
	"bytes"
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

// slotState is the state of one place in the reorder window: a byte, so that the
// flusher finds the end of what is settled, and a one-to-one stage's stretches of
// outputs, with bytes.IndexByte, and a worker's run of states is copied in.
type slotState = byte

const (
	slotEmpty slotState = iota
	slotReady           // finished, with outputs
	slotSkip            // finished, no output (dead-lettered, filtered, skipped)
)

// reorder is the window of an ordered stage. Workers settle each item (or run of
// items) with its sequence number; whichever worker settles the head item flushes
// every consecutive finished item downstream, in order, while the others go on.
type reorder[Out any] struct {
	head atomic.Uint64 // next, for admit's check without the lock (read per item)
	_    [56]byte      // head on a line of its own: the lock is written on every settle
	mu   sync.Mutex
	next uint64 // sequence number of the oldest unsettled item
	// The slots, item seq's at seq modulo the window's size, in arrays of their own
	// fields: a one-to-one stage's outputs lie side by side, so that the flusher puts
	// a pass's outputs from there with one putRun, with no copy of its own.
	state    []slotState  // under mu, but for a flusher's reads of the slots it pushes
	outs     []Out        // one-to-one stages: each slot's output
	flats    [][]Out      // flat stages: each slot's outputs
	pos      []uint64     // tracked runs: each slot's position (noPos otherwise)
	flushing bool         // a worker is pushing outputs downstream
	waiting  []*waiter    // goroutines waiting for next to advance: each gets a token when it does
	spare    []*waiter    // waiters of earlier waits, for the next: a wait allocates nothing in steady state
	held     atomic.Int64 // items settled with outputs but not yet pushed
	flat     bool         // outputs in flats, not outs
	bulk     bool         // one-to-one, untracked, into a sender that takes runs: a pass goes out in runs (out.putRun)
	out      sender[Out]  // used by the flusher only
	// taken is how many outputs of the stretch being put the sender took before it
	// waited, or before user code in it panicked (a ForEach): the flusher's only,
	// told by before.
	taken  int
	before func(done int)
}

// newReorder returns the window of an ordered stage whose outputs go to out. tracked
// tells that the run tracks positions: without, and into a plain queue, the flusher
// puts each run of outputs in order with one putRun, not a put per item.
func newReorder[Out any](window int, out sender[Out], flat, tracked bool) *reorder[Out] {
	o := &reorder[Out]{state: make([]slotState, window), out: out, flat: flat}
	if flat {
		o.flats = make([][]Out, window)
	} else {
		o.outs = make([]Out, window)
	}
	if tracked {
		o.pos = make([]uint64, window)
	}
	o.bulk = !flat && !tracked && out.putRun != nil
	o.before = func(done int) { o.taken = done }
	return o
}

// size is the window's size, in items.
func (o *reorder[Out]) size() int { return len(o.state) }

// posAt returns the position of the item in slot i.
func (o *reorder[Out]) posAt(i int) uint64 {
	if o.pos == nil {
		return noPos
	}
	return o.pos[i]
}

// putRun puts the outputs vs (slots of the window) with one putRun, and then, if the
// run stopped midway, offers the rest one by one, so that each is counted as sent or
// unsent; first keeps the first error. It empties the slots' outputs. If user code in
// the sender (a ForEach) panics, o.taken tells the flusher how many it took.
func (o *reorder[Out]) putRun(vs []Out, first *error) {
	o.taken = 0
	n, err := o.out.putRun(vs, o.before)
	o.taken = 0 // put, and counted by the caller
	if err != nil && *first == nil {
		*first = err
	}
	for _, v := range vs[n:] {
		_ = o.out.put(v, noPos) // the run's cause again
	}
	clear(vs)
}

// fill records the output of admitted item seq of a one-to-one stage in its slot. The
// slot is the worker's alone until it settles the item (settleRun): the item that had
// it before was pushed and its slot emptied before the head passed it, and the head had
// passed it when seq was admitted.
//
// i is seq's slot, seq modulo the window's size, which the worker follows through its
// run without a division per item.
func (o *reorder[Out]) fill(i int, pos uint64, out *Out) {
	o.outs[i] = *out
	if o.pos != nil {
		o.pos[i] = pos
	}
}

// inside reports whether item seq is inside the window, with an atomic load.
func (o *reorder[Out]) inside(seq uint64) bool { return seq < o.head.Load()+uint64(len(o.state)) }

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
	if seq < o.next+uint64(len(o.state)) {
		return nil
	}
	var w *waiter // one per wait, kept for the next (a channel per wait cost S5 cpu 4,000 allocations per run)
	if n := len(o.spare); n > 0 {
		w, o.spare = o.spare[n-1], o.spare[:n-1]
	} else {
		w = newWaiter()
	}
	defer func() { o.spare = append(o.spare, w) }()
	for seq >= o.next+uint64(len(o.state)) {
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
	st := [1]slotState{slotSkip}
	if !skip { // the slot is the worker's until it settles the item (see fill)
		i := seq % uint64(len(o.state))
		if o.pos != nil {
			o.pos[i] = pos
		}
		o.flats[i] = append(o.flats[i][:0], outs...)
		st[0] = slotReady
	}
	return o.settleRun(ctx, stats, seq, st[:], nil)
}

// settleRun is settle for a run of items of a one-to-one stage under one lock: items
// seq, seq+1, ..., whose states are states (slotReady, its output filled in before,
// or slotSkip), copied into the window's in at most two pieces. onEntered, if not nil,
// is called once they are in the window, before any flushing.
func (o *reorder[Out]) settleRun(ctx context.Context, stats *workerStats, seq uint64, states []slotState, onEntered func()) (entered bool, err error) {
	w := uint64(len(o.state))
	o.mu.Lock()
	if err := o.waitLocked(ctx, seq+uint64(len(states))-1); err != nil {
		o.mu.Unlock()
		return false, err
	}
	n := copy(o.state[seq%w:], states)
	copy(o.state, states[n:])
	o.held.Add(int64(len(states) - bytes.Count(states, []byte{slotSkip})))
	flush := !o.flushing && o.state[o.next%w] != slotEmpty
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

// settled returns the stretch of settled slots from the head's, i0, up to the first
// empty one: the slots [i0, i0+a) and then, past the end of the ring, [0, b); at most
// the window. o.mu is held.
func (o *reorder[Out]) settled(i0 int) (a, b int) {
	if a = bytes.IndexByte(o.state[i0:], slotEmpty); a >= 0 {
		return a, 0
	}
	a = len(o.state) - i0
	if b = bytes.IndexByte(o.state[:i0], slotEmpty); b < 0 {
		b = i0
	}
	return a, b
}

// flush pushes the finished items at the head of the window, in order, until the head
// is unfinished; the caller has claimed the flush. The slots of the items being pushed
// stay taken until they are pushed, so that the window holds at most its size, pushing
// included; meanwhile only the flusher reads them (their workers are done with them;
// the workers that settle write only slots past them).
func (o *reorder[Out]) flush(stats *workerStats) error {
	w := len(o.state)
	// out counts the items pushed and not yet taken out of held; a panic (or Goexit)
	// in an inline operator downstream, in the middle of a run of items, leaves only
	// the rest held, and what the sender holds unsent.
	var out, emitted int64
	returned := false
	defer func() {
		if !returned && o.bulk { // a panic in a stretch's putRun: what it took before is out
			out += int64(o.taken)
			emitted += int64(o.taken)
		}
		o.held.Add(-out)
		stats.emitted.add(emitted)
		if !returned {
			o.out.drop()
		}
	}()
	o.mu.Lock()
	var first error
	i0 := int(o.next % uint64(w)) // the head's slot; the others follow it, with no division each
	for {
		a, b := o.settled(i0)
		if a+b == 0 { // nothing settled in order since the last pass
			o.flushing = false
			o.mu.Unlock()
			returned = true
			return first
		}
		o.mu.Unlock()
		switch {
		case o.bulk:
			// Each stretch of ready slots, up to a skipped one or the end of the
			// ring, goes out with one putRun straight from the slots.
			for _, p := range [2][2]int{{i0, i0 + a}, {0, b}} {
				for i, e := p[0], p[1]; i < e; {
					k := bytes.IndexByte(o.state[i:e], slotSkip)
					if k < 0 {
						k = e - i
					}
					if k > 0 {
						o.putRun(o.outs[i:i+k], &first)
						emitted += int64(k)
						out += int64(k)
					}
					i += k + 1 // and past the skipped slot
				}
			}
		case !o.flat:
			for k, i := 0, i0; k < a+b; k, i = k+1, i+1 {
				if i == w {
					i = 0
				}
				if o.state[i] != slotReady {
					continue
				}
				if err := o.out.put(o.outs[i], o.posAt(i)); err != nil && first == nil {
					first = err // offer the rest too, so that each is counted as sent or unsent
				}
				var zero Out
				o.outs[i] = zero
				emitted++
				out++
			}
		default:
			for k, i := 0, i0; k < a+b; k, i = k+1, i+1 {
				if i == w {
					i = 0
				}
				if o.state[i] != slotReady {
					continue
				}
				for _, v := range o.flats[i] {
					if err := o.out.put(v, o.posAt(i)); err != nil && first == nil {
						first = err
					}
					emitted++
				}
				clear(o.flats[i])
				o.flats[i] = o.flats[i][:0]
				out++ // a flat item with no output too: nothing to push, out of the window
			}
		}
		if err := o.out.flush(); err != nil && first == nil {
			first = err
		}
		o.held.Add(-out)
		out = 0
		o.mu.Lock()
		clear(o.state[i0 : i0+a])
		clear(o.state[:b])
		o.next += uint64(a + b)
		if i0 += a; b > 0 || i0 == w {
			i0 = b
		}
		o.head.Store(o.next)
		wakeSome(&o.waiting, len(o.waiting))
	}
}

// heldCount returns the outputs finished but not pushed: after a run, these were in the
// window when it stopped.
func (o *reorder[Out]) heldCount() int64 { return o.held.Load() }
