package kafka

import (
	"cmp"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The offsets of one assignment of a partition.
//
// A partition's committed offset is the offset of its first record that is not settled:
// the records a run took from the client are kept in offset order (they come in that
// order, or are put in their place: see addIn), each marked when it settles, in any order; the settled prefix is dropped and
// the watermark moves to one past its last record. Records fetched and not yet taken
// (the client's buffer, a poll the source holds) are not in the list, and come after
// every record that is, so the watermark never passes them.
//
// A part lives for one assignment: a partition revoked (or lost) and assigned back gets
// a new part, whose watermark is unknown until one of its records settles, so that the
// source never commits an offset it remembers from an earlier assignment: the client
// starts the new assignment from the group's committed offset.

// entry states.
const (
	inPipeline   uint8 = iota // emitted, or being dead-lettered: the revoke waits for it
	waitingRetry              // handed back (or its dead letter failed): emitted again later
	settled                   // behind the watermark once every earlier entry is
)

// entry is one record that a run took from the client and has not committed yet. A
// settled entry keeps only its offset and leader epoch (rec is nil): a record settled
// behind an unsettled one costs a few words, not its key and value.
type entry struct {
	p      *part
	rec    *kgo.Record // nil once settled
	offset int64
	epoch  int32
	state  uint8
	inTxn  bool // produced (NewTransactSink) or kept (WithOffsetStore) by the transaction in progress
	// heldBack: a transactional batch (NewTransactSink) or a store transaction
	// (WithOffsetStore) held its record back (past an earlier one neither settled nor
	// produced or written): if its own message settles it so, it is emitted again.
	heldBack bool
	// settling: its message settled otherwise than committed (being dead-lettered, or
	// to wait for a retry), so no transaction takes a stale message of its record
	// until it is emitted again: see session.outputCommitted.
	settling bool
	// txnCommitted: a committed transaction (NewTransactSink's, or a store's) took its
	// record, its output and the offset past it; unlike session.txnDone, it outlasts
	// the assignment's end (see session.staleDeadLetter).
	txnCommitted bool
	// dlSince is when its dead letter first failed (Unix ns), 0 if none did.
	dlSince int64
}

// part is one assignment of a partition to the run.
type part struct {
	tp        TopicPartition
	live      bool // assigned and not revoked or lost
	revoking  bool // being revoked: take no more of its records
	pending   []*entry
	busy      int  // entries inPipeline
	nsettled  int  // entries settled, behind an unsettled one
	paused    bool // its fetches are paused: nsettled reached the bound
	hasMark   bool // mark is known: some record of this assignment settled
	mark      kgo.EpochOffset
	committed int64 // the last offset committed for this assignment, -1 for none
	behind    int64 // records behind mark (settled, no longer pending)
	behindAt  int64 // behind when the last committed mark was taken
	hwm       int64 // the partition's high watermark, last seen (a fetch, a listing), -1 unknown
	start     int64 // the offset of the assignment's first record taken, -1 before one
	logStart  int64 // the partition's log start offset, if listed (for lag before start is known), -1 unknown
	maxPolled int64 // the last offset polled for this assignment, -1 before one
	replayTo  int64 // after a rewind: the last offset polled before it, until polled again; -1 none
	// staleTo (with NewTransactSink or WithOffsetStore): the last offset of a record
	// that may still have a message of an earlier assignment in the pipeline (one in
	// flight when that assignment ended: see session.outputCommitted); -1 none.
	staleTo int64
	// With WithOffsetStore: the assignment's claim of the partition in the store.
	claimed bool
	epoch   int64 // the claim's epoch
	stored  int64 // the next offset known to be in the store, -1 none
}

// admit reports whether a polled record at offset goes on (a transactional source's):
// after a rewind (replayTo), one above what was polled before it comes from a fetch
// made before the rewind and is dropped, until the replay gets back there. A record at
// or below the last polled goes on: addIn refuses it if the assignment has it already,
// and puts it in its place if not. Dropped as a repeat, such a record was lost when a
// stale fetch's records came after the replay had passed replayTo but before the
// replay's own records of the stale ones dropped earlier (the gap between them).
func (p *part) admit(offset int64) bool {
	if p.replayTo >= 0 && offset > p.replayTo {
		return false
	}
	if offset == p.replayTo {
		p.replayTo = -1
	}
	p.maxPolled = max(p.maxPolled, offset)
	if p.start < 0 {
		p.start = offset
	}
	return true
}

func newPart(tp TopicPartition) *part {
	return &part{tp: tp, live: true, committed: -1, hwm: -1, start: -1, logStart: -1, maxPolled: -1, replayTo: -1, staleTo: -1, stored: -1}
}

// lag returns the records of p between its committed offset and its high watermark:
// committed is what this assignment committed, else group (the group's committed
// offset when the assignment began, -1 for none), else the assignment's first record,
// else the partition's log start offset (a group with no commit consumes from there,
// unless told to start at the end: kgo.ConsumeResetOffset). ok is false while either
// end is unknown.
func (p *part) lag(group int64) (lag int64, ok bool) {
	committed := p.committed
	if committed < 0 {
		committed = group
	}
	if committed < 0 {
		committed = p.start
	}
	if committed < 0 {
		committed = p.logStart
	}
	if p.hwm < 0 || committed < 0 {
		return 0, false
	}
	return max(p.hwm-committed, 0), true
}

// add puts rec, a record of the partition, in the pipeline, and returns its entry; nil
// for a record this assignment already has (see addIn).
func (p *part) add(rec *kgo.Record) *entry { return p.addIn(new(entry), rec) }

// addIn is add with e, zero, for rec's entry (one of a slab: see session.take).
//
// Records come in offset order, and are appended. One that does not (at or below the
// last pending one, or behind the watermark) is put in its place instead, or refused
// (nil) if its offset is pending or settled already: the client can hand a plain
// source, after a partition was lost and assigned back, records it fetched for the
// earlier assignment before those it fetches again from the committed offset, and
// then the same records again. Appended out of order, a record would sit behind later
// ones, and the watermark would pass it while it was unsettled.
func (p *part) addIn(e *entry, rec *kgo.Record) *entry {
	*e = entry{p: p, rec: rec, offset: rec.Offset, epoch: rec.LeaderEpoch, state: inPipeline}
	if n := len(p.pending); n > 0 && rec.Offset <= p.pending[n-1].offset || p.hasMark && rec.Offset < p.mark.Offset {
		return p.insert(e)
	}
	if p.start < 0 {
		p.start = rec.Offset
	}
	p.pending = append(p.pending, e)
	p.busy++
	return e
}

// insert puts e, whose record came out of offset order, in its place among the pending
// entries, or returns nil if its offset is pending or behind the watermark.
func (p *part) insert(e *entry) *entry {
	if p.hasMark && e.offset < p.mark.Offset {
		return nil
	}
	i, found := p.search(e.offset)
	if found {
		return nil
	}
	p.pending = slices.Insert(p.pending, i, e)
	p.busy++
	p.start = min(p.start, e.offset) // pending is not empty: start is known
	return e
}

// keepPending is the largest array of pending entries a part keeps once they all
// settled (8 B each), rather than make a new one for its next records.
const keepPending = 4096

// settle marks e settled and moves the watermark over the settled prefix. It reports
// whether the watermark moved.
func (p *part) settle(e *entry) bool {
	if e.state == settled {
		return false
	}
	if e.state == inPipeline {
		p.busy--
	}
	e.state = settled
	e.rec = nil
	p.nsettled++
	n := 0
	for n < len(p.pending) && p.pending[n].state == settled {
		n++
	}
	if n == 0 {
		return false
	}
	last := p.pending[n-1]
	p.mark = kgo.EpochOffset{Epoch: last.epoch, Offset: last.offset + 1}
	p.hasMark = true
	p.behind += int64(n)
	p.nsettled -= n
	if n == len(p.pending) && cap(p.pending) <= keepPending {
		clear(p.pending) // all settled: the array serves the next records
		p.pending = p.pending[:0]
		return true
	}
	clear(p.pending[:n])
	p.pending = p.pending[n:]
	if len(p.pending) == 0 {
		p.pending = nil // let the array go
	}
	return true
}

// search returns where offset is, or would be, in pending (in offset order), and
// whether it is there.
func (p *part) search(offset int64) (int, bool) {
	return slices.BinarySearchFunc(p.pending, offset, func(e *entry, off int64) int { return cmp.Compare(e.offset, off) })
}

// toRetry marks e as waiting to be emitted again.
func (p *part) toRetry(e *entry) {
	if e.state == inPipeline {
		p.busy--
		e.state = waitingRetry
	}
}

// retried marks e, waiting, as in the pipeline again.
func (p *part) retried(e *entry) {
	if e.state == waitingRetry {
		e.state = inPipeline
		e.settling = false
		p.busy++
	}
}

// unsettled returns how many of p's records are not settled, and how many settled
// past the first unsettled one (beyond the watermark).
func (p *part) unsettled() (unsettled, beyond int) {
	for _, e := range p.pending {
		if e.state != settled {
			unsettled++
		} else {
			beyond++
		}
	}
	return unsettled, beyond
}

// uncommitted returns how many records of p settled behind the watermark since the
// last commit.
func (p *part) uncommitted() int64 { return p.behind - p.behindAt }

// due reports whether p has a watermark past what was committed.
func (p *part) due() bool { return p.hasMark && p.mark.Offset > p.committed }
