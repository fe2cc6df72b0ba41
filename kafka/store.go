package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
)

// OffsetStore keeps the consumed offsets of a group's partitions outside Kafka, in the
// store a sink writes its outputs to, so that outputs and offsets commit together
// ([WithOffsetStore]). The kafkapg package implements it in PostgreSQL. A store serves
// one consumer group (its members share it); its methods are called by the source's
// run, concurrently with each other and with a sink's transactions.
type OffsetStore interface {
	// Claim takes partitions over for the calling member, in one transaction: for each
	// partition it bumps an epoch, which fences every earlier owner (their
	// transactions that store an offset under an older epoch write nothing), and
	// returns the new epoch and the next offset stored (-1 when none is). The
	// partitions come sorted by topic and partition; the claims may come in any order,
	// one per partition. An error with the class [pipeline.ClassFatal] fails the run;
	// the source retries others.
	Claim(ctx context.Context, partitions []TopicPartition) ([]Claim, error)
	// Save stores offsets (never moving one back), each only if its partition's epoch
	// is still the one given, and returns the partitions whose epoch was not: another
	// owner claimed them. The source saves, every [WithCommitInterval] and at a
	// revoke, the offsets that records settled without a sink's transaction took their
	// partitions to (filtered out, dead-lettered). An error with the class
	// [pipeline.ClassFatal] fails the run.
	Save(ctx context.Context, offsets []StoreOffset) (fenced []TopicPartition, err error)
}

// Claim is an [OffsetStore]'s answer for one partition it claimed.
type Claim struct {
	TopicPartition
	Epoch int64 // the claim's epoch, which the owner's writes must carry
	Next  int64 // the next offset to consume, as stored; -1 when none is
}

// StoreOffset is the offset to store for a partition: Next, the next record to
// consume, one past the last one whose output committed (or that settled otherwise),
// under the epoch of the claim that made this member its owner.
type StoreOffset struct {
	TopicPartition
	Epoch int64
	Next  int64
}

// Origin names the input record an item comes from: a sink's item that carries it
// (a [Message] whose Topic, Partition and Offset were copied from the source's) can be
// matched to the source's bookkeeping ([Source.BeginStoreTxn]).
type Origin struct {
	TopicPartition
	Offset int64
}

// Origin returns the record m names.
func (m Message[T]) Origin() Origin {
	return Origin{TopicPartition: m.TopicPartition(), Offset: m.Offset}
}

// WithOffsetStore keeps the consumed offsets in store, where a sink commits them in
// the transaction of its outputs (kafkapg.NewSink does this for PostgreSQL). On each
// assignment the source claims the partitions in store (one transaction, which fences
// their earlier owners) and starts each one from the offset stored, or, with none
// stored, from the group's committed offset (or kgo.ConsumeResetOffset) as without a
// store. A claim that fails is retried until the rebalance moves on, which assigns the
// partitions again. The source still commits its watermarks to the group, for lag
// tools, but they do not decide where an owner starts. It panics if store is nil;
// [NewSource] panics if [WithTransactionalID] is given too.
func WithOffsetStore(store OffsetStore) SourceOption {
	if store == nil {
		panic("kafka: WithOffsetStore(nil)")
	}
	return sourceOpt(func(c *sourceConfig) { c.store = store })
}

// OffsetStore returns the store of [WithOffsetStore], nil without one.
func (s *Source[T]) OffsetStore() OffsetStore { return s.cfg.store }

// StoreTxn is one transaction of a sink that commits its outputs and the consumed
// offsets together in the source's [OffsetStore]: [Source.BeginStoreTxn] says what to
// write and store, [StoreTxn.End] what happened.
type StoreTxn struct {
	// Offsets are the offsets to store in the transaction, sorted by topic and
	// partition: each partition that Keep has a record of, or whose offset moved, with
	// its claim's epoch. The transaction must store them fenced by their epochs, and
	// commit nothing (roll back) when a partition's epoch is not the one given: that
	// partition has another owner now.
	Offsets []StoreOffset
	// Keep tells, for each origin given to BeginStoreTxn, whether its output goes
	// into the transaction: its record is in the pipeline of a partition this member
	// owns, every earlier record of the partition settled or is written, and no other
	// item named it first (a message from before a partition was
	// claimed again names the same record as its replay: the first to reach a
	// transaction is its output).
	Keep []bool
	end  func(committed bool, fenced []TopicPartition)
}

// End reports the transaction's outcome and lets the next one begin: committed, or
// not (nothing of it committed: it may be tried again with a new BeginStoreTxn). fenced
// are the partitions the transaction found claimed by another owner (it committed
// nothing then): the source ends their assignment, and their records still in the
// pipeline are not output again (they settle as [Stats].Stale). Call it exactly once.
func (t *StoreTxn) End(committed bool, fenced []TopicPartition) { t.end(committed, fenced) }

// BeginStoreTxn begins a sink's transaction in the source's [OffsetStore] for items
// whose records are from: it returns which of them to output and the offsets to store,
// and holds the source's store lock (one such transaction at a time) until
// [StoreTxn.End]. A partition's offset goes past a batch's records when every earlier
// record of the partition settled or is in the batch, so the sink must get each
// partition's records in offset order (a stage keyed by [Message.TopicPartition]) and
// every output of a record in one batch. A record past an earlier one neither settled
// nor written is not kept (counted in [Stats].OutOfOrder): the offset could not be
// stored past the earlier one, and whoever redoes the partition from there would write
// it again. Such a message is most often one from before the partition was claimed
// again, whose replay comes later in order; a record's own message not kept is emitted
// again once it settles, and written by a later transaction. It fails if the source
// has no store or is not running.
func (s *Source[T]) BeginStoreTxn(from []Origin) (*StoreTxn, error) {
	if s.cfg.store == nil {
		return nil, errors.New("kafka: BeginStoreTxn: the source has no WithOffsetStore")
	}
	ss := s.session()
	if ss == nil {
		return nil, errors.New("kafka: BeginStoreTxn: the source is not running")
	}
	ss.storeMu.Lock()
	offs, keep, parts, marks, kept := ss.storeProspect(from)
	return &StoreTxn{Offsets: offs, Keep: keep, end: func(committed bool, fenced []TopicPartition) {
		defer ss.storeMu.Unlock()
		ss.mu.Lock()
		defer ss.mu.Unlock()
		ok := committed && len(fenced) == 0
		if ok {
			for p, next := range marks {
				p.stored = max(p.stored, next)
			}
			if ss.txnDone == nil {
				ss.txnDone = map[*entry]bool{}
			}
			ss.s.transactions.Add(1)
		}
		for _, e := range kept {
			e.inTxn = false
			if ok {
				ss.txnDone[e] = true
				e.txnCommitted = true
			}
		}
		ss.signalLocked() // a settle may wait for the transaction (outputCommitted)
		ss.fenceLocked(parts, fenced)
	}}, nil
}

// storeProspect returns what a store transaction for items from writes: the offsets,
// per owned partition, one past the prefix of records settled, kept, or in a committed
// transaction and not settled yet (txnDone), for each partition kept or whose offset
// passes what is stored; which items to keep; per part its offset; and the entries
// kept, marked inTxn until the transaction ends.
func (ss *session[T]) storeProspect(from []Origin) (offs []StoreOffset, keep []bool, parts map[TopicPartition]*part, marks map[*part]int64, kept []*entry) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	keep = make([]bool, len(from))
	kept = make([]*entry, 0, len(from))
	touched := map[*part]bool{}
	done := func(e *entry) bool { return e.state == settled || e.inTxn || ss.txnDone[e] }
	ord := inOrder{}
	var (
		p    *part // of lastTP: a batch holds runs of one partition's records
		last TopicPartition
	)
	for i, o := range from {
		if p == nil || o.TopicPartition != last {
			p, last = ss.parts[o.TopicPartition], o.TopicPartition
		}
		if p == nil || !p.live || !p.claimed {
			continue
		}
		j := p.index(o.Offset)
		if j < 0 {
			continue
		}
		e := p.pending[j]
		if e.state != inPipeline || e.settling || e.inTxn || ss.txnDone[e] {
			continue // settling: its own message's outcome is under way (outputCommitted)
		}
		if ord.past(p, j, done) { // past a record neither settled nor written: its offset could not be stored
			ss.holdBack(e)
			continue
		}
		keep[i] = true
		e.inTxn = true
		kept = append(kept, e)
		touched[p] = true
	}
	parts = map[TopicPartition]*part{}
	marks = map[*part]int64{}
	for tp, p := range ss.parts {
		if !p.live || !p.claimed {
			continue // a revoking partition is ours until its revoke ends
		}
		next := p.stored
		if p.hasMark {
			next = max(next, p.mark.Offset)
		}
		for n := 0; n < len(p.pending) && done(p.pending[n]); n++ {
			next = max(next, p.pending[n].offset+1)
		}
		if next > p.stored || touched[p] {
			offs = append(offs, StoreOffset{TopicPartition: tp, Epoch: p.epoch, Next: next})
			parts[tp] = p
			marks[p] = next
		}
	}
	sortOffsets(offs)
	return offs, keep, parts, marks, kept
}

// inOrder is, per partition, how many of its first pending records are done (settled,
// or in a transaction), as a transaction's prospect extends it record by record.
type inOrder map[*part]int

// past reports whether p.pending[j] comes past a record of p that is not done: a
// transaction cannot move p's offset past that one, so whoever redoes p from there
// would output this record again.
func (o inOrder) past(p *part, j int, done func(*entry) bool) bool {
	n := o[p]
	for n < len(p.pending) && done(p.pending[n]) {
		n++
	}
	o[p] = n
	return j > n
}

// holdBack marks e held back by a transaction's prospect (counted in
// Stats.OutOfOrder): if its own message settles it unwritten, it is emitted again
// (unproduced). ss.mu must be held.
func (ss *session[T]) holdBack(e *entry) {
	e.heldBack = true
	ss.s.outOfOrder.Add(1)
}

// index returns the index in pending of the record at offset, -1 if none is. Offsets
// are mostly consecutive: it looks where offset would be if they all were, before it
// searches.
func (p *part) index(offset int64) int {
	n := len(p.pending)
	if n == 0 {
		return -1
	}
	if g := offset - p.pending[0].offset; g >= 0 && g < int64(n) && p.pending[g].offset == offset {
		return int(g)
	}
	j, ok := p.search(offset)
	if !ok {
		return -1
	}
	return j
}

func sortOffsets(offs []StoreOffset) {
	slices.SortFunc(offs, func(a, b StoreOffset) int { return compareTP(a.TopicPartition, b.TopicPartition) })
}

func compareTP(a, b TopicPartition) int {
	return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
}

// fenceLocked ends the assignments of the fenced partitions (parts holds the parts the
// caller read): another owner claimed them. ss.mu must be held.
func (ss *session[T]) fenceLocked(parts map[TopicPartition]*part, fenced []TopicPartition) {
	for _, tp := range fenced {
		p := parts[tp]
		if p == nil {
			continue
		}
		ss.s.fenced.Add(1)
		if p.live {
			ss.s.uncommitted.Add(p.uncommitted() + ss.endPartLocked(p))
		}
	}
}

// adjust claims the partitions whose offsets the client fetched from the group (a
// new assignment) in the offset store, and starts each one from the offset stored,
// if any (kgo.AdjustFetchOffsetsFn).
func (ss *session[T]) adjust(ctx context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var tps []TopicPartition
	for topic, ps := range offs {
		for n := range ps {
			tps = append(tps, TopicPartition{topic, n})
		}
	}
	if len(tps) == 0 {
		return offs, nil
	}
	slices.SortFunc(tps, compareTP)
	claims, err := ss.claim(ctx, tps)
	if err != nil {
		return nil, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, c := range claims {
		ps, ok := offs[c.Topic]
		if _, asked := ps[c.Partition]; !ok || !asked {
			continue // not a partition asked for
		}
		p := ss.parts[c.TopicPartition]
		if p == nil || !p.live {
			p = ss.newPartLocked(c.TopicPartition)
			ss.parts[c.TopicPartition] = p
		}
		p.claimed, p.epoch, p.stored = true, c.Epoch, c.Next
		ss.s.claimed.Add(1)
		if c.Next >= 0 {
			ps[c.Partition] = kgo.NewOffset().At(c.Next).WithEpoch(-1)
		}
	}
	return offs, nil
}

// claim claims tps in the store, trying again (until ctx ends) after a failure that
// is not fatal; a fatal one fails the run.
func (ss *session[T]) claim(ctx context.Context, tps []TopicPartition) ([]Claim, error) {
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, ss.s.cfg.timeout)
		claims, err := ss.s.cfg.store.Claim(cctx, tps)
		cancel()
		if err == nil {
			return claims, nil
		}
		ss.s.commitErrors.Add(1)
		err = fmt.Errorf("kafka: group %q: claim %d partitions in the offset store: %w", ss.s.group, len(tps), err)
		if c, ok := pipeline.ClassOf(err); ok && c == pipeline.ClassFatal {
			ss.fail(err)
			return nil, err
		}
		t := time.NewTimer(min(time.Duration(attempt)*100*time.Millisecond, 2*time.Second))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

// saveStore saves in the store the offsets of the claimed partitions (of only, if
// not nil) whose watermark passed what is stored: records settled without a sink's
// transaction (filtered out, dead-lettered) take them there.
func (ss *session[T]) saveStore(ctx context.Context, only []*part) {
	if ss.s.cfg.store == nil {
		return
	}
	ss.mu.Lock()
	parts := map[TopicPartition]*part{}
	var offs []StoreOffset
	add := func(p *part) {
		if p.live && p.claimed && p.hasMark && p.mark.Offset > p.stored {
			offs = append(offs, StoreOffset{TopicPartition: p.tp, Epoch: p.epoch, Next: p.mark.Offset})
			parts[p.tp] = p
		}
	}
	if only != nil {
		for _, p := range only {
			add(p)
		}
	} else {
		for _, p := range ss.parts {
			add(p)
		}
	}
	ss.mu.Unlock()
	if len(offs) == 0 {
		return
	}
	sortOffsets(offs)
	cctx, cancel := context.WithTimeout(ctx, ss.s.cfg.timeout)
	fenced, err := ss.s.cfg.store.Save(cctx, offs)
	cancel()
	if err != nil {
		ss.s.commitErrors.Add(1)
		if c, ok := pipeline.ClassOf(err); ok && c == pipeline.ClassFatal {
			ss.fail(fmt.Errorf("kafka: group %q: save offsets in the offset store: %w", ss.s.group, err))
		}
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, o := range offs {
		if p := parts[o.TopicPartition]; !slices.Contains(fenced, o.TopicPartition) {
			p.stored = max(p.stored, o.Next)
		}
	}
	ss.fenceLocked(parts, fenced)
}
