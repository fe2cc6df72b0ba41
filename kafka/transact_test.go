package kafka_test

import (
	"context"
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
	for _, m := range members {
		require.NoError(t, <-m.errc)
	}
	return readCommitted(ctx, t, c, outTopic, n)
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
	recs := settleTxnMembers(ctx, t, c, "eos", members, n)
	dups := reportDuplicates(t, recs)
	seen := countIDs(t, recs)
	require.Len(t, seen, n, "every record's output")
	require.Zero(t, dups, "duplicates read committed")
	t.Logf("crashed a: %+v", crashed)
	for i, m := range members {
		t.Logf("member %d: %+v", i, m.src.Stats())
	}
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
	recs := settleTxnMembers(ctx, t, c, "revokes", members, n)
	require.Zero(t, reportDuplicates(t, recs), "duplicates read committed")
	require.Len(t, countIDs(t, recs), n, "every record's output")
	for i, m := range members {
		t.Logf("member %d: %+v", i, m.src.Stats())
	}
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
	seen := map[int]bool{}
	for _, r := range recs {
		id := idOf(t, r)
		seen[id] = true
	}
	require.Len(t, seen, n, "every record's output")
	require.Zero(t, dups, "duplicates read committed")
}
