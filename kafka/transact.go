package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gopipeline/pipeline"
)

// errCrashed is the error of a run its test crashed (crashForTest): it ends without
// ending its open transaction or committing anything, as if the process died.
var errCrashed = errors.New("kafka: crashed (a test's crash)")

// txnPollWait bounds a poll of a transactional source: a transaction waits for the
// poll in progress to end before it begins (kgo allows no poll during Begin or End).
const txnPollWait = 100 * time.Millisecond

// WithTransactionalID makes the source's client a transactional producer with id
// (kgo.TransactionalID), reading the topics read-committed, for [NewTransactSink]:
// that sink produces each batch in a Kafka transaction that also commits the consumed
// offsets, and the source commits its offsets only in transactions too (those of
// records filtered out or dead-lettered, every [WithCommitInterval], in a transaction
// of their own). Each member of the group needs an id of its own, the same across its
// restarts (a host name, a pod's ordinal): a member that starts with the id of one that
// died fences it (its open transaction is aborted). The source wraps the client's
// group balancers (kgo.Balancers) to read each assignment the group gives it, since
// the transactional client does not report every revoke; a group balanced by the
// broker (kgo.ServerSideBalancer) keeps its own. It panics if id is empty.
func WithTransactionalID(id string) SourceOption {
	if id == "" {
		panic(`kafka: WithTransactionalID(""): empty id`)
	}
	return sourceOpt(func(c *sourceConfig) { c.txnID = id })
}

// NewTransactSink returns a sink stage that produces batches of messages to topic
// through src's own client, each batch in one Kafka transaction that also commits, per
// partition, the offsets the batch's records take the group to: downstream consumers
// that read committed (kgo.FetchIsolationLevel(kgo.ReadCommitted())) see each input
// record's output exactly once, across rebalances and crashes. src must have
// [WithTransactionalID]; attach the sink with [pipeline.ToBatches] to the stream of
// that source's pipeline.
//
// The sink's items are [Message] values whose Topic, Partition and Offset name the
// input record they come from (copy them from the source's message; Value is what is
// produced, encoded by codec); meta, if not nil, gives each record's key and headers
// (else the input's key and no headers). A transaction commits a partition's offset
// up to the batch's last record of it when every earlier record of the partition has
// settled (committed in an earlier transaction, filtered out, dead-lettered) or is in
// the batch; so give the sink each partition's records in offset order (a stage keyed
// by [Message.TopicPartition], no hand-back) and every output of a record in one
// batch (one output per record). A record of a batch that goes past an earlier one
// neither settled nor produced is held back (counted in [Stats].OutOfOrder): its
// output would commit without its offset, and whoever redoes the partition from that
// offset would produce it again. Such a message is most often one from before a
// rewind (see below), whose replay comes later in order; a record's own message held
// back is emitted again once it settles, and produced in a later batch.
//
// Work beside the sink ([pipeline.Tee], a flat-map's pieces that go elsewhere) is not
// part of the transaction, which commits the record's offset with its output alone.
// A branch that hands a record's item back, or sets it aside, after that commit is
// redone (the record is emitted again; the sink does not produce it twice), or its
// dead letter produced, by this run only: if the run stops first (a crash, a Stop;
// for a hand-back, a rebalance that takes the partition too), that work is lost,
// since the group's offset is past the record and no owner reads it again. After a
// rewind (below) it is not redone at all when the record's output came from a message
// from before the rewind. So hand back before the Tee, or give each branch's work a
// store that records it with the output.
//
// A transaction aborts when the group rebalances while it is open (kgo's
// GroupTransactSession) or a produce fails: the source then takes every partition
// back to its last committed offset, and what was in the pipeline is done again
// ([Stats].Aborted counts the aborts; their items settle as Stale, and those set
// aside are not produced to [WithDeadLetterTopic]: their replays are the records'
// outcomes). A message still in the pipeline from before the rewind names the same
// record as its replay: whichever reaches the sink first, in its partition's order,
// is that record's output, the other is not produced. That output, once committed, is
// the record's one outcome: the other message settles as done ([Stats].Committed)
// whatever becomes of it, handed back or set aside too, and is neither emitted again
// nor produced to
// [WithDeadLetterTopic] (a stage's own [pipeline.WithDeadLetter] destination has
// taken it before the source hears of it); a stale message that reaches the sink
// while its replay's dead letter is under way is not produced. A failure that
// leaves the transactional producer unusable (kgo: no error of an End is retriable), a
// missing permission or a record too large fails the run. Dead letters are produced
// outside the transactions, through [WithDeadLetterTopic]'s client: at least once. It
// panics if src has no transactional id, or if codec is nil or topic empty.
func NewTransactSink[In, T any](name string, src *Source[In], topic string, codec pipeline.Codec[T], meta func(Message[T]) (key []byte, headers []kgo.RecordHeader), opts ...pipeline.StageOption) *pipeline.Stage[[]Message[T], struct{}] {
	if src == nil || codec == nil || topic == "" {
		panic(fmt.Sprintf("kafka: NewTransactSink(%q) needs a source, a topic and a codec", name))
	}
	if src.cfg.txnID == "" {
		panic(fmt.Sprintf("kafka: NewTransactSink(%q): the source has no WithTransactionalID", name))
	}
	return pipeline.NewSink(name, 1, func(ctx context.Context, batch []Message[T]) error {
		ss := src.session()
		if ss == nil {
			return pipeline.Fatal(fmt.Errorf("kafka: NewTransactSink(%q): its source is not running", name))
		}
		out := make([]txnRecord, len(batch))
		for i, m := range batch {
			data, err := codec.Marshal(m.Value)
			if err != nil {
				return pipeline.Permanent(fmt.Errorf("kafka: encode: %w", err))
			}
			r := &kgo.Record{Topic: topic, Key: m.Key, Value: data}
			if meta != nil {
				r.Key, r.Headers = meta(m)
			}
			out[i] = txnRecord{from: m.TopicPartition(), offset: m.Offset, rec: r}
		}
		return ss.transact(ctx, out)
	}, opts...)
}

// txnRecord is a record to produce in a transaction, and the input record it is for.
type txnRecord struct {
	from   TopicPartition
	offset int64
	rec    *kgo.Record
}

// session returns the session whose client is open: the current run's, until its
// last item settled (after its body ended: the sink's last batches); nil otherwise.
func (s *Source[T]) session() *session[T] {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

// pollRecords polls at most room records. With a transactional client it holds
// pollMu through the poll (and until the caller's unlock, once the records are
// tagged), and waits at most txnPollWait for records, so that a transaction waits
// little for its turn.
func (ss *session[T]) pollRecords(ctx context.Context, room int) (kgo.Fetches, func()) {
	if ss.tx == nil {
		return ss.cl.PollRecords(ctx, room), func() {}
	}
	ss.pollMu.Lock()
	pctx, cancel := context.WithTimeout(ctx, txnPollWait)
	defer cancel()
	return ss.cl.PollRecords(pctx, room), ss.pollMu.Unlock
}

// transact produces recs (none: commits offsets only) in one transaction that commits
// the offsets they and the records settled so far take the live partitions to. A
// transaction that aborts takes every partition back to its last committed offset.
// It returns an error only when the run must fail.
func (ss *session[T]) transact(ctx context.Context, recs []txnRecord) error {
	ss.txnMu.Lock()
	defer ss.txnMu.Unlock()
	ss.pollMu.Lock()
	defer ss.pollMu.Unlock()
	if ss.s.crash.Load() {
		return pipeline.Fatal(errCrashed)
	}

	offs, marks, live, inTxn := ss.prospect(recs)
	defer ss.leaveTxn(inTxn)
	if len(offs) == 0 && len(live) == 0 {
		return nil // nothing to produce or commit
	}
	if err := ss.tx.Begin(); err != nil {
		return pipeline.Fatal(fmt.Errorf("kafka: begin transaction: %w", err))
	}
	if len(live) > 0 {
		if err := ss.cl.ProduceSync(ctx, live...).FirstErr(); err != nil {
			if _, aerr := ss.tx.End(context.WithoutCancel(ctx), kgo.TryAbort); aerr != nil {
				return pipeline.Fatal(fmt.Errorf("kafka: abort transaction: %w (after a failed produce: %w)", aerr, err))
			}
			ss.rewind()
			if perr := produceError(ctx, err); unrecoverable(err) || ctx.Err() != nil {
				return pipeline.Fatal(perr)
			}
			return nil // the batch's records are redone from the committed offsets
		}
	}
	if ss.s.crash.Load() { // a test's crash: the transaction stays open, as if the process died
		return pipeline.Fatal(errCrashed)
	}
	// The commit carries our offsets, not the client's (what it polled): rewrite the
	// request, keeping the topic IDs it found.
	octx := kgo.PreTxnCommitFnContext(context.WithoutCancel(ctx), func(req *kmsg.TxnOffsetCommitRequest) error {
		ids := map[string][16]byte{}
		for _, t := range req.Topics {
			ids[t.Topic] = t.TopicID
		}
		req.Topics = req.Topics[:0]
		for topic, ps := range offs {
			t := kmsg.NewTxnOffsetCommitRequestTopic()
			t.Topic, t.TopicID = topic, ids[topic]
			for partition, eo := range ps {
				p := kmsg.NewTxnOffsetCommitRequestTopicPartition()
				p.Partition, p.Offset, p.LeaderEpoch = partition, eo.Offset, eo.Epoch
				t.Partitions = append(t.Partitions, p)
			}
			req.Topics = append(req.Topics, t)
		}
		return nil
	})
	committed, err := ss.tx.End(octx, kgo.TryCommit)
	if err != nil {
		return pipeline.Fatal(fmt.Errorf("kafka: end transaction: %w", err))
	}
	if !committed {
		ss.s.aborted.Add(1)
		ss.rewind()
		return nil
	}
	ss.s.transactions.Add(1)
	if len(offs) > 0 {
		ss.s.commits.Add(1)
	}
	ss.mu.Lock()
	for p, off := range marks {
		if p.live && off > p.committed {
			p.committed, p.behindAt = off, p.behind
		}
	}
	// The batch's entries settle once the sink returns, maybe after the next batch's
	// transaction computes its offsets: until then they count as done there.
	if ss.txnDone == nil {
		ss.txnDone = map[*entry]bool{}
	}
	for e := range inTxn {
		ss.txnDone[e] = true
		e.txnCommitted = true
	}
	ss.mu.Unlock()
	return nil
}

// prospect returns the offsets a transaction of recs commits: per live partition, one
// past the prefix of records settled, in recs, or in a committed transaction and not
// settled yet (txnDone), where it passes what was committed;
// marks has the same per part. live are the records to produce: those whose input
// record is in the pipeline of a live partition (a revoked one's next owner redoes the
// others) and extends that prefix. A record past an earlier one that is neither
// settled nor produced is not produced (counted in Stats.OutOfOrder and marked
// heldBack): its output would commit without its offset, and be produced again by
// whoever redoes the partition from the committed offset. After a rewind, such a
// message is most often a stale one (its replay comes later, in order); if it is the
// record's own, the record is emitted again when it settles (settle).
//
// An entry in txnDone counts as done: it is produced only once every earlier record
// of its part is done (inOrder.past), so the transaction that produced it committed
// the offset past it, with its output. If a stale message produced it, the replay's
// own message settles it as done whatever its outcome (outputCommitted): emitted
// again, it could only be dead-lettered too, or handed back again. An entry whose
// message settled otherwise (a dead letter under way, a retry to wait for: settling)
// is not taken, so that each record has one outcome.
func (ss *session[T]) prospect(recs []txnRecord) (offs map[string]map[int32]kgo.EpochOffset, marks map[*part]int64, live []*kgo.Record, inTxn map[*entry]bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.dropUnownedLocked()
	inTxn = map[*entry]bool{}
	done := func(e *entry) bool { return e.state == settled || inTxn[e] || ss.txnDone[e] }
	ord := inOrder{}
	for _, r := range recs {
		p := ss.parts[r.from]
		if p == nil || !p.live || p.revoking {
			continue
		}
		i := p.index(r.offset)
		// A message names its record by partition and offset only: after a rewind, a
		// stale one (of the assignment before) names the same record as its replay,
		// and whichever comes first is that record's output; the other is not produced.
		if i < 0 || p.pending[i].state != inPipeline || p.pending[i].settling || inTxn[p.pending[i]] || ss.txnDone[p.pending[i]] {
			continue // settling: its own message's outcome is under way (outputCommitted)
		}
		if ord.past(p, i, done) { // past a record neither settled nor produced
			ss.holdBack(p.pending[i])
			continue
		}
		inTxn[p.pending[i]] = true
		p.pending[i].inTxn = true // until the transaction ends (leaveTxn)
		live = append(live, r.rec)
	}
	offs = map[string]map[int32]kgo.EpochOffset{}
	marks = map[*part]int64{}
	for _, p := range ss.parts {
		if !p.live || p.revoking {
			continue
		}
		mark, ok := p.mark, p.hasMark
		for n := 0; n < len(p.pending) && done(p.pending[n]); n++ {
			mark, ok = kgo.EpochOffset{Epoch: p.pending[n].epoch, Offset: p.pending[n].offset + 1}, true
		}
		if ok && mark.Offset > p.committed {
			addOffsetAt(offs, p.tp, mark)
			marks[p] = mark.Offset
		}
	}
	return offs, marks, live, inTxn
}

// leaveTxn ends the transaction of the entries in inTxn (committed: they are in
// txnDone now; or not), and wakes a settle that waits for it (outputCommitted).
func (ss *session[T]) leaveTxn(inTxn map[*entry]bool) {
	if len(inTxn) == 0 {
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for e := range inTxn {
		e.inTxn = false
	}
	ss.signalLocked()
}

func addOffsetAt(offs map[string]map[int32]kgo.EpochOffset, tp TopicPartition, eo kgo.EpochOffset) {
	t := offs[tp.Topic]
	if t == nil {
		t = map[int32]kgo.EpochOffset{}
		offs[tp.Topic] = t
	}
	t[tp.Partition] = eo
}

// rewind ends every live partition's assignment after an aborted transaction (what
// they hold settles as stale) and takes the client back, per partition, to the offset
// this run last committed, or the first record it polled: the client's own rewind
// (the aborted End's) skips a partition with no committed offset. pollMu must be held.
func (ss *session[T]) rewind() {
	ss.mu.Lock()
	ss.dropUnownedLocked()
	to := map[string]map[int32]kgo.EpochOffset{}
	for tp, p := range ss.parts {
		if !p.live {
			continue
		}
		at := p.committed
		if at < 0 {
			at = p.start
		}
		if at >= 0 {
			addOffsetAt(to, tp, kgo.EpochOffset{Epoch: -1, Offset: at})
		}
		ss.s.uncommitted.Add(p.uncommitted() + ss.endPartLocked(p))
		np := ss.newPartLocked(tp)
		np.committed = p.committed
		if at >= 0 && at <= p.maxPolled {
			np.replayTo = p.maxPolled // the client may still hand over records fetched before the rewind
		}
		ss.parts[tp] = np
	}
	ss.mu.Unlock()
	// The aborted End has just reset the client to its committed offsets, which are
	// the offsets this run committed: setting a partition there again would only
	// restart the client's consumer session, while a rebalance may be under way (kgo
	// asks for SetOffsets while no revoke can run), and members whose SetOffsets met a
	// rejoin were seen to fetch nothing more. So only partitions whose committed
	// offset is not where the rewind goes are set: those with none (the rewind goes
	// to their first record polled).
	committed := ss.cl.CommittedOffsets()
	for topic, ps := range to {
		for p, eo := range ps {
			if c, ok := committed[topic][p]; ok && c.Offset == eo.Offset {
				delete(ps, p)
			}
		}
		if len(ps) == 0 {
			delete(to, topic)
		}
	}
	if len(to) > 0 {
		ss.cl.SetOffsets(to)
	}
}

// endParts ends the assignments of the partitions in m (revoked from a transactional
// source: nothing of theirs can be committed now).
func (ss *session[T]) endParts(m map[string][]int32) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.dropPartsLocked(m, &ss.s.revoked)
}

// A transactional source cannot rely on its OnPartitionsRevoked and OnPartitionsLost
// callbacks alone: kgo's GroupTransactSession calls them through a wrapper that, once
// it saw a revoke (or a loss), calls them no more until the session's next End. A
// member that had nothing to commit meanwhile (no End) is told of its first revoke
// only: a partition taken away by a second one stayed a live part of the run, shown
// in Stats.Lag and redone from its last offset after an abort, though the member no
// longer fetched it. Every assignment a sync gives the member goes through its
// balancer's ParseSyncAssignment, so the source wraps the client's balancers
// (syncWatcher) to learn each whole assignment, and ends the parts of partitions it
// does not hold (dropUnownedLocked): when a new assignment starts, before a
// transaction reckons its offsets, and in a rewind. (A group balanced by the broker,
// kgo.ServerSideBalancer, syncs no assignment: its balancers are left as they are, and
// the callbacks are all there is.)

// syncWatcher is a group balancer that gives each assignment it parses to its sink.
type syncWatcher struct {
	kgo.GroupBalancer
	sink func(map[string][]int32)
}

func (b syncWatcher) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	m, err := b.GroupBalancer.ParseSyncAssignment(assignment)
	if err == nil {
		b.sink(m)
	}
	return m, err
}

// watchSyncs returns opts with the client's balancers wrapped in syncWatchers that
// record each assignment in ss.owned; opts as they are for a group balanced by the
// broker. It reads the balancers from a client made of the source's options and the
// group, with no topic (so it does not join).
func (ss *session[T]) watchSyncs(opts []kgo.Opt) ([]kgo.Opt, error) {
	probe, err := kgo.NewClient(append(slices.Clone(ss.s.client), kgo.ConsumerGroup(ss.s.group), kgo.ConsumeTopics())...)
	if err != nil {
		return nil, fmt.Errorf("kafka: client: %w", err)
	}
	bs, _ := probe.OptValue(kgo.Balancers).([]kgo.GroupBalancer)
	serverSide, _ := probe.OptValue(kgo.ServerSideBalancer).(bool)
	probe.Close()
	if serverSide || len(bs) == 0 {
		return opts, nil
	}
	ws := make([]kgo.GroupBalancer, len(bs))
	for i, b := range bs {
		ws[i] = syncWatcher{GroupBalancer: b, sink: ss.setOwned}
	}
	return append(opts, kgo.Balancers(ws...)), nil
}

// setOwned records m, the member's whole assignment from a sync.
func (ss *session[T]) setOwned(m map[string][]int32) {
	owned := map[TopicPartition]bool{}
	for topic, ps := range m {
		for _, p := range ps {
			owned[TopicPartition{topic, p}] = true
		}
	}
	ss.owned.Store(&owned)
}

// dropUnownedLocked ends the live parts of partitions that the member's last
// assignment does not hold: revoked with no callback (see syncWatcher). ss.mu must be
// held.
func (ss *session[T]) dropUnownedLocked() {
	owned := ss.owned.Load()
	if owned == nil { // no sync seen (or a group balanced by the broker)
		return
	}
	for tp, p := range ss.parts {
		if p.live && !(*owned)[tp] {
			ss.dropPartLocked(p, &ss.s.revoked)
		}
	}
}
