package pipeline

import (
	"context"
	"slices"
	"sort"
)

// This file lets a sink commit its effects and the run's progress in one transaction
// (see [Commit]), and lets a resumed run skip the source items committed above the saved
// watermark (see [CommittedStore]).

// PositionRange is a half-open range [From, To) of source positions.
type PositionRange struct {
	From, To int64
}

// Progress is what settling a sink's current item records in a checkpointed run (see
// [Commit]): the positions settled when Commit was called, and the item's own.
// Checkpointed is false outside one, or when the item is not tracked; then Watermark
// and Committed are zero.
type Progress struct {
	Checkpointed bool
	// Watermark is a position the checkpoint may advance to once the item settles:
	// every source item below it is settled, or settles with the item. It covers no
	// position of an item whose settling is still under way (another Commit's function
	// running), so it holds whether or not that item's transaction commits. Concurrent
	// Commits may record their watermarks in any order: a store keeps the largest.
	Watermark int64
	// Committed are the positions at or above Watermark that settle with the item, in
	// increasing order: a store keeps them so that a resumed run skips them (see
	// [CommittedStore]). Positions below Watermark are covered by it.
	Committed []PositionRange
}

// CommittedStore is a [CheckpointStore] that also keeps the positions settled above its
// watermark: committed by a sink (recorded through [Commit]'s [Progress]), dead-lettered
// (a destination took the item), or filtered out. A run resumed from such a store calls
// LoadCommitted instead of Load and does not emit the items at those positions again:
// they settle at once, and no stage sees them, so an item the previous run already
// dead-lettered is neither set aside twice nor counted again by an error budget.
// Without it, a resumed run redoes every item above the saved position.
//
// The run saves with SaveCommitted instead of Save: the watermark and every range it
// knows to be settled above it, the ranges loaded at its start included. SaveCommitted
// must add committed to the ranges the store keeps, never drop one above pos: a
// [Commit] may record a range in its own transaction while a save of a moment earlier,
// which does not know it yet, is on its way. Positions settled after the last save
// are redone after a crash (a SIGKILL), unless their sink recorded them with [Commit]
// in its own transaction; a dead-letter destination can do the same (pgpipe's
// DeadLetterTable with a checkpoint does), which makes a resume exact for dead letters
// too.
//
// Neither Save, SaveCommitted nor the progress a [Commit] writes may lower the stored
// position: keep the larger one (pgpipe's Checkpoint writes GREATEST). The run's
// periodic save of a watermark read a moment earlier can reach the store after a Commit
// recorded a newer one, and a store that took it as it is would make a resumed run redo
// committed items.
type CommittedStore interface {
	CheckpointStore
	LoadCommitted(ctx context.Context) (pos int64, committed []PositionRange, err error)
	SaveCommitted(ctx context.Context, pos int64, committed []PositionRange) error
}

// commitScope is the item a checkpointed sink's function is processing, reachable from
// the attempt's context.
type commitScope struct {
	t   *checkpointTracker
	pos *uint64 // the worker's current position: set to noPos once Commit settled it
}

type commitKey struct{}

// scope implements [tracker]: it returns ctx carrying the position *pos for [Commit].
// It costs one allocation per attempt of a checkpointed sink, none elsewhere.
func (t *checkpointTracker) scope(ctx context.Context, pos *uint64) context.Context {
	return context.WithValue(ctx, commitKey{}, &commitScope{t: t, pos: pos})
}

// Commit runs fn with the [Progress] that settling the current item of a sink would
// record, and settles the item at once if fn returns nil, so that a sink can write its
// effects and the advanced checkpoint in one transaction: fn writes the progress (for
// example into the same database transaction as the item's rows) and commits. Call it
// from a sink's function ([NewSink]), with the context the function was given, at most
// once per attempt; after it returned nil, the function should return nil too. A
// stage's dead-letter destination ([WithDeadLetter]) may call it the same way, with the
// context it was given, to record the dead-lettered item's position with the record.
//
// fn runs with no lock of the run held: other items settle, and other sinks' and
// workers' Commits run, while it does, so that one slow transaction stalls no one.
// The exception is items derived from one source position (a flat-map's pieces, a
// [Tee]'s copies, batches that share a position): a Commit of one of them waits while
// another one's function runs, so that the last of them to commit records the position
// (had both previewed at once, each would leave the position to the other). Do the
// item's writes inside fn, or at least none that another piece's fn must wait for.
// The progress fn is given counts the positions settled when Commit was called and the
// item's own; it may lag what the run has settled by the time fn commits (a position
// settled meanwhile is recorded by its own item's Commit, or by the run's next save),
// but it never covers a position whose effects are not committed, whichever of the
// transactions running at once commit or roll back. A store that keeps the largest
// watermark and the union of the ranges (see [CommittedStore]) is therefore exact, and
// must not rely on the order in which concurrent Commits' transactions commit.
//
// Outside a checkpointed run ([FromCheckpoint]; an acknowledged one, [FromAcked], has no
// progress to commit), or outside a sink's function or a dead-letter destination, Commit calls fn
// with the zero Progress and settles nothing. It returns fn's error.
//
// Exactness holds for items that reach the sink once per source position (no flat-map
// into several sink items, no [Tee] into several sinks): then a crash after fn
// committed never redoes the item. Otherwise the source position settles with its last
// derived item, and a resume may redo the others.
func Commit(ctx context.Context, fn func(ctx context.Context, p Progress) error) error {
	cs, _ := ctx.Value(commitKey{}).(*commitScope)
	if cs == nil || *cs.pos == noPos {
		return fn(ctx, Progress{})
	}
	t, pos := cs.t, *cs.pos
	t.mu.Lock()
	// Pieces of one position commit one at a time: a piece's preview leaves the position
	// to a sibling while a ref is left, so two previews at once would both leave it, and
	// no commit would record it (while later positions record themselves above the
	// watermark). Unrelated items do not wait. No lock across fn, a transaction: holding
	// the tracker there stalled every settle of the run and every other writer.
	var nodes []uint64
	for {
		var wait bool
		if nodes, wait = t.siblings(pos); !wait {
			break
		}
		if t.commitWake == nil {
			t.commitWake = make(chan struct{})
		}
		ch := t.commitWake
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		t.mu.Lock()
	}
	if t.committing == nil {
		t.committing = map[uint64]int{}
	}
	for _, n := range nodes {
		t.committing[n]++
	}
	p := t.preview(pos)
	t.mu.Unlock()
	// The preview counts only positions settled already (their effects are committed)
	// and pos's own, so what fn records stays true however the others' transactions end.
	var err error
	returned := false
	defer func() { // also when fn panics: the siblings waiting must not wait forever
		t.mu.Lock()
		defer t.mu.Unlock()
		for _, n := range nodes {
			if t.committing[n]--; t.committing[n] == 0 {
				delete(t.committing, n)
			}
		}
		if returned && err == nil {
			t.settleLocked(pos) // under the lock of the wake: a waiting sibling sees it settled
		}
		if t.commitWake != nil {
			close(t.commitWake)
			t.commitWake = nil
		}
	}()
	err = fn(ctx, p)
	returned = true
	if err != nil {
		return err
	}
	*cs.pos = noPos // settled: the worker's settle after the function returns is skipped
	return nil
}

// siblings returns the nodes preview(pos) walks that keep a ref for a sibling piece
// (only at those can another piece's Commit wait on this one), and whether it would
// consume a ref of a node where another item's Commit is running its function: then
// that Commit's preview consumed one too, and neither would claim the node, so the
// caller must wait for it to end. t.mu must be held.
func (t *checkpointTracker) siblings(pos uint64) (nodes []uint64, wait bool) {
	used := map[uint64]int{}
	var walk func(p uint64)
	walk = func(p uint64) {
		if t.refs[p]-used[p] > 0 { // a node left to siblings: the only ones a sibling may wait on
			nodes = append(nodes, p)
			if t.committing[p] > 0 {
				wait = true
			}
			used[p]++
			return
		}
		if p&groupBit != 0 {
			for _, m := range t.groups[p] {
				walk(m)
			}
		}
	}
	walk(pos)
	return nodes, wait
}

// preview computes, without changing anything, what settling one item of pos would
// settle if it settled now. t.mu must be held. A node with a ref left consumes one here
// and is not claimed: a sibling item settles it later, and Commit makes sure that no
// sibling's function is running meanwhile (siblings), so the last one claims it.
func (t *checkpointTracker) preview(pos uint64) Progress {
	var leaves []uint64
	used := map[uint64]int{} // refs consumed by this walk
	var walk func(p uint64)
	walk = func(p uint64) {
		if t.refs[p]-used[p] > 0 {
			used[p]++
			return
		}
		if p&groupBit != 0 {
			for _, m := range t.groups[p] {
				walk(m)
			}
			return
		}
		leaves = append(leaves, p)
	}
	walk(pos)
	slices.Sort(leaves)
	leaves = slices.Compact(leaves)
	next := t.next
	for {
		if _, ok := t.settled[next]; ok {
			next++
			continue
		}
		if _, ok := slices.BinarySearch(leaves, next); ok {
			next++
			continue
		}
		break
	}
	p := Progress{Checkpointed: true, Watermark: int64(next)}
	for _, l := range leaves {
		if l < next {
			continue
		}
		if n := len(p.Committed); n > 0 && p.Committed[n-1].To == int64(l) {
			p.Committed[n-1].To++
			continue
		}
		p.Committed = append(p.Committed, PositionRange{From: int64(l), To: int64(l) + 1})
	}
	return p
}

// loadCheckpoint loads a store's position and, from a [CommittedStore], the committed
// ranges above it, sorted and cut at the position.
func loadCheckpoint(ctx context.Context, store CheckpointStore) (int64, []PositionRange, error) {
	cs, ok := store.(CommittedStore)
	if !ok {
		pos, err := store.Load(ctx)
		return pos, nil, err
	}
	pos, ranges, err := cs.LoadCommitted(ctx)
	if err != nil {
		return 0, nil, err
	}
	var skip []PositionRange
	for _, r := range ranges {
		r.From = max(r.From, pos)
		if r.From < r.To {
			skip = append(skip, r)
		}
	}
	sort.Slice(skip, func(i, j int) bool { return skip[i].From < skip[j].From })
	return pos, skip, nil
}

// skipped implements [tracker]: pos was committed in an earlier run. Positions come in
// increasing order, so the ranges are consumed from the front.
func (t *checkpointTracker) skipped(pos uint64) bool {
	for len(t.skip) > 0 && uint64(t.skip[0].To) <= pos {
		t.skip = t.skip[1:]
	}
	if len(t.skip) == 0 || pos < uint64(t.skip[0].From) {
		return false
	}
	t.settle(pos)
	return true
}
