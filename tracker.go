package pipeline

import (
	"context"
	"slices"
	"sync"
)

// tracker follows the items derived from the tracked source's positions through one
// run (DESIGN.md, section 4). A run always has one: a checkpointTracker for
// [FromCheckpoint] (a watermark over positions, checkpoint.go), an ackTracker for
// [FromAcked] (a settle callback per position, ack.go), or noTrack, which tracks
// nothing. Operators reach it only through the sender they are given (sender.split,
// sender.settle, ...), which passes over noPos, so that an untracked run makes no call.
type tracker interface {
	// split records that the item at pos became k items, each of which will settle;
	// k = 0 settles it at once.
	split(pos uint64, k int)
	// group returns a position that stands for every one of positions (a batch's
	// items): settling it settles each of them.
	group(positions []uint64) uint64
	// ungroup returns the positions of the n items of pos, one per item, when pos is
	// a group of n made by group and not split since; otherwise it splits pos into n
	// and returns nil.
	ungroup(pos uint64, n int) []uint64
	// settle settles one item derived from pos: a sink committed it, a filter dropped
	// it, or the loop over [All] is done with it.
	settle(pos uint64)
	// settleAll settles one item derived from each of positions, as settle would one
	// by one, in one lock (a sink worker's run of committed items).
	settleAll(positions []uint64)
	// setAside settles one item derived from pos that a stage set aside: its record
	// m.dl went to the dead-letter destination, or, with m.back, it goes back to its
	// source ([WithHandBack]). The tracker copies what it keeps of m.
	setAside(pos uint64, m *ackMark)
	// admit blocks until the tracked source may emit the item at pos, records settle,
	// its callback (FromAcked), and returns the position up to which the source may go
	// on without asking again. It returns the run's cause when ctx is done first, and
	// errDraining when a budget drains.
	admit(ctx context.Context, pos uint64, settle func(Settlement)) (bound uint64, err error)
	// skipped reports whether pos was committed in an earlier run; if so, it settles
	// it, and the source does not emit it.
	skipped(pos uint64) bool
	// hungry returns a channel that is closed while the source waits in admit: then a
	// batch holding items judges whether to flush them (holdsHead).
	hungry() <-chan struct{}
	// holdsHead reports whether positions, a batch's, may hold the waiting source
	// back. When they do not, moved (if not nil) is closed once that may have changed.
	holdsHead(positions []uint64) (holds bool, moved <-chan struct{})
	// scope returns ctx carrying *pos, the position of a sink's item in hand, for
	// [Commit] (commit.go); ctx itself when there is no progress to commit.
	scope(ctx context.Context, pos *uint64) context.Context
	// handsBack reports whether a stage can give the item at pos back to its source:
	// every source position it derives from is the tracked source's.
	handsBack(pos uint64) bool
	// finish ends the tracking once every goroutine of the run has ended: the final
	// save of a checkpoint, the NotProcessed settlements of an acknowledged source.
	finish(r *run) error
}

// noTrack is the tracker of a run without a tracked source: it tracks nothing.
type noTrack struct{}

func (noTrack) split(uint64, int)                                               {}
func (noTrack) group([]uint64) uint64                                           { return noPos }
func (noTrack) ungroup(uint64, int) []uint64                                    { return nil }
func (noTrack) settle(uint64)                                                   {}
func (noTrack) settleAll([]uint64)                                              {}
func (noTrack) setAside(uint64, *ackMark)                                       {}
func (noTrack) admit(context.Context, uint64, func(Settlement)) (uint64, error) { return noPos, nil }
func (noTrack) skipped(uint64) bool                                             { return false }
func (noTrack) hungry() <-chan struct{}                                         { return nil }
func (noTrack) holdsHead([]uint64) (bool, <-chan struct{})                      { return false, nil }
func (noTrack) scope(ctx context.Context, _ *uint64) context.Context            { return ctx }
func (noTrack) handsBack(uint64) bool                                           { return false }
func (noTrack) finish(*run) error                                               { return nil }

// groupBit marks a tracker position that stands for a group (a batch) of positions.
// noPos has it too, and stands for an empty group: settling it settles nothing.
const groupBit = uint64(1) << 63

// lineage is what both trackers keep of the items derived from source positions (refs
// for the splits, groups for the batches), and the tracked source's wait (waitLocked),
// all under one lock. Each tracker embeds one and decides what becomes of a position
// whose items have all settled (unwindLocked's leaves).
type lineage struct {
	mu     sync.Mutex
	refs   map[uint64]int      // extra derived items still to settle, per position
	groups map[uint64][]uint64 // batch id -> member positions
	gid    uint64
	leaves []uint64 // unwindLocked's result, reused

	// The source's wait. While it waits, hunger is closed: batches flush what holds it
	// back (they would otherwise wait for more input, which the source cannot send).
	wake     chan struct{} // closed when the source may go on, made only when it waits
	hunger   chan struct{}
	starving bool
	drain    <-chan struct{} // closed when a budget drains: a waiting source stops
}

func (l *lineage) init() {
	l.refs, l.groups = map[uint64]int{}, map[uint64][]uint64{}
}

// refer records that the item at pos became k items, and reports whether pos settles
// now instead (k = 0).
func (l *lineage) refer(pos uint64, k int) (now bool) {
	if pos == noPos || k == 1 {
		return false
	}
	if k == 0 {
		return true
	}
	l.mu.Lock()
	l.refs[pos] += k - 1
	l.mu.Unlock()
	return false
}

// group implements [tracker]. A batch of items of untracked sources only (every
// position noPos: a source merged with the tracked one) is noPos itself, as its items
// are: it holds no position back, and cannot be handed back.
func (l *lineage) group(positions []uint64) uint64 {
	if !slices.ContainsFunc(positions, func(p uint64) bool { return p != noPos }) {
		return noPos
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gid++
	id := groupBit | l.gid
	l.groups[id] = positions
	return id
}

// members is ungroup's own part: the members of group pos of n items, which it forgets;
// or, when pos is no such group, nil, after refer(pos, n).
func (l *lineage) members(pos uint64, n int) (m []uint64, now bool) {
	if pos == noPos {
		return nil, false
	}
	l.mu.Lock()
	if m, ok := l.groups[pos]; ok && len(m) == n && l.refs[pos] == 0 {
		delete(l.groups, pos)
		l.mu.Unlock()
		return m, false
	}
	l.mu.Unlock()
	return nil, l.refer(pos, n)
}

// trackedLocked reports whether every source position that pos derives from is a
// tracked one: pos itself, or each member of the group it is (a batch), at any depth.
// l.mu must be held.
func (l *lineage) trackedLocked(pos uint64) bool {
	if pos == noPos {
		return false
	}
	if pos&groupBit == 0 {
		return true
	}
	for _, m := range l.groups[pos] {
		if !l.trackedLocked(m) {
			return false
		}
	}
	return true
}

// unwindLocked settles one item derived from pos: a position with a ref left gives up
// one and nothing more, a group settles each member. It returns the source positions
// whose derived items have now all settled (in a slice it reuses). l.mu must be held.
func (l *lineage) unwindLocked(pos uint64) []uint64 {
	l.leaves = l.leaves[:0]
	l.unwind(pos)
	return l.leaves
}

func (l *lineage) unwind(pos uint64) {
	if n := l.refs[pos]; n > 0 {
		if n == 1 {
			delete(l.refs, pos)
		} else {
			l.refs[pos] = n - 1
		}
		return
	}
	if pos&groupBit != 0 {
		members := l.groups[pos]
		delete(l.groups, pos)
		for _, m := range members {
			l.unwind(m)
		}
		return
	}
	l.leaves = append(l.leaves, pos)
}

// waitLocked is the tracked source's one wait, for a save (a checkpoint) or for room
// (acknowledgements): with l.mu held, it waits, unlocked, while blocked reports true.
// When the wait begins, hunger is closed and starve is called (if not nil). It returns
// with l.mu held: nil once blocked is false, the run's cause if ctx is done first,
// errDraining if a budget drains. The waker calls openLocked.
func (l *lineage) waitLocked(ctx context.Context, blocked func() bool, starve func()) error {
	for blocked() {
		if l.wake == nil {
			l.wake = make(chan struct{})
		}
		if !l.starving {
			l.starving = true
			if l.hunger == nil {
				l.hunger = make(chan struct{})
			}
			close(l.hunger)
			if starve != nil {
				starve()
			}
		}
		wake := l.wake
		l.mu.Unlock()
		var err error
		select {
		case <-wake:
		case <-ctx.Done():
			err = context.Cause(ctx)
		case <-l.drain:
			err = errDraining
		}
		l.mu.Lock()
		if err != nil {
			return err
		}
	}
	return nil
}

// openLocked wakes the waiting source, if any, to judge again, and ends the hunger.
// l.mu must be held.
func (l *lineage) openLocked() {
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
	if l.starving {
		l.starving, l.hunger = false, nil
	}
}

// hungry implements [tracker].
func (l *lineage) hungry() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hunger == nil {
		l.hunger = make(chan struct{})
	}
	return l.hunger
}

// The sender is how a producer derives and settles the positions of what it sends:
// no operator holds the tracker.

// wrap returns a sender that puts with put and flushes and drops as snd does: an inline
// operator's in front of its consumer's.
func wrap[In, Out any](snd sender[Out], put pushFunc[In]) sender[In] {
	return sender[In]{put: put, flush: snd.flush, drop: snd.drop, track: snd.track}
}

// positions returns a sender that puts nothing and only derives and settles positions,
// for a goroutine whose outputs another one sends (an ordered stage's workers: the
// window's flusher puts them).
func (s *sender[T]) positions() sender[T] { return sender[T]{track: s.track} }

// settler returns the sender of a run's end (a sink's, the collecting end's): an item
// put into it is done with, so its position settles.
func settler(t tracker) sender[struct{}] {
	return sender[struct{}]{
		put: func(_ struct{}, pos uint64) error {
			if pos != noPos {
				t.settle(pos)
			}
			return nil
		},
		flush: func() error { return nil },
		drop:  func() {},
		track: t,
	}
}

// runSettler returns the sender of a sink's workers: as settler's, but it keeps the
// positions of the items put and settles them together, at a flush (the end of the
// worker's run, at most a chunk of items: see worker.items), at a drop (the worker
// stops: its items were committed all the same), or once it holds a chunk. An item's
// settlement so waits at most for the rest of its run, as a stage's outputs wait in
// its sender for the run's end; and the tracker's lock is taken once per run.
func runSettler(t tracker) sender[struct{}] {
	var held []uint64
	flush := func() error {
		if len(held) == 0 {
			return nil
		}
		positions := held
		held = held[:0] // first: a panic in a settle callback must not settle them twice
		t.settleAll(positions)
		return nil
	}
	return sender[struct{}]{
		put: func(_ struct{}, pos uint64) error {
			if pos == noPos {
				return nil
			}
			if held == nil {
				held = make([]uint64, 0, chunk)
			}
			held = append(held, pos)
			if len(held) == chunk {
				return flush()
			}
			return nil
		},
		flush: flush,
		drop:  func() { _ = flush() },
		track: t,
	}
}

// split records that the item at pos became k items (k = 0: it settled).
func (s *sender[T]) split(pos uint64, k int) {
	if pos != noPos && k != 1 {
		s.track.split(pos, k)
	}
}

// group returns the position of a batch of items at positions.
func (s *sender[T]) group(positions []uint64) uint64 { return s.track.group(positions) }

// ungroup returns the positions of the n items of a batch at pos, or nil after
// splitting pos into n (see tracker.ungroup).
func (s *sender[T]) ungroup(pos uint64, n int) []uint64 {
	if pos == noPos {
		return nil
	}
	return s.track.ungroup(pos, n)
}

// settle settles an item derived from pos: committed, filtered out, or done with.
func (s *sender[T]) settle(pos uint64) {
	if pos != noPos {
		s.track.settle(pos)
	}
}

// setAside settles an item derived from pos that a stage set aside (m: its record, or
// its hand-back).
func (s *sender[T]) setAside(pos uint64, m *ackMark) {
	if pos != noPos {
		s.track.setAside(pos, m)
	}
}

// admit waits until the tracked source may emit pos (see tracker.admit).
func (s *sender[T]) admit(ctx context.Context, pos uint64, settle func(Settlement)) (uint64, error) {
	return s.track.admit(ctx, pos, settle)
}

// skipped reports whether the tracked source's pos was committed in an earlier run,
// and settles it if so.
func (s *sender[T]) skipped(pos uint64) bool { return s.track.skipped(pos) }

// hungry and holdsHead tell a batch when the tracked source waits for items it holds
// (see tracker.hungry).
func (s *sender[T]) hungry() <-chan struct{} { return s.track.hungry() }

func (s *sender[T]) holdsHead(positions []uint64) (bool, <-chan struct{}) {
	return s.track.holdsHead(positions)
}

// scope returns ctx carrying *pos for [Commit] (see tracker.scope).
func (s *sender[T]) scope(ctx context.Context, pos *uint64) context.Context {
	if *pos == noPos {
		return ctx
	}
	return s.track.scope(ctx, pos)
}

// handsBack reports whether the item at pos can be handed back to the tracked source.
func (s *sender[T]) handsBack(pos uint64) bool { return pos != noPos && s.track.handsBack(pos) }
