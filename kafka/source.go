package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gopipeline/pipeline"
)

// Headers of a dead-letter record ([WithDeadLetterTopic]), added after the original
// record's own headers. Its key and value are the original record's.
const (
	HeaderStage      = "pipeline-stage"       // the stage that set the item aside (the source's name: undecodable)
	HeaderClass      = "pipeline-class"       // its error class: "item", "transient", ...
	HeaderErrType    = "pipeline-error-type"  // the Go type of the last error
	HeaderError      = "pipeline-error"       // the last error's message
	HeaderFirstError = "pipeline-first-error" // the first attempt's error message
	HeaderAttempts   = "pipeline-attempts"    // attempts made, in decimal
	HeaderTopic      = "pipeline-topic"       // the original record's topic
	HeaderPartition  = "pipeline-partition"   // its partition, in decimal
	HeaderOffset     = "pipeline-offset"      // its offset, in decimal
	HeaderTime       = "pipeline-time"        // when it was set aside, RFC 3339 with nanoseconds
)

// deadLetterRetry is how long a record whose dead letter could not be produced waits
// before it is emitted again (and, set aside again, produced again).
const deadLetterRetry = time.Second

// GroupError is the error with which a run fails when its consumer group cannot go
// on: a topic it consumes does not exist or may not be read (Topic names it), or the
// group may not be joined (Topic is empty). Err is the cause: a [kerr] error such as
// [kerr.UnknownTopicOrPartition], [kerr.TopicAuthorizationFailed] or
// [kerr.GroupAuthorizationFailed], matchable with errors.Is.
type GroupError struct {
	Group string
	Topic string // the topic, or "" when the error is the group's
	Err   error
}

func (e *GroupError) Error() string {
	if e.Topic != "" {
		return fmt.Sprintf("kafka: group %q: topic %q: %v", e.Group, e.Topic, e.Err)
	}
	return fmt.Sprintf("kafka: group %q: %v", e.Group, e.Err)
}

// Unwrap returns Err.
func (e *GroupError) Unwrap() error { return e.Err }

// DeadLetterError is the error with which a run fails when the dead letter of a
// record cannot be produced to the dead-letter topic ([WithDeadLetterTopic]): at once
// when the broker's answer says that no retry can succeed (Permanent: a permission
// missing, the record too large, ...), or once it kept failing for
// [WithDeadLetterTimeout]. Err is the last produce's error ([kerr.MessageTooLarge],
// [kerr.TopicAuthorizationFailed], [kerr.UnknownTopicOrPartition], ... matchable with
// errors.Is). The record stays uncommitted.
type DeadLetterError struct {
	Topic     string         // the dead-letter topic
	From      TopicPartition // the record's partition
	Offset    int64          // and offset
	Permanent bool           // Err cannot pass: the run failed at the first attempt
	Err       error
}

func (e *DeadLetterError) Error() string {
	return fmt.Sprintf("kafka: dead letter of %s/%d@%d to topic %q: %v", e.From.Topic, e.From.Partition, e.Offset, e.Topic, e.Err)
}

// Unwrap returns Err.
func (e *DeadLetterError) Unwrap() error { return e.Err }

// ErrConcurrentRun is the error with which a run fails when its [Source] is already
// serving another run: a Source serves one run at a time.
var ErrConcurrentRun = errors.New("kafka: the source is already serving a run")

// TopicPartition names a partition of a topic.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Message is the item a [Source] emits for one record: the record's value decoded by
// the source's codec, with where the record comes from and its key and headers (not
// copied: the source does not change them).
type Message[T any] struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Headers   []kgo.RecordHeader
	Timestamp time.Time
	Value     T
}

// TopicPartition returns the message's partition: a key for [pipeline.WithKey] that
// keeps the records of each partition in order through a stage.
func (m Message[T]) TopicPartition() TopicPartition {
	return TopicPartition{Topic: m.Topic, Partition: m.Partition}
}

// SourceOption configures a [Source]: [NewSource].
type SourceOption interface{ sourceOption(*sourceConfig) }

type sourceOpt func(*sourceConfig)

func (f sourceOpt) sourceOption(c *sourceConfig) { f(c) }

type sourceConfig struct {
	name        string
	maxPending  int
	commitEvery time.Duration
	revokeWait  time.Duration
	timeout     time.Duration
	dl          *kgo.Client
	dlTopic     string
	dlPatience  time.Duration
	txnID       string
	store       OffsetStore
}

// WithName names the source's row in the pipeline's report ("Kafka" by default). It
// panics if name is empty.
func WithName(name string) SourceOption {
	if name == "" {
		panic(`kafka: WithName(""): empty name`)
	}
	return sourceOpt(func(c *sourceConfig) { c.name = name })
}

// WithMaxPending bounds the records of a run: at most n are in the pipeline
// ([pipeline.WithMaxPending]), and the run holds at most n+1 records (taken from the
// client and not settled: in the pipeline, waiting to be emitted again, being
// dead-lettered; or polled and not yet emitted). The one more is the record the source
// waits to emit while the pipeline is full: that wait makes the batches downstream
// flush. A record that settles behind an unsettled one of its partition (a record
// handed back) keeps only its offset until the watermark passes it, and once n of a
// partition's records wait so, the source pauses that partition's fetches until the
// watermark moves: a partition costs at most about 2n offsets, beside the n+1 records.
// The source polls only as many records as there is room for; the client's own buffer
// holds at most one more fetch per broker (kgo.FetchMaxBytes bounds it). The default
// is 1000. It panics if n < 1.
func WithMaxPending(n int) SourceOption {
	if n < 1 {
		panic(fmt.Sprintf("kafka: WithMaxPending(%d): need at least 1", n))
	}
	return sourceOpt(func(c *sourceConfig) { c.maxPending = n })
}

// WithCommitInterval sets how often the source commits the watermarks of its
// partitions that moved (one OffsetCommit request for all of them); the default is 1 s.
// It commits at every revoke and at the end of a run too. It panics if d <= 0.
func WithCommitInterval(d time.Duration) SourceOption {
	if d <= 0 {
		panic(fmt.Sprintf("kafka: WithCommitInterval(%v): need a positive interval", d))
	}
	return sourceOpt(func(c *sourceConfig) { c.commitEvery = d })
}

// WithRevokeTimeout bounds how long a revoke waits for the items of the revoked
// partitions that are in the pipeline to settle before it commits their watermarks
// and lets the rebalance go on; the default is 5 s. Keep it well under the group's
// rebalance timeout (kgo.RebalanceTimeout, 60 s by default). What has not settled by
// then is redone by the partition's next owner. It panics if d < 0.
func WithRevokeTimeout(d time.Duration) SourceOption {
	if d < 0 {
		panic(fmt.Sprintf("kafka: WithRevokeTimeout(%v): need a duration >= 0", d))
	}
	return sourceOpt(func(c *sourceConfig) { c.revokeWait = d })
}

// WithRequestTimeout bounds an offset commit and the produce of a dead letter; the
// default is 10 s. It does not bound the check of the topics at the start of a run
// (see [Source], Failures). It panics if d <= 0.
func WithRequestTimeout(d time.Duration) SourceOption {
	if d <= 0 {
		panic(fmt.Sprintf("kafka: WithRequestTimeout(%v): need a positive timeout", d))
	}
	return sourceOpt(func(c *sourceConfig) { c.timeout = d })
}

// WithDeadLetterTopic produces each dead-lettered record to topic through cl (a
// producing client the caller owns and closes), with the original key, value and
// headers and the Header* headers, and settles the record (its offset may then be
// committed) only once the produce is acknowledged. If the produce fails, the record
// stays unsettled and is emitted again a second later, to be set aside (and produced)
// again, for at most [WithDeadLetterTimeout]; a failure no retry can mend (a
// permission missing, the record too large) fails the run at once with a
// [*DeadLetterError]. The produce runs where the item settled (a stage's dead-letter path; the
// source itself for an undecodable record) and waits for the acknowledgement, at most
// [WithRequestTimeout]. Without this option a dead-lettered record settles once the
// stage's own dead-letter destination ([pipeline.WithDeadLetter]) took the item, and an
// undecodable record is skipped: counted in [Stats].Undecodable, never emitted, and
// committed.
//
// A record set aside after its partition's assignment ended (a revoke that gave up
// on it, a loss, an aborted transaction's rewind, a store's fence) is not produced,
// and counts in [Stats].Stale only: its offset was not committed, and whoever holds
// the partition now (the next owner, or this run's replay) redoes it, to its one
// outcome; or a transaction ([NewTransactSink], [WithOffsetStore]) committed its
// output, which a message of an earlier assignment may have given: that output is
// its outcome, as for a live assignment. But when no such message can be in play,
// the output came from the record's own message, through another branch of a
// [pipeline.Tee]: no one reads the record again, and its dead letter is produced (see
// NewTransactSink on Tee). A dead letter under way when the assignment ends is
// produced all the same: the record may then have two dead letters, or a dead letter
// and an output.
//
// It panics if cl is nil or topic empty; [NewSource] panics if cl is
// transactional (every produce outside a transaction fails) or its producer is not
// idempotent (kgo.DisableIdempotentWrite, which kgo.RequiredAcks other than all
// requires: a dead letter would settle its record unacknowledged).
func WithDeadLetterTopic(cl *kgo.Client, topic string) SourceOption {
	if cl == nil || topic == "" {
		panic("kafka: WithDeadLetterTopic needs a client and a topic")
	}
	return sourceOpt(func(c *sourceConfig) { c.dl, c.dlTopic = cl, topic })
}

// WithDeadLetterTimeout bounds how long a record's dead letter may keep failing to be
// produced to the [WithDeadLetterTopic] for a cause that may pass (the topic does not
// exist yet, the broker is unreachable, a produce timed out); after that the run fails
// with a [*DeadLetterError]. A cause that cannot pass (a permission missing, the record
// too large for the topic: a broker error Kafka calls not retriable) fails the run at
// the first attempt. Either way the record is not committed: the group's next run meets
// it again. The default is one minute. It panics if d <= 0.
func WithDeadLetterTimeout(d time.Duration) SourceOption {
	if d <= 0 {
		panic(fmt.Sprintf("kafka: WithDeadLetterTimeout(%v): need a positive duration", d))
	}
	return sourceOpt(func(c *sourceConfig) { c.dlPatience = d })
}

// Stats counts what a [Source] did, over all its runs.
type Stats struct {
	Fetched      int64 // records taken from the client
	Committed    int64 // settled as committed (those whose partition's assignment ended first count in Stale too), or as done: a stale message's output committed in a transaction
	DeadLettered int64 // set aside (produced to the dead-letter topic, if any); one set aside after its partition's assignment ended counts in Stale only, unproduced (see WithDeadLetterTopic)
	Undecodable  int64 // of DeadLettered, records the codec could not decode (never emitted)
	HandedBack   int64 // handed back by a stage: emitted again after the delay
	NotProcessed int64 // the run stopped first: left for the next owner
	Stale        int64 // settled, whatever the outcome, after their partition's assignment ended (revoked, lost, fenced, rewound after an aborted transaction): left for whoever holds the partition now; one set aside produces no dead letter (see WithDeadLetterTopic)
	Uncommitted  int64 // settled before their partition's assignment ended (revoked, lost, fenced, rewound), but not committed: left for whoever holds it next
	Dropped      int64 // polled, then not emitted: their partition was revoked, the run stopped, or the assignment had them already (polled twice)
	Assigned     int64 // partitions assigned
	Revoked      int64 // partitions revoked
	RevokeWaited int64 // items of revoked partitions in the pipeline when their revoke began
	Lost         int64 // partitions lost (the member left the group without a revoke)
	Commits      int64 // offset commits that succeeded
	CommitErrors int64 // offset commits that failed or timed out (retried at the next interval, if the partition is still ours)
	FetchErrors  int64 // errors the client reported and the source went on after
	DLErrors     int64 // dead letters whose produce failed (their records are emitted again)
	Paused       int64 // times a partition's fetches were paused: WithMaxPending of its records settled behind an unsettled one
	Transactions int64 // transactions committed (NewTransactSink, and the source's own for offsets; a store's, with WithOffsetStore)
	Aborted      int64 // transactions aborted (a rebalance, a failed produce): what they held is redone
	OutOfOrder   int64 // records a batch held back, past an earlier record of their partition neither settled nor produced (NewTransactSink) or written (WithOffsetStore) yet
	Claimed      int64 // partitions claimed in the offset store (WithOffsetStore)
	Fenced       int64 // partitions a store transaction found claimed by another owner (fenced): its records of them were not written

	// Lag is the consumer lag of each partition the current run holds: its high
	// watermark (the offset the next record produced to it will get) minus its
	// committed offset, the records a new owner would have to consume. The
	// committed offset is the run's last commit of the partition, or, before one,
	// the group's when the partition was assigned (with none, the first record the
	// run took of it, or before that the log's start, as a group with no commit
	// consumes from there unless kgo.ConsumeResetOffset says the end). The high watermark is the last one seen, in a fetch
	// response or in a listing of the topics' end offsets, so that lag grows while
	// backpressure holds fetches back: the source lists them every
	// [WithCommitInterval], at most once a second, while Lag is read (by Stats or a
	// report of the pipeline) within the last minute. So a first read, or one after
	// a minute without any, can show the high watermark of the last fetch until the
	// next interval lists them. A partition is missing while either end is unknown
	// (just assigned, nothing fetched or listed yet), and Lag is nil between runs.
	Lag map[TopicPartition]int64
}

// TotalLag returns the sum of st.Lag: the records of the current run's partitions
// not committed yet.
func (st Stats) TotalLag() int64 {
	var n int64
	for _, l := range st.Lag {
		n += l
	}
	return n
}

// Counters returns the counts as a map, for a view that shows a connector's counters
// on its row, such as the dashboard's WithRowStats:
//
//	h.Add("orders", p, dashboard.WithRowStats("Kafka", func() map[string]int64 {
//		return src.Stats().Counters()
//	}))
//
// "fetched", "committed", "dead-lettered", "handed back", "not processed" and "lag"
// (TotalLag) are always there; the other counts of Stats, by their names in lower
// case ("stale", "revoked", "commit errors", ...), only when not 0. It makes a new
// map on each call.
func (st Stats) Counters() map[string]int64 {
	m := map[string]int64{
		"fetched": st.Fetched, "committed": st.Committed, "dead-lettered": st.DeadLettered,
		"handed back": st.HandedBack, "not processed": st.NotProcessed, "lag": st.TotalLag(),
	}
	for k, v := range map[string]int64{
		"undecodable": st.Undecodable, "stale": st.Stale, "uncommitted": st.Uncommitted,
		"dropped": st.Dropped, "assigned": st.Assigned, "revoked": st.Revoked,
		"revoke waited": st.RevokeWaited, "lost": st.Lost, "commits": st.Commits,
		"commit errors": st.CommitErrors, "fetch errors": st.FetchErrors,
		"dead-letter errors": st.DLErrors, "paused": st.Paused,
		"transactions": st.Transactions, "aborted": st.Aborted, "out of order": st.OutOfOrder,
		"claimed": st.Claimed, "fenced": st.Fenced,
	} {
		if v != 0 {
			m[k] = v
		}
	}
	return m
}

// Source reads topics as a member of a Kafka consumer group, as the acknowledged source
// of a pipeline ([pipeline.FromAcked]): one [Message] per record, its value decoded by
// a codec, and offsets that follow each item's outcome. A partition's committed offset
// is its first record that has not settled: records settle in any order, and the
// source commits, per partition, the end of the prefix that has (a watermark), every
// [WithCommitInterval], at every revoke and at the end of a run:
//
//	committed      settled
//	dead-lettered  settled, once the dead letter is produced to WithDeadLetterTopic
//	               (undecodable records too, without being emitted; without a
//	               dead-letter topic they are skipped, counted in Stats.Undecodable)
//	handed back    not settled: emitted again after the settlement's delay
//	not processed  not settled: the run stopped; the next owner redoes it
//
// A handed-back record ([pipeline.WithHandBack]) is retried in place: it stays
// unsettled, holding its partition's watermark (records after it go on and settle,
// and are committed once it settles), and is emitted again after the delay, holding
// no worker meanwhile. Kafka has no per-record negative acknowledgement: seeking back
// would deliver every later record of the partition again, and a retry topic needs a
// consumer of its own. A record emitted again may overtake a later record of its
// partition: keep order with a stage that does not hand back.
//
// Rebalances: when partitions are revoked, the source stops emitting their records
// (those it polled and did not emit are dropped: never committed, they are fetched
// again by the next owner), waits at most [WithRevokeTimeout] for their items in the
// pipeline to settle, commits their watermarks and lets the rebalance go on. Items
// that settle after that are not committed (counted as Stale): the next owner redoes
// them, and those set aside are not produced to the [WithDeadLetterTopic]. So
// delivery is at least once: an item may be processed twice, by the old owner and the
// new one, when it did not settle in time or a member died. One record of
// a revoked partition may still enter the pipeline after its revoke gave up on it: the
// record the source was handing over, waiting for room, when the revoke began (settled,
// it is counted as Stale). A revoke takes at most [WithRevokeTimeout] and then its
// commit, at most [WithRequestTimeout]; an interval commit in flight is waited for
// first, so keep WithRevokeTimeout + 2 × WithRequestTimeout (25 s by default) under
// the group's rebalance timeout. The client
// commits with the group's generation, so that a member that lost its partitions
// cannot commit over their new owner; a partition assigned back starts from the
// group's committed offset, never from an offset the source remembers.
//
// Backpressure: at most [WithMaxPending] items are in the pipeline, and the source
// holds one record more, which it waits to emit: that wait makes a partial batch
// downstream flush, so a batch larger than WithMaxPending needs no linger to go on.
// A partition whose records settled behind an unsettled one pauses at WithMaxPending
// of them. Give a batch downstream a [pipeline.WithLinger] all the same, so that the
// items of a revoked partition do not wait in a partial batch until the revoke gives up
// on them, and the last records of a quiet topic are not held until more come.
//
// Failures: a topic that does not exist or may not be read, or a group that may not be
// joined, fails the run with a [*GroupError] that names it: at the start of the run
// for a missing topic, when the client reports it otherwise. That check at the start is
// bounded by the client's own options (kgo.DialTimeout, kgo.RetryTimeout) and the run's
// context, not by [WithRequestTimeout]: a broker that cannot be reached fails the run,
// a slow one is waited for. Other errors of the client are counted in
// [Stats].FetchErrors, and the client retries.
//
// Shutdown: when [Source.Stop] is called, the source stops polling, the items in
// flight finish (with the record the source was handing over, if it waited for room), and the source commits every settled record and leaves the group
// before [pipeline.Pipeline.Run] returns. When the run fails or is canceled, it
// commits what settled and leaves the group too.
//
// Each run makes its own client from the options given to [NewSource], and closes it
// before [pipeline.Pipeline.Run] returns. A Source serves one run at a time: a run
// begun while another is under way fails with [ErrConcurrentRun]. It is safe for
// concurrent use.
type Source[T any] struct {
	client []kgo.Opt
	group  string
	topics []string
	codec  pipeline.Codec[T]
	cfg    sourceConfig

	fetched, committed, deadLettered, undecodable, handedBack, notProcessed atomic.Int64
	stale, uncommitted, dropped, assigned, revoked, revokeWaited, lost      atomic.Int64
	commits, commitErrors, fetchErrors, dlErrors, paused                    atomic.Int64
	transactions, aborted, outOfOrder, claimed, fenced                      atomic.Int64
	crash                                                                   atomic.Bool // a test's crash (export_test.go)

	mu       sync.Mutex
	cur      *session[T] // the current run's, if any
	open     *session[T] // the session whose client is open (until its last item settled), for NewTransactSink
	running  bool        // a run is under way (from its start, before cur is set)
	stopping bool
}

// NewSource returns a source that consumes topics as a member of group, with a client
// made (for each run) from the options in client: the seed brokers, TLS, SASL, session
// and heartbeat timeouts, fetch sizes, where to start a partition with no committed
// offset (kgo.ConsumeResetOffset), ... The source adds the group, the topics and what
// it needs itself (kgo.DisableAutoCommit, kgo.BlockRebalanceOnPoll and the partition
// callbacks), which replace those options if client has them; leave kgo.ConsumerGroup
// and kgo.ConsumeTopics out of client all the same (the run's topic check makes a
// client from client alone, which would join the group), and kgo.ServerSideBalancer
// (it turns on the KIP-848 protocol, which the source was not built or tested for).
// codec decodes each record's value: a [pipeline.JSONCodec] or [Bytes] will do.
// Attach it to a pipeline with [Source.Stream]. It panics if group is empty, topics is empty or holds an empty
// name, or codec is nil.
func NewSource[T any](client []kgo.Opt, group string, topics []string, codec pipeline.Codec[T], opts ...SourceOption) *Source[T] {
	if group == "" || len(topics) == 0 || slices.Contains(topics, "") || codec == nil {
		panic("kafka: NewSource needs a group, topics and a codec")
	}
	cfg := sourceConfig{
		name: "Kafka", maxPending: 1000, commitEvery: time.Second, revokeWait: 5 * time.Second, timeout: 10 * time.Second,
		dlPatience: time.Minute,
	}
	for i, o := range opts {
		if o == nil {
			panic(fmt.Sprintf("kafka: NewSource: option %d of %d is nil", i+1, len(opts)))
		}
		o.sourceOption(&cfg)
	}
	if cfg.dl != nil {
		checkProducer("WithDeadLetterTopic", cfg.dl)
	}
	if cfg.store != nil && cfg.txnID != "" {
		panic("kafka: NewSource: WithOffsetStore and WithTransactionalID: the offsets go to one place, the store or a Kafka transaction")
	}
	return &Source[T]{client: slices.Clone(client), group: group, topics: slices.Clone(topics), codec: codec, cfg: cfg}
}

// Stream adds the source to p and returns its stream of messages. p gets an
// acknowledged source ([pipeline.FromAckedBatches]): a pipeline may have only one, and Stream
// panics on a second one. The source's row of p's reports carries its consumer lag
// ([pipeline.WithLag]): [Stats].Lag, one [pipeline.PartitionLag] per partition,
// labeled "topic/partition" and ordered by topic and partition, read when the report
// is made.
func (s *Source[T]) Stream(p *pipeline.Pipeline) *pipeline.Stream[Message[T]] {
	return pipeline.FromAckedBatches(p, s.run, pipeline.WithName(s.cfg.name), pipeline.WithMaxPending(s.cfg.maxPending),
		pipeline.WithLag(s.partitionLag))
}

// Stop ends the input of the current run, or of the next one if none is running: the
// source stops polling, the items in flight finish (and the record it was handing over,
// if it waited for room in the pipeline), their offsets are committed and
// the source leaves the group; [pipeline.Pipeline.Run] then returns nil (unless
// something failed). It does not wait.
func (s *Source[T]) Stop() {
	s.mu.Lock()
	s.stopping = true
	ss := s.cur
	s.mu.Unlock()
	if ss != nil {
		ss.stop()
	}
}

// Stats returns the source's counts so far.
func (s *Source[T]) Stats() Stats {
	return Stats{
		Fetched: s.fetched.Load(), Committed: s.committed.Load(), DeadLettered: s.deadLettered.Load(),
		Undecodable: s.undecodable.Load(), HandedBack: s.handedBack.Load(), NotProcessed: s.notProcessed.Load(),
		Stale: s.stale.Load(), Uncommitted: s.uncommitted.Load(), Dropped: s.dropped.Load(), Assigned: s.assigned.Load(), Revoked: s.revoked.Load(),
		RevokeWaited: s.revokeWaited.Load(), Lost: s.lost.Load(), Commits: s.commits.Load(), CommitErrors: s.commitErrors.Load(),
		FetchErrors: s.fetchErrors.Load(), DLErrors: s.dlErrors.Load(), Paused: s.paused.Load(),
		Transactions: s.transactions.Load(), Aborted: s.aborted.Load(), OutOfOrder: s.outOfOrder.Load(),
		Claimed: s.claimed.Load(), Fenced: s.fenced.Load(),
		Lag: s.lag(),
	}
}

// lag returns the lag of the current run's partitions, nil without a run.
func (s *Source[T]) lag() map[TopicPartition]int64 {
	s.mu.Lock()
	ss := s.cur
	s.mu.Unlock()
	if ss == nil {
		return nil
	}
	// The commit loop lists the end offsets while lag is read (endsWanted).
	ss.lagRead.Store(time.Now().UnixNano())
	group := ss.cl.CommittedOffsets() // before ss.mu: the client's callbacks take ss.mu under its own locks
	ss.mu.Lock()
	defer ss.mu.Unlock()
	lag := make(map[TopicPartition]int64, len(ss.parts))
	for tp, p := range ss.parts {
		if !p.live {
			continue
		}
		g := int64(-1)
		if eo, ok := group[tp.Topic][tp.Partition]; ok {
			g = eo.Offset
		}
		if l, ok := p.lag(g); ok {
			lag[tp] = l
		}
	}
	return lag
}

// checkTopics fails with a [*GroupError] when a topic of the source does not exist or
// may not be described. Its metadata request is bounded by ctx and the client's own
// options (kgo.DialTimeout, kgo.RetryTimeout), not by WithRequestTimeout: cl is a new
// client, whose request also dials the broker, and a check cut short fails the run.
func (s *Source[T]) checkTopics(ctx context.Context, cl *kgo.Client) error {
	details, err := kadm.NewClient(cl).ListTopics(ctx, s.topics...)
	if err != nil {
		return fmt.Errorf("kafka: group %q: metadata of %q: %w", s.group, s.topics, err)
	}
	for _, t := range s.topics {
		d, ok := details[t]
		switch {
		case !ok:
			return &GroupError{Group: s.group, Topic: t, Err: kerr.UnknownTopicOrPartition}
		case d.Err != nil:
			return &GroupError{Group: s.group, Topic: t, Err: d.Err}
		}
	}
	return nil
}

// run is the body of the acknowledged source: one run's membership of the group.
func (s *Source[T]) run(ctx context.Context, emit emitFunc[T]) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return ErrConcurrentRun
	}
	s.running = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running = false
		s.mu.Unlock()
	}()
	// The topics are checked with a client that is not a member, so that a missing
	// topic does not make the group rebalance; options that only a member may have
	// (kgo.DisableAutoCommit, ...) make that client fail, and the member checks instead.
	plain, perr := kgo.NewClient(s.client...)
	if perr == nil {
		err := s.checkTopics(ctx, plain)
		plain.Close()
		if err != nil {
			return err
		}
	}
	ss := &session[T]{
		s: s, parts: map[TopicPartition]*part{}, changed: make(chan struct{}),
		kick: make(chan struct{}, 1), stopped: make(chan struct{}), failed: make(chan struct{}),
	}
	opts := append(slices.Clone(s.client),
		kgo.ConsumerGroup(s.group), kgo.ConsumeTopics(s.topics...),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(ss.assigned), kgo.OnPartitionsRevoked(ss.revoked), kgo.OnPartitionsLost(ss.lost),
	)
	if s.cfg.store != nil {
		opts = append(opts, kgo.AdjustFetchOffsetsFn(ss.adjust))
	}
	var cl *kgo.Client
	if s.cfg.txnID != "" {
		opts = append(opts, kgo.TransactionalID(s.cfg.txnID), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		var err error
		if opts, err = ss.watchSyncs(opts); err != nil {
			return err
		}
		tx, err := kgo.NewGroupTransactSession(opts...)
		if err != nil {
			return fmt.Errorf("kafka: client: %w", err)
		}
		ss.tx, cl = tx, tx.Client()
		// Fence a predecessor under this id now (InitProducerID aborts its open
		// transaction), not at the first transaction: a predecessor killed after its
		// TxnOffsetCommit holds the group's offsets, the group's offset fetches fail
		// (UNSTABLE_OFFSET_COMMIT) until its transaction ends, and without the fence
		// nothing would be fetched to begin one: the group would wait for the
		// broker's transaction timeout.
		if _, _, err := cl.ProducerID(ctx); err != nil {
			tx.CloseAllowingRebalance()
			return fmt.Errorf("kafka: transactional id %q: %w", s.cfg.txnID, err)
		}
	} else {
		var err error
		if cl, err = kgo.NewClient(opts...); err != nil {
			return fmt.Errorf("kafka: client: %w", err)
		}
	}
	ss.cl = cl
	if perr != nil {
		if err := s.checkTopics(ctx, cl); err != nil {
			cl.CloseAllowingRebalance()
			return err
		}
	}
	s.mu.Lock()
	s.cur, s.open = ss, ss
	stopping := s.stopping
	s.mu.Unlock()
	if stopping {
		ss.stop()
	}
	polled := make(chan polledBatch)
	pctx, pcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { ss.poll(pctx, polled) })
	wg.Go(func() { ss.commitLoop(pctx) })
	defer func() {
		pcancel()
		wg.Wait()
		s.mu.Lock()
		s.cur, s.stopping = nil, false
		s.mu.Unlock()
		ss.end()
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		if d, ok := ss.nextRetry(); ok {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-ss.stopped:
			return nil
		case <-ss.failed:
			return ss.failErr
		case <-ss.kick:
		case <-timer.C:
		case b := <-polled:
			for i := 0; i < len(b.recs); i += takeRun {
				if ss.isStopped() || ss.isFailed() || ctx.Err() != nil {
					ss.drop(len(b.recs) - i)
					break
				}
				k := min(takeRun, len(b.recs)-i)
				if err := ss.take(emit, b.recs[i:i+k]); err != nil {
					ss.drop(len(b.recs) - i - k)
					return err
				}
			}
			if b.err != nil {
				return b.err
			}
		}
		timer.Stop()
		if err := ss.retryDue(emit); err != nil {
			return err
		}
	}
}

// emitFunc is the source's emit ([pipeline.FromAckedBatches]).
type emitFunc[T any] = func([]Message[T], []func(pipeline.Settlement)) error

// takeRun is the most polled records the body takes and emits at once: one lock of
// the session, of the pipeline's tracker and of its first queue for each run of them.
const takeRun = 64

// session is one run's membership of the group.
type session[T any] struct {
	s  *Source[T]
	cl *kgo.Client
	tx *kgo.GroupTransactSession // with WithTransactionalID: cl's session

	// owned is, with tx, the member's whole assignment from its last sync (nil before
	// one): see syncWatcher.
	owned  atomic.Pointer[map[TopicPartition]bool]
	txnMu  sync.Mutex // with tx: held through a transaction, from its Begin to its End
	pollMu sync.Mutex // with tx: held through a poll and through a transaction (kgo: no poll during Begin or End)

	commitMu sync.Mutex // held from collecting watermarks until their commit is done
	storeMu  sync.Mutex // with WithOffsetStore: held through a sink's store transaction (BeginStoreTxn to End)

	mu          sync.Mutex
	parts       map[TopicPartition]*part
	held        int           // records polled and not settled, of live partitions
	changed     chan struct{} // closed (and replaced) when held or a part's busy drops and someone waits
	waiting     bool
	outstanding int // emitted items whose settle was not called yet
	retries     []retryAt
	txnDone     map[*entry]bool          // entries whose outputs a transaction committed, until they settle
	staleTo     map[TopicPartition]int64 // of ended assignments, for the next: see part.staleTo
	bodyDone    bool
	finished    bool

	lagRead atomic.Int64 // when the lag was last read (Unix ns; 0: never): see endsWanted

	kick     chan struct{} // a retry was scheduled
	stopped  chan struct{}
	stopOnce sync.Once
	failed   chan struct{} // closed when failErr is set: the run fails with it
	failErr  error
	failOnce sync.Once

	// The body's, reused from one take to the next: emit keeps neither slice.
	ents    []*entry
	kept    []*entry
	msgs    []Message[T]
	settles []func(pipeline.Settlement)

	free []*settler[T] // settle callbacks whose call came, to reuse; under mu
}

// settler is the settle callback of an emitted record (fn, made once): the run calls
// it exactly once, after which it serves another record, so that an emit allocates no
// callback per record (a closure each was 2,000,000 allocations per iteration of
// BenchmarkS8Kafka, 60 ns per record in its profile before the collector's share).
type settler[T any] struct {
	e  *entry // the record's, nil while free
	fn func(pipeline.Settlement)
}

type retryAt struct {
	e   *entry
	due time.Time
}

// polledBatch is what one poll gave: records of partitions that were live then.
type polledBatch struct {
	recs []polledRec
	err  error // a fatal error: the run fails after recs
}

type polledRec struct {
	p   *part
	rec *kgo.Record
}

func (ss *session[T]) stop() { ss.stopOnce.Do(func() { close(ss.stopped) }) }

func (ss *session[T]) isFailed() bool {
	select {
	case <-ss.failed:
		return true
	default:
		return false
	}
}

// fail makes the run fail with err (the first one given).
func (ss *session[T]) fail(err error) {
	ss.failOnce.Do(func() {
		ss.failErr = err
		close(ss.failed)
	})
}

func (ss *session[T]) isStopped() bool {
	select {
	case <-ss.stopped:
		return true
	default:
		return false
	}
}

// signalLocked wakes whoever waits for held or busy to drop.
func (ss *session[T]) signalLocked() {
	if ss.waiting {
		close(ss.changed)
		ss.changed = make(chan struct{})
		ss.waiting = false
	}
}

// waitLocked returns the channel closed at the next signal. ss.mu must be held.
func (ss *session[T]) waitLocked() <-chan struct{} {
	ss.waiting = true
	return ss.changed
}

// drop gives back the room of n polled records the body will not emit.
func (ss *session[T]) drop(n int) {
	if n <= 0 {
		return
	}
	ss.s.dropped.Add(int64(n))
	ss.mu.Lock()
	ss.held -= n
	ss.signalLocked()
	ss.mu.Unlock()
}

// poll polls records while there is room for them, tags each with its partition's
// assignment (rebalances are blocked from the poll until AllowRebalance) and hands
// them to the body.
func (ss *session[T]) poll(ctx context.Context, out chan<- polledBatch) {
	// One more than the pipeline's bound (pipeline.WithMaxPending): when the pipeline
	// holds maxPending items, the body waits in emit with the next record, and only that
	// wait tells the batches downstream to flush what they hold. At maxPending, every
	// held record could be emitted, none waiting, and a partial batch without a linger
	// would hold its items for good.
	limit := ss.s.cfg.maxPending + 1
	for {
		ss.mu.Lock()
		for ss.held >= limit {
			ch := ss.waitLocked()
			ss.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
			ss.mu.Lock()
		}
		room := limit - ss.held
		ss.mu.Unlock()
		fs, unlock := ss.pollRecords(ctx, room)
		if ctx.Err() != nil || fs.IsClientClosed() {
			ss.cl.AllowRebalance()
			unlock()
			return
		}
		b := polledBatch{recs: make([]polledRec, 0, fs.NumRecords())}
		fs.EachError(func(topic string, _ int32, err error) {
			if fatal := ss.fatal(topic, err); fatal != nil && b.err == nil {
				b.err = fatal
			}
		})
		ss.mu.Lock()
		// One look-up of the partition per fetched partition, not per record: the
		// records of a partition come together.
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			p := ss.parts[TopicPartition{fp.Topic, fp.Partition}]
			if p != nil && fp.Err == nil {
				p.hwm = max(p.hwm, fp.HighWatermark)
			}
			if p == nil || !p.live || p.revoking || ss.s.cfg.store != nil && !p.claimed {
				ss.s.dropped.Add(int64(len(fp.Records)))
				return
			}
			for _, r := range fp.Records {
				if ss.tx == nil {
					if p.start < 0 {
						p.start = r.Offset
					}
				} else if !p.admit(r.Offset) { // only a transactional source rewinds (SetOffsets)
					ss.s.dropped.Add(1)
					continue
				}
				b.recs = append(b.recs, polledRec{p: p, rec: r})
			}
		})
		ss.held += len(b.recs)
		ss.mu.Unlock()
		ss.cl.AllowRebalance()
		unlock()
		if len(b.recs) == 0 && b.err == nil {
			continue
		}
		select {
		case out <- b:
		case <-ctx.Done():
			ss.drop(len(b.recs))
			return
		}
		if b.err != nil {
			return
		}
	}
}

// fatal returns the error a run fails with for err, reported by the client about
// topic (or the group, when topic is empty), or nil for an error the client retries.
func (ss *session[T]) fatal(topic string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
		return nil
	}
	for _, fatal := range []error{
		kerr.GroupAuthorizationFailed, kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed,
		kerr.InvalidGroupID, kerr.SaslAuthenticationFailed, kerr.UnknownTopicOrPartition, kerr.UnknownTopicID,
	} {
		if errors.Is(err, fatal) {
			if errors.Is(err, kerr.GroupAuthorizationFailed) || errors.Is(err, kerr.InvalidGroupID) {
				topic = ""
			}
			return &GroupError{Group: ss.s.group, Topic: topic, Err: err}
		}
	}
	ss.s.fetchErrors.Add(1)
	return nil
}

// take registers polled records (at most takeRun) in their partitions and emits them,
// but for those whose partition was revoked since the poll. The emit may wait for room
// (the pipeline's bound, a full queue) while a partition's revoke begins, waits for
// its records and gives up: those records then enter the pipeline after its revoke,
// and settle as Stale. emit cannot be called off, so this window stays open; it holds
// at most takeRun records, as the body emits one run at a time and takes no other
// record of a revoking partition.
func (ss *session[T]) take(emit emitFunc[T], recs []polledRec) error {
	ents := ss.ents[:0]
	slab := make([]entry, len(recs)) // one allocation for the run's entries, not one each
	ss.mu.Lock()
	gone := 0
	for i, r := range recs {
		if !r.p.live || r.p.revoking {
			gone++
			continue
		}
		if e := r.p.addIn(&slab[i], r.rec); e != nil {
			ents = append(ents, e)
		} else {
			gone++ // a record its assignment has already (part.addIn)
		}
	}
	if gone > 0 {
		ss.held -= gone
		ss.signalLocked()
	}
	ss.mu.Unlock()
	if gone > 0 {
		ss.s.dropped.Add(int64(gone))
	}
	ss.s.fetched.Add(int64(len(ents)))
	err := ss.emitEntries(emit, ents)
	clear(ents)
	ss.ents = ents[:0]
	return err
}

// emitEntries decodes the records of ents and emits them in one call (each entry is in
// the pipeline); an undecodable record is dead-lettered instead.
func (ss *session[T]) emitEntries(emit emitFunc[T], ents []*entry) error {
	msgs, kept := ss.msgs[:0], ss.kept[:0]
	for _, e := range ents {
		rec := e.rec
		// Decoded in its message's place: a value of its own would be allocated
		// (the codec is an interface) for every record.
		msgs = append(msgs, Message[T]{
			Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: rec.Key,
			Headers: rec.Headers, Timestamp: rec.Timestamp,
		})
		if err := ss.s.codec.Unmarshal(rec.Value, &msgs[len(msgs)-1].Value); err != nil {
			msgs[len(msgs)-1] = Message[T]{}
			msgs = msgs[:len(msgs)-1]
			if ss.deadLetter(e, pipeline.DeadLetter[struct{}]{
				Stage: ss.s.cfg.name, Attempts: 1, Class: pipeline.ClassItem, ErrType: fmt.Sprintf("%T", err),
				FirstError: err.Error(), LastError: err.Error(), Time: time.Now(),
			}) {
				ss.s.undecodable.Add(1)
			}
			continue
		}
		kept = append(kept, e)
	}
	if len(msgs) == 0 {
		return nil
	}
	settles := ss.settles[:0]
	ss.mu.Lock()
	ss.outstanding += len(msgs)
	for _, e := range kept {
		var h *settler[T]
		if n := len(ss.free); n > 0 {
			h = ss.free[n-1]
			ss.free[n-1] = nil
			ss.free = ss.free[:n-1]
		} else {
			h = &settler[T]{}
			h.fn = func(st pipeline.Settlement) { ss.settleBy(h, st) }
		}
		h.e = e
		settles = append(settles, h.fn)
	}
	ss.mu.Unlock()
	err := emit(msgs, settles)
	clear(msgs)
	clear(kept)
	clear(settles)
	ss.msgs, ss.kept, ss.settles = msgs[:0], kept[:0], settles[:0]
	return err
}

// settleBy is h's callback: h is free again once it has its record.
func (ss *session[T]) settleBy(h *settler[T], st pipeline.Settlement) {
	e := h.e
	h.e = nil
	if st.Outcome == pipeline.Committed && ss.committedDone(e, h) {
		return
	}
	ss.mu.Lock()
	ss.free = append(ss.free, h)
	ss.mu.Unlock()
	ss.settleRest(e, st)
}

// settleRest follows the outcome of an emitted item that committedDone did not settle:
// held back by a transaction, or not committed.
func (ss *session[T]) settleRest(e *entry, st pipeline.Settlement) {
	switch {
	case st.Outcome != pipeline.Committed && ss.outputCommitted(e):
		ss.s.committed.Add(1) // a stale message's output is the record's
	case st.Outcome == pipeline.Committed: // held back by a transaction (see unproduced)
		ss.retryLater(e, txnPollWait) // its batch held it back: produce it in order
	case st.Outcome == pipeline.DeadLettered:
		ss.deadLetter(e, st.DeadLetter)
	case st.Outcome == pipeline.HandedBack:
		ss.s.handedBack.Add(1)
		ss.retryLater(e, st.Delay)
	default:
		ss.s.notProcessed.Add(1)
		ss.abandon(e)
	}
	ss.mu.Lock()
	last := ss.settledLocked()
	ss.mu.Unlock()
	if last {
		ss.finish()
	}
}

// outputCommitted reports whether a transaction (NewTransactSink's, or a store's with
// WithOffsetStore) committed the output of e's record from a stale message of it,
// while e's own message settled otherwise (handed back, dead-lettered, not
// processed), and then settles e as done. A message names its record by partition
// and offset (see prospect): after a rewind or a reassignment, one from before it
// (stale) and the record's replay name the same record, and whichever reaches the
// sink first is its output, its one outcome. The transaction committed the offset
// past the record with it, so e emitted again could only be dead-lettered as well
// (an output and a dead letter), or handed back again. A transaction in progress
// that holds e is waited for (its outcome decides). If it reports false, e is marked
// settling: no transaction takes a stale message of e's record until e is emitted
// again, so that its own message's outcome (a dead letter under way) stays the only
// one.
//
// Only a record that may have a stale message (at or below its part's staleTo) is
// settled so. Another's output committed is its own message's, through another branch
// of a Tee (or another piece of a flat-map) than the one that settled it otherwise:
// that record is emitted again (the transaction does not produce it twice) or
// dead-lettered, as before (see NewTransactSink on Tee).
func (ss *session[T]) outputCommitted(e *entry) bool {
	if ss.s.cfg.txnID == "" && ss.s.cfg.store == nil { // no transaction takes a record
		return false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if e.offset > e.p.staleTo {
		return false // no stale message of its record: none can be in a transaction
	}
	for e.p.live && e.inTxn {
		ch := ss.waitLocked()
		ss.mu.Unlock()
		<-ch
		ss.mu.Lock()
	}
	if !e.p.live {
		return false
	}
	if ss.txnDone[e] {
		ss.doneLocked(e)
		return true
	}
	e.settling = true
	return false
}

// committedDone settles a committed item that no transaction held back (nearly
// every one), in one lock: done, its end as an outstanding item, and h (if not nil)
// freed. It reports false, having done nothing, for an item held back (unproduced).
func (ss *session[T]) committedDone(e *entry, h *settler[T]) bool {
	ss.mu.Lock()
	if ss.unproducedLocked(e) {
		ss.mu.Unlock()
		return false
	}
	if h != nil {
		ss.free = append(ss.free, h)
	}
	ss.doneLocked(e)
	last := ss.settledLocked()
	ss.mu.Unlock()
	ss.s.committed.Add(1)
	if last {
		ss.finish()
	}
	return true
}

// settledLocked ends an outstanding item, and reports whether it was the last one of
// a body that returned (then the caller calls finish). ss.mu must be held.
func (ss *session[T]) settledLocked() bool {
	ss.outstanding--
	last := ss.bodyDone && ss.outstanding == 0 && !ss.finished
	if last {
		ss.finished = true
	}
	return last
}

// deadLetter produces e's record to the dead-letter topic, if any, and settles it;
// if the produce fails, the record is emitted again later. It returns false, having
// produced nothing, for a stale message (staleDeadLetter) too.
func (ss *session[T]) deadLetter(e *entry, dl pipeline.DeadLetter[struct{}]) bool {
	if ss.staleDeadLetter(e) {
		ss.s.stale.Add(1)
		return false
	}
	cfg := &ss.s.cfg
	if cfg.dl != nil {
		rec := e.rec
		h := slices.Grow(slices.Clone(rec.Headers), 10)
		for _, kv := range [...][2]string{
			{HeaderStage, dl.Stage},
			{HeaderClass, dl.Class.String()},
			{HeaderErrType, dl.ErrType},
			{HeaderError, dl.LastError},
			{HeaderFirstError, dl.FirstError},
			{HeaderAttempts, strconv.Itoa(dl.Attempts)},
			{HeaderTopic, rec.Topic},
			{HeaderPartition, strconv.FormatInt(int64(rec.Partition), 10)},
			{HeaderOffset, strconv.FormatInt(rec.Offset, 10)},
			{HeaderTime, dl.Time.UTC().Format(time.RFC3339Nano)},
		} {
			h = append(h, kgo.RecordHeader{Key: kv[0], Value: []byte(kv[1])})
		}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
		err := cfg.dl.ProduceSync(ctx, &kgo.Record{Topic: cfg.dlTopic, Key: rec.Key, Value: rec.Value, Headers: h}).FirstErr()
		cancel()
		if err != nil {
			ss.s.dlErrors.Add(1)
			if derr := ss.deadLetterFailed(e, err); derr != nil {
				ss.abandon(e) // uncommitted: the next run meets it again
				ss.fail(derr)
				return false
			}
			ss.retryLater(e, deadLetterRetry)
			return false
		}
	}
	ss.s.deadLettered.Add(1)
	ss.done(e)
	return true
}

// staleDeadLetter reports whether e is set aside after its assignment ended (a
// revoke that gave up on it, a loss, a rewind after an aborted transaction, a store's
// fence): then its dead letter is not produced (it settles as stale), since the record
// has, or will have, its one outcome otherwise. Either its offset was not committed
// (no committed transaction took it: a plain source's watermark stops at its first
// unsettled record), and whoever holds the partition now redoes the record from the
// committed offset (this run's replay, or the next owner); or a committed
// transaction took it (its output, and its offset committed past it) while the
// record may have a stale message (at or below staleTo): that output may be the
// stale message's, and is the record's outcome, as outputCommitted has it for a live
// assignment. A record whose output a transaction committed and that has no stale
// message got that output from its own message, through another branch of a Tee:
// nobody reads it again, and its dead letter is produced, as for a live assignment
// (see NewTransactSink on Tee).
//
// The check is made before the produce: a dead letter under way when its assignment
// ends is produced, and the record may be redone too (a dead letter at least once).
func (ss *session[T]) staleDeadLetter(e *entry) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return !e.p.live && (!e.txnCommitted || e.offset <= e.p.staleTo)
}

// deadLetterFailed returns the error the run fails with when e's dead letter could
// not be produced (err): at once for a cause that cannot pass, once the first failure
// of e's dead letter is WithDeadLetterTimeout old for others, else nil (try again).
func (ss *session[T]) deadLetterFailed(e *entry, err error) error {
	now := time.Now()
	ss.mu.Lock()
	if e.dlSince == 0 {
		e.dlSince = now.UnixNano()
	}
	since := time.Unix(0, e.dlSince)
	ss.mu.Unlock()
	permanent := unrecoverable(err)
	if !permanent && now.Sub(since) < ss.s.cfg.dlPatience {
		return nil
	}
	return &DeadLetterError{Topic: ss.s.cfg.dlTopic, From: e.p.tp, Offset: e.offset, Permanent: permanent, Err: err}
}

// unproducedLocked reports whether e, of a live partition, was held back by a transactional
// batch (prospect) or a store transaction (storeProspect) and no transaction produced
// or wrote it since: its settle must not count it done, or its output would be lost.
// ss.mu must be held.
func (ss *session[T]) unproducedLocked(e *entry) bool {
	if !e.heldBack || !e.p.live || ss.txnDone[e] {
		return false
	}
	e.heldBack = false
	e.settling = true // to wait for a retry: no transaction takes a stale message of its record meanwhile
	return true
}

// done settles e: its partition's watermark may move.
func (ss *session[T]) done(e *entry) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.doneLocked(e)
}

// doneLocked is done with ss.mu held.
func (ss *session[T]) doneLocked(e *entry) {
	if ss.txnDone != nil {
		delete(ss.txnDone, e)
	}
	if !e.p.live {
		ss.s.stale.Add(1)
		return
	}
	e.p.settle(e)
	ss.held--
	ss.pauseLocked(e.p)
	ss.signalLocked()
}

// pauseLocked pauses the fetches of p while WithMaxPending of its records settled
// behind an unsettled one, and resumes them once fewer did: records that settle
// behind a record handed back again and again cannot pile up without bound.
func (ss *session[T]) pauseLocked(p *part) {
	switch full := p.nsettled >= ss.s.cfg.maxPending; {
	case full && !p.paused:
		p.paused = true
		ss.s.paused.Add(1)
		ss.cl.PauseFetchPartitions(map[string][]int32{p.tp.Topic: {p.tp.Partition}})
	case !full && p.paused:
		p.paused = false
		ss.cl.ResumeFetchPartitions(map[string][]int32{p.tp.Topic: {p.tp.Partition}})
	}
}

// abandon leaves e unsettled for good: the run is stopping.
func (ss *session[T]) abandon(e *entry) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if e.p.live {
		e.p.toRetry(e)
		ss.signalLocked()
	}
}

// retryLater schedules e to be emitted again after d.
func (ss *session[T]) retryLater(e *entry, d time.Duration) {
	ss.mu.Lock()
	if !e.p.live {
		ss.mu.Unlock()
		ss.s.stale.Add(1)
		return
	}
	e.p.toRetry(e)
	ss.signalLocked()
	if ss.bodyDone {
		ss.mu.Unlock()
		return
	}
	at := retryAt{e: e, due: time.Now().Add(d)}
	i, _ := slices.BinarySearchFunc(ss.retries, at, func(a, b retryAt) int { return a.due.Compare(b.due) })
	ss.retries = slices.Insert(ss.retries, i, at)
	ss.mu.Unlock()
	select {
	case ss.kick <- struct{}{}:
	default:
	}
}

// nextRetry returns how long until the first retry is due, if one waits.
func (ss *session[T]) nextRetry() (time.Duration, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.retries) == 0 {
		return 0, false
	}
	return max(time.Until(ss.retries[0].due), 0), true
}

// retryDue emits again the records whose retry is due.
func (ss *session[T]) retryDue(emit emitFunc[T]) error {
	now := time.Now()
	ss.mu.Lock()
	n := 0
	for n < len(ss.retries) && !ss.retries[n].due.After(now) {
		n++
	}
	due := make([]*entry, 0, n)
	for _, r := range ss.retries[:n] {
		if p := r.e.p; p.live && !p.revoking && r.e.state == waitingRetry {
			p.retried(r.e)
			due = append(due, r.e)
		}
	}
	ss.retries = slices.Delete(ss.retries, 0, n)
	ss.mu.Unlock()
	// back puts the entries not emitted back to waiting: not in the pipeline, so
	// that a revoke does not wait for them.
	back := func(es []*entry) {
		ss.mu.Lock()
		for _, e := range es {
			e.p.toRetry(e)
		}
		ss.signalLocked()
		ss.mu.Unlock()
	}
	for i, e := range due {
		if ss.isStopped() {
			back(due[i:])
			return nil
		}
		// The emit of the one before may have waited for room while e's partition
		// began its revoke (or ended): e must not go into the pipeline after that.
		ss.mu.Lock()
		gone := !e.p.live || e.p.revoking
		if gone {
			e.p.toRetry(e)
			ss.signalLocked()
		}
		ss.mu.Unlock()
		if gone {
			continue
		}
		if err := ss.emitEntries(emit, due[i:i+1]); err != nil {
			back(due[i+1:])
			return err
		}
	}
	return nil
}

// end is the body's end: the last item to settle (or the body itself, when none is
// in flight) commits and closes the client.
func (ss *session[T]) end() {
	ss.mu.Lock()
	ss.bodyDone = true
	ss.retries = nil
	last := ss.outstanding == 0 && !ss.finished
	if last {
		ss.finished = true
	}
	ss.mu.Unlock()
	if last {
		ss.finish()
	}
}

// finish commits the watermarks of every partition and closes the client, which leaves
// the group (its last revoke finds nothing more to commit).
func (ss *session[T]) finish() {
	defer func() {
		ss.s.mu.Lock()
		if ss.s.open == ss {
			ss.s.open = nil
		}
		ss.s.mu.Unlock()
	}()
	if ss.s.crash.Load() { // a test's crash: no last commit
		ss.cl.Close()
		return
	}
	ss.commitDue(context.Background(), false)
	ss.saveStore(context.Background(), nil)
	ss.cl.CloseAllowingRebalance()
}

// commitLoop commits the watermarks that moved, every interval, and lists the end
// offsets when they are wanted (endsWanted).
func (ss *session[T]) commitLoop(ctx context.Context) {
	tick := time.NewTicker(ss.s.cfg.commitEvery)
	defer tick.Stop()
	var listed time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			ss.commitDue(ctx, true)
			ss.saveStore(ctx, nil)
			if now := time.Now(); ss.endsWanted(now, listed) {
				listed = now
				ss.listEnds(ctx)
			}
		}
	}
}

// The end offsets (listEnds) are listed at most every listEvery (or every commit
// interval, if longer), and only while the lag is read (Stats, a report of the
// pipeline: Source.lag) within lagInterest: they serve Stats.Lag alone, and a
// request per interval (50 a second at 20 ms) was spent whether anyone looked or not.
const (
	listEvery   = time.Second
	lagInterest = time.Minute
)

// endsWanted reports whether the commit loop's tick at now lists the end offsets,
// last listed at listed.
func (ss *session[T]) endsWanted(now, listed time.Time) bool {
	read := ss.lagRead.Load()
	// Half an interval of slack: a tick that comes a little early still lists.
	return read != 0 && now.Sub(time.Unix(0, read)) < lagInterest && now.Sub(listed) >= listEvery-ss.s.cfg.commitEvery/2
}

// listEnds updates the high watermarks of the live partitions from a listing of the
// topics' end offsets (for Stats.Lag): a partition whose fetches wait (the pipeline
// is full, or it is paused) shows no newer one. A failed listing changes nothing.
func (ss *session[T]) listEnds(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, ss.s.cfg.timeout)
	defer cancel()
	adm := kadm.NewClient(ss.cl)
	ends, err := adm.ListEndOffsets(ctx, ss.s.topics...)
	if err != nil {
		return
	}
	ss.mu.Lock()
	needStart := false
	ends.Each(func(o kadm.ListedOffset) {
		if p := ss.parts[TopicPartition{o.Topic, o.Partition}]; p != nil && o.Err == nil {
			p.hwm = max(p.hwm, o.Offset)
			needStart = needStart || p.committed < 0 && p.start < 0
		}
	})
	ss.mu.Unlock()
	if !needStart {
		return
	}
	// A partition with nothing committed by this run and no record taken yet: its lag
	// may have to count from the log's start (Stats.Lag).
	starts, err := adm.ListStartOffsets(ctx, ss.s.topics...)
	if err != nil {
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	starts.Each(func(o kadm.ListedOffset) {
		if p := ss.parts[TopicPartition{o.Topic, o.Partition}]; p != nil && o.Err == nil {
			p.logStart = o.Offset
		}
	})
}

// commitDue commits the watermarks of the live partitions (not those being revoked,
// when skipRevoking) that moved since their last commit.
func (ss *session[T]) commitDue(ctx context.Context, skipRevoking bool) {
	if ss.tx != nil { // offsets only in a transaction
		if err := ss.transact(ctx, nil); err != nil && ctx.Err() == nil {
			ss.s.commitErrors.Add(1)
			ss.fail(err) // after the run's end (its last commit), counted only
		}
		return
	}
	ss.commitMu.Lock()
	defer ss.commitMu.Unlock()
	ss.mu.Lock()
	type marked struct {
		p              *part
		offset, behind int64
	}
	var ps []marked
	offs := map[string]map[int32]kgo.EpochOffset{}
	for _, p := range ss.parts {
		if !p.live || skipRevoking && p.revoking || !p.due() {
			continue
		}
		addOffset(offs, p)
		ps = append(ps, marked{p, p.mark.Offset, p.behind})
	}
	ss.mu.Unlock()
	if len(ps) == 0 {
		return
	}
	if ss.commit(ctx, ss.cl, offs) != nil {
		return
	}
	ss.mu.Lock()
	for _, m := range ps {
		if m.offset > m.p.committed {
			m.p.committed, m.p.behindAt = m.offset, m.behind
		}
	}
	ss.mu.Unlock()
}

func addOffset(offs map[string]map[int32]kgo.EpochOffset, p *part) {
	t := offs[p.tp.Topic]
	if t == nil {
		t = map[int32]kgo.EpochOffset{}
		offs[p.tp.Topic] = t
	}
	t[p.tp.Partition] = p.mark
}

// commit commits offs with the group's generation and waits for the answer.
func (ss *session[T]) commit(parent context.Context, cl *kgo.Client, offs map[string]map[int32]kgo.EpochOffset) error {
	ctx, cancel := context.WithTimeout(parent, ss.s.cfg.timeout)
	defer cancel()
	var err error
	cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, cerr error) {
		if cerr != nil {
			err = cerr
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil && err == nil {
					err = perr
				}
			}
		}
	})
	if err != nil {
		if parent.Err() == nil { // not the interval's commit cut short by the run's end: the last commit follows
			ss.s.commitErrors.Add(1)
		}
		return err
	}
	ss.s.commits.Add(1)
	return nil
}

// assigned starts a new assignment of each partition: nothing of an earlier one
// carries over.
func (ss *session[T]) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	// commitMu: an interval commit that collected a watermark of an assignment this
	// one ends must be done (or fail) before the client goes on with a new generation.
	ss.commitMu.Lock()
	defer ss.commitMu.Unlock()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for topic, partitions := range assigned {
		for _, n := range partitions {
			tp := TopicPartition{topic, n}
			if old := ss.parts[tp]; old != nil { // never revoked: as if lost
				ss.s.uncommitted.Add(old.uncommitted() + ss.endPartLocked(old))
			}
			ss.parts[tp] = ss.newPartLocked(tp)
			ss.s.assigned.Add(1)
		}
	}
	ss.dropUnownedLocked() // a transactional source's revokes may not all have come (syncWatcher)
}

// revoked stops emitting the revoked partitions' records, waits (a while) for their
// items in the pipeline to settle, and commits their watermarks.
func (ss *session[T]) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if ss.tx != nil {
		// A transaction cannot end in this callback (kgo's session holds the lock its
		// End needs), and the session aborts the open one: what it held is redone.
		ss.endParts(revoked)
		return
	}
	ss.mu.Lock()
	var ps []*part
	for topic, partitions := range revoked {
		for _, n := range partitions {
			if p := ss.parts[TopicPartition{topic, n}]; p != nil && p.live {
				p.revoking = true
				ps = append(ps, p)
			}
		}
	}
	ss.mu.Unlock()
	if len(ps) == 0 {
		return
	}
	ss.mu.Lock()
	for _, p := range ps {
		ss.s.revokeWaited.Add(int64(p.busy))
	}
	ss.mu.Unlock()
	timer := time.NewTimer(ss.s.cfg.revokeWait)
	defer timer.Stop()
wait:
	for {
		ss.mu.Lock()
		busy := 0
		for _, p := range ps {
			busy += p.busy
		}
		if busy == 0 {
			ss.mu.Unlock()
			break
		}
		ch := ss.waitLocked()
		ss.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	ss.saveStore(ctx, ps)
	ss.commitMu.Lock()
	defer ss.commitMu.Unlock()
	ss.mu.Lock()
	offs := map[string]map[int32]kgo.EpochOffset{}
	var behind, beyond int64
	for _, p := range ps {
		if p.live && p.due() {
			addOffset(offs, p)
			behind += p.uncommitted()
		}
		beyond += ss.endPartLocked(p)
	}
	ss.mu.Unlock()
	ss.s.revoked.Add(int64(len(ps)))
	if len(offs) > 0 && ss.commit(ctx, cl, offs) != nil { // cl: the callback may come before run has set ss.cl
		beyond += behind // the next owner redoes these too
	}
	ss.s.uncommitted.Add(beyond)
}

// lost drops the lost partitions: no commit of theirs can land.
func (ss *session[T]) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	ss.commitMu.Lock() // as in assigned: no commit of an older snapshot after this
	defer ss.commitMu.Unlock()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.dropPartsLocked(lost, &ss.s.lost)
}

// dropPartsLocked ends the live assignments of the partitions in m, none of whose
// records can be committed now: their settled records count as uncommitted, and ended
// counts the partitions.
func (ss *session[T]) dropPartsLocked(m map[string][]int32, ended *atomic.Int64) {
	for topic, partitions := range m {
		for _, n := range partitions {
			if p := ss.parts[TopicPartition{topic, n}]; p != nil && p.live {
				ss.dropPartLocked(p, ended)
			}
		}
	}
}

// dropPartLocked ends live part p's assignment (endPartLocked), counts what it held
// as uncommitted and the part in ended. ss.mu must be held.
func (ss *session[T]) dropPartLocked(p *part, ended *atomic.Int64) {
	ss.s.uncommitted.Add(p.uncommitted() + ss.endPartLocked(p))
	ended.Add(1)
}

// newPartLocked returns a new assignment of tp, with the stale messages the ended ones
// may have left in the pipeline (part.staleTo). ss.mu must be held.
func (ss *session[T]) newPartLocked(tp TopicPartition) *part {
	p := newPart(tp)
	if to, ok := ss.staleTo[tp]; ok {
		p.staleTo = to
		delete(ss.staleTo, tp)
	}
	return p
}

// endPartLocked ends p's assignment: its unsettled records no longer count, and what
// settles of them later is stale. It returns how many records settled past its
// watermark (behind an unsettled one): the next owner redoes them.
//
// Its records waiting to be emitted again leave ss.retries, and those a transaction
// produced leave ss.txnDone: neither is read for an ended part, and each would keep
// the part, with its records, for as long as it stayed (a retry until it was due,
// with a hand-back's delay of the user's choosing; a txnDone entry whose item never
// settled through done, such as one handed back, for the rest of the run), a leak
// that grew with the rebalances.
func (ss *session[T]) endPartLocked(p *part) int64 {
	if !p.live {
		return 0
	}
	p.live = false
	ss.retries = slices.DeleteFunc(ss.retries, func(r retryAt) bool { return r.e.p == p })
	if ss.s.cfg.txnID != "" || ss.s.cfg.store != nil { // the records whose messages stay in the pipeline, stale
		to := p.staleTo
		for _, e := range p.pending {
			if e.state == inPipeline {
				to = max(to, e.offset)
			}
		}
		if to >= 0 {
			if ss.staleTo == nil {
				ss.staleTo = map[TopicPartition]int64{}
			}
			ss.staleTo[p.tp] = max(ss.staleTo[p.tp], to)
		}
	}
	if len(ss.txnDone) > 0 {
		for _, e := range p.pending { // an entry leaves pending only settled, and done deletes it first
			delete(ss.txnDone, e)
		}
	}
	if p.paused { // paused partitions stay paused across rebalances
		p.paused = false
		ss.cl.ResumeFetchPartitions(map[string][]int32{p.tp.Topic: {p.tp.Partition}})
	}
	unsettled, beyond := p.unsettled()
	ss.held -= unsettled
	if ss.parts[p.tp] == p {
		delete(ss.parts, p.tp)
	}
	ss.signalLocked()
	return int64(beyond)
}
