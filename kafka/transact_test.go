package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

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

func startTxnMember(ctx context.Context, c *kfake.Cluster, group, id string) *txnMember {
	src := kafka.NewSource(consumerOpts(c), group, []string{inTopic}, idCodec{},
		kafka.WithTransactionalID(id), kafka.WithCommitInterval(50*time.Millisecond), kafka.WithMaxPending(300))
	p := pipeline.New()
	keyed := pipeline.Then(src.Stream(p), pipeline.NewStage("map", 4, func(_ context.Context, m kafka.Message[int]) (kafka.Message[int], error) {
		return m, nil // the output keeps its input's origin (Topic, Partition, Offset)
	}, pipeline.WithKey(kafka.Message[int].TopicPartition)))
	pipeline.ToBatches(keyed, 40, kafka.NewTransactSink("out", src, outTopic, idCodec{}, nil), pipeline.WithLinger(10*time.Millisecond))
	return &txnMember{src: src, errc: runAsync(ctx, p)}
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

// TestTransactSinkOutputsEachRecordOnceAcrossCrashAndRebalances runs two members of a
// group that consume, map and produce through NewTransactSink: one crashes in the
// middle of a transaction (its records produced, nothing committed), a third member
// joins, and the crashed one comes back under its transactional id (fencing its open
// transaction). A read-committed consumer of the output finds every input record's
// output exactly once, and the group's offsets at the input's end.
func TestTransactSinkOutputsEachRecordOnceAcrossCrashAndRebalances(t *testing.T) {
	t.Parallel()
	const n = 6000
	ctx := t.Context()
	c := newCluster(t)
	produceIDs(ctx, t, c, inTopic, n)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	a := startTxnMember(rctx, c, "eos", "member-a")
	b := startTxnMember(rctx, c, "eos", "member-b")
	eventually(t, 60*time.Second, "transactions on both members", func() bool {
		return a.src.Stats().Transactions > 3 && b.src.Stats().Transactions > 3
	})
	kafka.Crash(a.src)
	require.ErrorIs(t, <-a.errc, kafka.ErrCrashed)
	crashed := a.src.Stats()
	cm := startTxnMember(rctx, c, "eos", "member-c")
	a2 := startTxnMember(rctx, c, "eos", "member-a") // fences a's open transaction
	ends := endOffsets(ctx, t, c, inTopic)
	eventually(t, 90*time.Second, "every input offset committed", func() bool {
		return assert.ObjectsAreEqual(ends, committedOffsets(ctx, t, c, "eos", inTopic))
	})
	members := []*txnMember{b, cm, a2}
	for _, m := range members {
		m.src.Stop()
	}
	for _, m := range members {
		require.NoError(t, <-m.errc)
	}

	seen := map[int]int{}
	for _, r := range readCommitted(ctx, t, c, outTopic, n) {
		var id int
		require.NoError(t, idCodec{}.Unmarshal(r.Value, &id))
		seen[id]++
	}
	require.Len(t, seen, n, "every record's output")
	for id, k := range seen {
		require.Equal(t, 1, k, "the output of record %d, read committed", id)
	}
	t.Logf("crashed a: %+v", crashed)
	for i, m := range members {
		t.Logf("member %d: %+v", i, m.src.Stats())
	}
}
