package kafka_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
)

// txnMember is one member of a transactional Kafka-to-Kafka group: its source, its
// pipeline (a stage keyed by partition, then batches into NewTransactSink) and its
// run's error.
type txnMember struct {
	src  *kafka.Source[int]
	errc <-chan error
}

func startTxnMember(ctx context.Context, c *kfake.Cluster, group, id string, opts ...kgo.Opt) *txnMember {
	return startGatedTxnMember(ctx, c, group, id, nil, opts...)
}

// startGatedTxnMember is startTxnMember with a gate: its stage holds each item until
// gate is closed (nil: no gate).
func startGatedTxnMember(ctx context.Context, c *kfake.Cluster, group, id string, gate <-chan struct{}, opts ...kgo.Opt) *txnMember {
	src := kafka.NewSource(append(consumerOpts(c), opts...), group, []string{inTopic}, idCodec{},
		kafka.WithTransactionalID(id), kafka.WithCommitInterval(50*time.Millisecond), kafka.WithMaxPending(300))
	p := pipeline.New()
	keyed := pipeline.Then(src.Stream(p), pipeline.NewStage("map", 4, func(ctx context.Context, m kafka.Message[int]) (kafka.Message[int], error) {
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return m, ctx.Err()
			}
		}
		return m, nil // the output keeps its input's origin (Topic, Partition, Offset)
	}, pipeline.WithKey(kafka.Message[int].TopicPartition)))
	pipeline.ToBatches(keyed, 40, kafka.NewTransactSink("out", src, outTopic, idCodec{}, originHeaders(id)), pipeline.WithLinger(10*time.Millisecond))
	return &txnMember{src: src, errc: runAsync(ctx, p)}
}

// originHeaders gives each output record the headers "member" (the producing member's
// transactional id) and "from" (its input record's partition and offset), for the
// report of duplicates (reportDuplicates).
func originHeaders(member string) func(kafka.Message[int]) ([]byte, []kgo.RecordHeader) {
	return func(m kafka.Message[int]) ([]byte, []kgo.RecordHeader) {
		return m.Key, []kgo.RecordHeader{
			{Key: "member", Value: []byte(member)},
			{Key: "from", Value: []byte(itoa32(m.Partition) + "@" + itoa64(m.Offset))},
		}
	}
}

// reportDuplicates logs every output read more than once: for each copy, its partition
// and offset in the output, the producer (id, epoch) that wrote it and its headers. It
// returns how many copies were more than one.
func reportDuplicates(t *testing.T, recs []*kgo.Record) int {
	t.Helper()
	byID := map[int][]*kgo.Record{}
	for _, r := range recs {
		id := idOf(t, r)
		byID[id] = append(byID[id], r)
	}
	dups := 0
	for id, rs := range byID {
		if len(rs) < 2 {
			continue
		}
		dups += len(rs) - 1
		for _, r := range rs {
			var hs []string
			for _, h := range r.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			t.Logf("duplicate %d: out %d@%d producer %d/%d %v", id, r.Partition, r.Offset, r.ProducerID, r.ProducerEpoch, hs)
		}
	}
	return dups
}

// readCommitted reads topic as a read-committed consumer: at least n records, then on
// until a poll finds nothing more (every transaction has ended, so nothing is pending).
func readCommitted(ctx context.Context, t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := newClient(t, c, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(100*time.Millisecond))
	var recs []*kgo.Record
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(recs) < n {
		fs := cl.PollFetches(rctx)
		require.NoError(t, rctx.Err(), "read %d of %d records of %s", len(recs), n, topic)
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	for {
		pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := cl.PollFetches(pctx)
		pcancel()
		got := 0
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r); got++ })
		if got == 0 {
			return recs
		}
	}
}

// txnCluster returns a cluster holding n records of ids (clusterWithIDs), the test's
// context, and the members' run context, canceled after 2 minutes or when the test
// ends; stable keeps its offset fetches stable (stablePerPartition).
func txnCluster(t *testing.T, n int, stable bool) (ctx, rctx context.Context, c *kfake.Cluster) {
	t.Helper()
	ctx, c = clusterWithIDs(t, n)
	if stable {
		stablePerPartition(c)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx, rctx, c
}

// settleTxnMembers waits until the group's committed offsets reach the input's end,
// stops the members (each run must end without an error) and returns the output read
// committed (at least n records).
func settleTxnMembers(ctx context.Context, t *testing.T, c *kfake.Cluster, group string, members []*txnMember, n int) []*kgo.Record {
	t.Helper()
	ends := endOffsets(ctx, t, c, inTopic)
	eventually(t, 90*time.Second, "every input offset committed", func() bool {
		return assert.ObjectsAreEqual(ends, committedOffsets(ctx, t, c, group, inTopic))
	})
	for _, m := range members {
		m.src.Stop()
	}
	for i, m := range members {
		require.NoError(t, <-m.errc)
		t.Logf("member %d: %+v", i, m.src.Stats())
	}
	return readCommitted(ctx, t, c, outTopic, n)
}

// requireEachOutputOnce checks that recs, the output read committed, hold the output
// of each of the n input records exactly once (reportDuplicates logs each duplicate).
func requireEachOutputOnce(t *testing.T, recs []*kgo.Record, n int) {
	t.Helper()
	dups := reportDuplicates(t, recs)
	require.Len(t, countIDs(t, recs), n, "every record's output")
	require.Zero(t, dups, "duplicates read committed")
}

// TestTransactSinkOutputsEachRecordOnceAcrossCrashAndRebalances runs two members of a
// group that consume, map and produce through NewTransactSink: one crashes in the
// middle of a transaction (its records produced, nothing committed), a third member
// joins, and the crashed one comes back under its transactional id (fencing its open
// transaction). A read-committed consumer of the output finds every input record's
// output exactly once, and the group's offsets at the input's end.
func TestTransactSinkOutputsEachRecordOnceAcrossCrashAndRebalances(t *testing.T) {
	t.Parallel()
	const n = 6000
	ctx, rctx, c := txnCluster(t, n, true)

	short := kgo.SessionTimeout(time.Second) // a crashed member's session expires soon
	a := startTxnMember(rctx, c, "eos", "member-a", short)
	b := startTxnMember(rctx, c, "eos", "member-b", short)
	eventually(t, 60*time.Second, "transactions on both members", func() bool {
		return a.src.Stats().Transactions > 3 && b.src.Stats().Transactions > 3
	})
	kafka.Crash(a.src)
	require.ErrorIs(t, <-a.errc, kafka.ErrCrashed)
	crashed := a.src.Stats()
	cm := startTxnMember(rctx, c, "eos", "member-c", short)
	a2 := startTxnMember(rctx, c, "eos", "member-a", short) // fences a's open transaction
	members := []*txnMember{b, cm, a2}
	t.Logf("crashed a: %+v", crashed)
	requireEachOutputOnce(t, settleTxnMembers(ctx, t, c, "eos", members, n), n)
}

// TestTransactionalMemberGivesUpEveryRevokedPartition holds a transactional member's
// items at a gate, so that nothing settles and its session ends no transaction, while
// two more members join: the group takes partitions from it twice, and kgo's
// GroupTransactSession calls OnPartitionsRevoked for the first revoke only until its
// next End. The member must still give up every partition taken from it (it kept them
// as its own, in Stats.Lag and in its rewinds): the members' Lag names each partition
// once. Then the gate opens, and a read-committed consumer of the output finds every
// input record's output exactly once.
func TestTransactionalMemberGivesUpEveryRevokedPartition(t *testing.T) {
	t.Parallel()
	const n = 3000
	ctx, rctx, c := txnCluster(t, n, true)
	gate := make(chan struct{})
	a := startGatedTxnMember(rctx, c, "revokes", "member-a", gate)
	eventually(t, 30*time.Second, "items of a at its gate", func() bool { return a.src.Stats().Fetched > 0 })
	b := startTxnMember(rctx, c, "revokes", "member-b")
	eventually(t, 30*time.Second, "a revoke of a's partitions, given to b", func() bool {
		return a.src.Stats().Revoked > 0 && b.src.Stats().Assigned > 0
	})
	cm := startTxnMember(rctx, c, "revokes", "member-c")
	members := []*txnMember{a, b, cm}
	eventually(t, 30*time.Second, "each partition held by one member", func() bool {
		held := map[kafka.TopicPartition]int{}
		for _, m := range members {
			for tp := range m.src.Stats().Lag {
				held[tp]++
			}
		}
		for _, k := range held {
			if k > 1 {
				return false
			}
		}
		return len(held) == partitions && cm.src.Stats().Assigned > 0
	})
	close(gate)
	requireEachOutputOnce(t, settleTxnMembers(ctx, t, c, "revokes", members, n), n)
}

// TestRestartedMemberFencesItsOpenTransactionAtStart leaves a member's transaction
// open with its offsets in it, as a process killed between its TxnOffsetCommit and its
// EndTxn leaves it (the broker drops the member's EndTxn, and the run fails): while
// that transaction holds the group's offsets, the broker answers the group's offset
// fetches UNSTABLE_OFFSET_COMMIT, so no member can start its partitions. The member
// restarted under the same transactional id must fence it at once, not at its first
// transaction (which never comes, since it fetches nothing) nor at the broker's
// transaction timeout (2 minutes here, longer than the test waits): every record's
// output is then read committed exactly once.
func TestRestartedMemberFencesItsOpenTransactionAtStart(t *testing.T) {
	t.Parallel()
	const n = 2000
	ctx, rctx, c := txnCluster(t, n, false)
	var dying, dropped atomic.Bool
	deadEpoch := int16(-1)
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.EndTxnRequest)
		if r.TransactionalID != "member-a" || !dying.Load() || deadEpoch >= 0 && r.ProducerEpoch != deadEpoch {
			return nil, nil, false
		}
		deadEpoch = r.ProducerEpoch // this member "died" before its EndTxn reached the broker
		dropped.Store(true)
		resp := r.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.InvalidTxnState.Code
		return resp, nil, true
	})
	long := kgo.TransactionTimeout(2 * time.Minute)
	a := startTxnMember(rctx, c, "fence", "member-a", long)
	eventually(t, 30*time.Second, "a few transactions", func() bool { return a.src.Stats().Transactions > 3 })
	dying.Store(true)
	require.Error(t, <-a.errc, "the run whose EndTxn was dropped")
	require.True(t, dropped.Load(), "an EndTxn dropped")
	a2 := startTxnMember(rctx, c, "fence", "member-a", long)
	seen := countIDs(t, settleTxnMembers(ctx, t, c, "fence", []*txnMember{a2}, n))
	require.Len(t, seen, n, "every record's output")
	for id, k := range seen {
		require.Equal(t, 1, k, "the output of record %d, read committed", id)
	}
}

// TestTransactSinkOutputsEachRecordOnceAcrossRepeatedCrashes runs three members with
// short sessions (500 ms) and, twelve times, crashes one of them in the middle of a
// transaction (every fourth time it stops gracefully instead) and restarts it under
// its transactional id, while more records arrive. Every abort takes the partitions
// back, and the messages still in the pipeline from before it reach the sink beside
// their replays; a read-committed consumer of the output must still find each input
// record's output exactly once. (What broke: a stale message whose replay was polled
// while an earlier record's replay was not yet produced was produced past that record,
// in a transaction whose offset stopped before it; the next abort or crash redid it.)
func TestTransactSinkOutputsEachRecordOnceAcrossRepeatedCrashes(t *testing.T) {
	t.Parallel()
	const rounds, trickle = 12, 120
	n := 6000
	ctx := t.Context()
	c := newCluster(t)
	stablePerPartition(c)
	producer := newIDProducer(t, c)
	produceIDsWith(ctx, t, producer, inTopic, 0, n)
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	short := kgo.SessionTimeout(500 * time.Millisecond)
	ids := []string{"m0", "m1", "m2"}
	members := make([]*txnMember, len(ids))
	for i, id := range ids {
		members[i] = startTxnMember(rctx, c, "churn", id, short)
	}
	t.Cleanup(func() {
		if t.Failed() { // what each member held when the test gave up
			for i, m := range members {
				t.Logf("member %s: %+v", ids[i], m.src.Stats())
			}
		}
	})
	var stats []kafka.Stats
	for k := range rounds {
		i := k % len(ids)
		// Crash it after a few transactions of this run (2 to 4), producing more
		// records meanwhile so that it has some to commit.
		want := members[i].src.Stats().Transactions + 2 + int64(k%3)
		polls := 0
		eventually(t, 60*time.Second, "transactions of member "+ids[i], func() bool {
			if members[i].src.Stats().Transactions >= want {
				return true
			}
			if polls++; polls%5 == 0 { // every 50 ms
				produceIDsWith(ctx, t, producer, inTopic, n, trickle)
				n += trickle
			}
			return false
		})
		if k%4 == 3 {
			members[i].src.Stop()
			require.NoError(t, <-members[i].errc)
		} else {
			kafka.Crash(members[i].src)
			require.ErrorIs(t, <-members[i].errc, kafka.ErrCrashed)
		}
		stats = append(stats, members[i].src.Stats())
		members[i] = startTxnMember(rctx, c, "churn", ids[i], short)
	}
	recs := settleTxnMembers(ctx, t, c, "churn", members, n)
	for _, m := range members {
		stats = append(stats, m.src.Stats())
	}
	dups := reportDuplicates(t, recs)
	var aborted, outOfOrder int64
	for _, s := range stats {
		aborted += s.Aborted
		outOfOrder += s.OutOfOrder
	}
	t.Logf("%d records, %d rounds: %d aborted transactions, %d records held back (OutOfOrder), %d duplicates", n, rounds, aborted, outOfOrder, dups)
	require.Len(t, countIDs(t, recs), n, "every record's output")
	require.Zero(t, dups, "duplicates read committed")
}

// failFirstTxnOffsetCommit makes c refuse the first TxnOffsetCommit of a transaction
// (every partition of it ConcurrentTransactions, an error kgo aborts on): that
// transaction aborts, and its source takes every partition back to its committed
// offset. fired reports whether it did.
func failFirstTxnOffsetCommit(c *kfake.Cluster) (fired *atomic.Bool) {
	return failTxnOffsetCommitWhere(c, func(int32) bool { return true })
}

// failTxnOffsetCommitOf makes c refuse the first TxnOffsetCommit that holds an offset
// of partition (as failFirstTxnOffsetCommit does): that transaction aborts. fired
// reports whether it did.
func failTxnOffsetCommitOf(c *kfake.Cluster, partition int32) (fired *atomic.Bool) {
	return failTxnOffsetCommitWhere(c, func(p int32) bool { return p == partition })
}

// failTxnOffsetCommitWhere makes c refuse the first TxnOffsetCommit that holds an
// offset of a partition that of accepts.
func failTxnOffsetCommitWhere(c *kfake.Cluster, of func(partition int32) bool) (fired *atomic.Bool) {
	fired = new(atomic.Bool)
	c.ControlKey(int16(kmsg.TxnOffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.TxnOffsetCommitRequest)
		holds := false
		for _, rt := range r.Topics {
			for _, rp := range rt.Partitions {
				holds = holds || of(rp.Partition)
			}
		}
		if !holds {
			c.KeepControl()
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewTxnOffsetCommitResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.ConcurrentTransactions.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		fired.Store(true)
		c.DropControl() // once kept, a control stays until dropped
		return resp, nil, true
	})
	return fired
}

// rewound is a run of a transactional source over clusterWithIDs's two records
// (record 0 in partition 0, record 1 in partition 1), with a dead-letter topic,
// through a stage "map" of four workers into NewTransactSink. Its first transaction
// aborts (failFirstTxnOffsetCommit): both partitions go back to offset 0, and a
// message of record 0 still in map is stale once its replay is taken.
type rewound struct {
	ctx  context.Context
	c    *kfake.Cluster
	src  *kafka.Source[int]
	errc <-chan error
}

// startRewound starts a rewound run of group, whose map calls zero for record 0's
// messages (record 1's pass), with opts; it returns once the transaction aborted and
// both records were taken again.
func startRewound(t *testing.T, group string, zero func(context.Context, kafka.Message[int]) (kafka.Message[int], error), opts ...pipeline.StageOption) *rewound {
	t.Helper()
	ctx, c := clusterWithIDs(t, 2)
	aborted := failFirstTxnOffsetCommit(c)
	src := kafka.NewSource(consumerOpts(c), group, []string{inTopic}, idCodec{},
		kafka.WithTransactionalID("member"), kafka.WithCommitInterval(50*time.Millisecond),
		kafka.WithDeadLetterTopic(newClient(t, c), deadTopic))
	p := pipeline.New()
	// Not keyed by partition (each partition has one record): a keyed stage could give
	// both partitions one worker, and record 1 would wait behind record 0's message.
	mapped := pipeline.Then(src.Stream(p), pipeline.NewStage("map", 4, func(ctx context.Context, m kafka.Message[int]) (kafka.Message[int], error) {
		if m.Value != 0 {
			return m, nil
		}
		return zero(ctx, m)
	}, opts...))
	pipeline.ToBatches(mapped, 40, kafka.NewTransactSink("out", src, outTopic, idCodec{}, nil), pipeline.WithLinger(10*time.Millisecond))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	t.Cleanup(cancel)
	errc := runAsync(rctx, p)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("source stats: %+v", src.Stats())
		}
	})
	eventually(t, 30*time.Second, "an aborted transaction, and both records taken again", func() bool {
		st := src.Stats()
		return aborted.Load() && st.Aborted == 1 && st.Fetched == 4
	})
	return &rewound{ctx: ctx, c: c, src: src, errc: errc}
}

// TestReplayOfARecordAStaleMessageProducedSettlesOnce: after a rewind, a message from
// before it (stale) and its record's replay are both in the pipeline; the stale one
// reaches the sink first and its transaction commits the record's output. The replay
// is then dead-lettered (or handed back, and dead-lettered when emitted again): the
// record must keep its one outcome, the output, and settle as done. (The replay was
// dead-lettered: the record had an output and a dead letter.)
func TestReplayOfARecordAStaleMessageProducedSettlesOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		replay error // the stage's error for the replay of record 0
	}{
		{name: "dead-lettered", replay: pipeline.Permanent(errors.New("refused"))},
		{name: "handed back", replay: pipeline.Transient(errors.New("busy"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			gate, outCommitted := make(chan struct{}), make(chan struct{})
			var calls atomic.Int64 // of record 0
			r := startRewound(t, "stale", func(ctx context.Context, m kafka.Message[int]) (kafka.Message[int], error) {
				switch calls.Add(1) {
				case 1: // its first message: held until its replay is in the pipeline
					return m, await(ctx, gate)
				case 2: // its replay: once the first one's output is committed
					if err := await(ctx, outCommitted); err != nil {
						return m, err
					}
					return m, tc.replay
				default: // emitted again
					return m, pipeline.Permanent(errors.New("refused again"))
				}
			}, pipeline.WithHandBack(), pipeline.WithRetry(1, pipeline.ConstantBackoff(20*time.Millisecond)),
				pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[kafka.Message[int]]))
			ctx, c, src := r.ctx, r.c, r.src
			close(gate)
			eventually(t, 30*time.Second, "record 0's output committed (its stale message's)", func() bool {
				return committedOffsets(ctx, t, c, "stale", inTopic)[0] == 1
			})
			close(outCommitted)
			eventually(t, 30*time.Second, "every message settled", func() bool {
				st := src.Stats()
				return st.Committed+st.DeadLettered == 4 // both stale messages, record 1's replay, record 0's replay
			})
			src.Stop()
			require.NoError(t, <-r.errc)
			st := src.Stats()
			assert.Zero(t, st.DeadLettered, "dead letters")
			assert.Empty(t, readTopic(ctx, t, c, deadTopic), "dead letters produced")
			assert.Equal(t, int64(2), calls.Load(), "record 0's messages: its replay is not emitted again")
			assert.Equal(t, map[int]int{0: 1, 1: 1}, countIDs(t, readCommitted(ctx, t, c, outTopic, 2)), "outputs read committed")
			assert.Equal(t, map[int32]int64{0: 1, 1: 1}, committedOffsets(ctx, t, c, "stale", inTopic))
		})
	}
}

// TestStaleMessageSetAsideProducesNoDeadLetter: after a rewind, record 0's message
// from before it (stale, held at a gate) and its replay are both in the pipeline. The
// replay goes first: its output is committed (or it is set aside, its dead letter
// produced and its offset committed). Then the stale message is set aside: the
// record already has its one outcome, so no dead letter of it may be produced, and
// the stale message settles as Stale. (Its dead letter was produced: the record had
// an output and a dead letter, or two dead letters.)
func TestStaleMessageSetAsideProducesNoDeadLetter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		replay  error // the stage's error for the replay of record 0
		dead    int   // dead letters wanted
		outputs map[int]int
	}{
		{name: "replay produced", outputs: map[int]int{0: 1, 1: 1}},
		{name: "replay set aside", replay: pipeline.Permanent(errors.New("refused")), dead: 1, outputs: map[int]int{1: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			gate := make(chan struct{})
			var calls atomic.Int64 // of record 0
			r := startRewound(t, "stale-dl", func(ctx context.Context, m kafka.Message[int]) (kafka.Message[int], error) {
				if calls.Add(1) == 1 { // its first message: held until the replay has its outcome, then set aside
					if err := await(ctx, gate); err != nil {
						return m, err
					}
					return m, pipeline.Permanent(errors.New("stale, refused"))
				}
				return m, tc.replay
			}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[kafka.Message[int]]))
			ctx, c, src := r.ctx, r.c, r.src
			eventually(t, 30*time.Second, "record 0's replay settled, its offset committed", func() bool {
				return committedOffsets(ctx, t, c, "stale-dl", inTopic)[0] == 1
			})
			close(gate)
			eventuallyReaches(t, 30*time.Second, "both stale messages settled", 2, func() int64 { return src.Stats().Stale })
			src.Stop()
			require.NoError(t, <-r.errc)
			st := src.Stats()
			assert.Equal(t, int64(tc.dead), st.DeadLettered, "dead-lettered")
			assert.Len(t, readTopic(ctx, t, c, deadTopic), tc.dead, "dead letters produced")
			assert.Equal(t, int64(2), calls.Load(), "record 0's messages")
			assert.Equal(t, tc.outputs, countIDs(t, readCommitted(ctx, t, c, outTopic, len(tc.outputs))), "outputs read committed")
			assert.Equal(t, map[int32]int64{0: 1, 1: 1}, committedOffsets(ctx, t, c, "stale-dl", inTopic))
		})
	}
}

// TestTeeBranchHandingBackAfterTheTransactionIsRedone tees a transactional source's
// messages to NewTransactSink and to a branch that hands record 0 back once the
// transaction has committed its output and offset: the record is emitted again, the
// branch does its work again, and the sink does not produce the record twice. (No
// message of an earlier assignment is in play: the output is the record's own, and
// the hand-back is not taken for a stale message's replay.)
func TestTeeBranchHandingBackAfterTheTransactionIsRedone(t *testing.T) {
	t.Parallel()
	ctx, c := clusterWithIDs(t, 1)
	src := kafka.NewSource(consumerOpts(c), "tee", []string{inTopic}, idCodec{},
		kafka.WithTransactionalID("member"), kafka.WithCommitInterval(50*time.Millisecond))
	p := pipeline.New()
	branches := pipeline.Tee(src.Stream(p), 2)
	pipeline.ToBatches(branches[0], 40, kafka.NewTransactSink("out", src, outTopic, idCodec{}, nil), pipeline.WithLinger(10*time.Millisecond))
	committed := make(chan struct{})
	var calls atomic.Int64
	pipeline.To(branches[1], pipeline.NewSink("other", 1, func(ctx context.Context, _ kafka.Message[int]) error {
		if calls.Add(1) > 1 {
			return nil
		}
		if err := await(ctx, committed); err != nil { // the first time: once the transaction committed the record's output
			return err
		}
		return pipeline.Transient(errors.New("busy"))
	}, pipeline.WithHandBack(), pipeline.WithRetry(1, pipeline.ConstantBackoff(20*time.Millisecond))))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errc := runAsync(rctx, p)
	eventuallyReaches(t, 30*time.Second, "the record taken", 1, func() int64 { return src.Stats().Fetched })
	eventuallyReaches(t, 30*time.Second, "the record's output committed", 1, func() int64 {
		return committedOffsets(ctx, t, c, "tee", inTopic)[0]
	})
	close(committed)
	eventuallyReaches(t, 30*time.Second, "the other branch's work redone", 2, func() int64 { return calls.Load() })
	eventuallyReaches(t, 30*time.Second, "the record settled", 1, func() int64 { return src.Stats().Committed })
	src.Stop()
	require.NoError(t, <-errc)
	st := src.Stats()
	assert.Equal(t, int64(1), st.HandedBack)
	assert.Equal(t, int64(2), calls.Load(), "the other branch's calls")
	assert.Equal(t, map[int]int{0: 1}, countIDs(t, readCommitted(ctx, t, c, outTopic, 1)), "outputs read committed")
}

// TestTeeBranchSettingAsideAfterARewindIsDeadLettered tees a transactional source's
// messages to NewTransactSink and to a branch that sets record 0 aside once its
// output and offset are committed and a later transaction (record 1's) has aborted:
// record 0's assignment has ended, but nobody reads the record again (the group's
// offset is past it), so its dead letter must still be produced. (A dead letter of an
// ended assignment is not produced when the record is redone, or has a stale
// message's output: neither is the case here.)
func TestTeeBranchSettingAsideAfterARewindIsDeadLettered(t *testing.T) {
	t.Parallel()
	ctx, c := clusterWithIDs(t, 2) // record 0 in partition 0, record 1 in partition 1
	aborted := failTxnOffsetCommitOf(c, 1)
	prod := newClient(t, c)
	src := kafka.NewSource(consumerOpts(c), "tee-dl", []string{inTopic}, idCodec{},
		kafka.WithTransactionalID("member"), kafka.WithCommitInterval(50*time.Millisecond),
		kafka.WithDeadLetterTopic(prod, deadTopic))
	one, zero := make(chan struct{}), make(chan struct{})
	p := pipeline.New()
	branches := pipeline.Tee(src.Stream(p), 2)
	held := pipeline.Then(branches[0], pipeline.NewStage("hold", 2, func(ctx context.Context, m kafka.Message[int]) (kafka.Message[int], error) {
		if m.Value == 1 { // record 1's output waits until record 0's is committed
			return m, await(ctx, one)
		}
		return m, nil
	}))
	pipeline.ToBatches(held, 40, kafka.NewTransactSink("out", src, outTopic, idCodec{}, nil), pipeline.WithLinger(10*time.Millisecond))
	pipeline.To(branches[1], pipeline.NewSink("other", 2, func(ctx context.Context, m kafka.Message[int]) error {
		if m.Value != 0 {
			return nil
		}
		if err := await(ctx, zero); err != nil {
			return err
		}
		return pipeline.Permanent(errors.New("refused"))
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[kafka.Message[int]])))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errc := runAsync(rctx, p)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("source stats: %+v", src.Stats())
		}
	})
	eventuallyReaches(t, 30*time.Second, "both records taken", 2, func() int64 { return src.Stats().Fetched })
	eventuallyReaches(t, 30*time.Second, "record 0's output committed", 1, func() int64 {
		return committedOffsets(ctx, t, c, "tee-dl", inTopic)[0]
	})
	close(one)
	eventually(t, 30*time.Second, "record 1's transaction aborted", func() bool {
		return aborted.Load() && src.Stats().Aborted == 1
	})
	close(zero)
	eventually(t, 30*time.Second, "both records' first messages settled, record 1 redone", func() bool {
		return src.Stats().Stale == 2 && committedOffsets(ctx, t, c, "tee-dl", inTopic)[1] == 1
	})
	src.Stop()
	require.NoError(t, <-errc)
	dead := readTopic(ctx, t, c, deadTopic)
	require.Len(t, dead, 1, "dead letters produced")
	assert.Equal(t, "0", header(dead[0], kafka.HeaderOffset))
	assert.Equal(t, "0", header(dead[0], kafka.HeaderPartition))
	assert.Equal(t, int64(1), src.Stats().DeadLettered)
	assert.Equal(t, map[int]int{0: 1, 1: 1}, countIDs(t, readCommitted(ctx, t, c, outTopic, 2)), "outputs read committed")
	assert.Equal(t, map[int32]int64{0: 1, 1: 1}, committedOffsets(ctx, t, c, "tee-dl", inTopic))
}
