package kafka_test

import (
	"context"
	"encoding/binary"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gopipeline/pipeline/internal/scenario"
)

const (
	inTopic    = "in"
	outTopic   = "out"
	deadTopic  = "dead"
	partitions = 12
)

// newCluster starts a kfake cluster in the process with the topics in (12 partitions),
// out (3) and dead (1), closed when the test ends. Sessions may be as short as 100 ms.
func newCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, inTopic),
		kfake.SeedTopics(3, outTopic),
		kfake.SeedTopics(1, deadTopic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
	)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// clusterWithIDs starts a cluster (newCluster) whose topic in holds the records
// 0 ... n-1 (produceIDs), and returns it with the test's context.
func clusterWithIDs(t *testing.T, n int) (context.Context, *kfake.Cluster) {
	t.Helper()
	c := newCluster(t)
	produceIDs(t.Context(), t, c, inTopic, n)
	return t.Context(), c
}

// runAsync runs p in a goroutine; the channel gives its error.
var runAsync = scenario.Start

// await waits until ch is closed (nil) or ctx is done (its error).
var await = scenario.Await

// consumerOpts are the client options of a test's consumer: frequent heartbeats, so
// that rebalances take a fraction of a second. The session outlasts a stalled process:
// only a member that stops heartbeating without leaving waits for it, and none of the
// tests using these options has one. (With 3 s, loaded runs saw members lose their
// partitions, the broker and clients in one process stalled for longer than that.)
func consumerOpts(c *kfake.Cluster) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.SessionTimeout(10 * time.Second),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
	}
}

// newClient returns a plain client of c (a producer, an admin), closed when the test ends.
func newClient(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl := openClient(t, c, opts...)
	t.Cleanup(cl.Close)
	return cl
}

// openClient returns a plain client of c, for the caller to close: a helper that a
// test polls (committedOffsets every 10 ms) must not leave a client per call running
// until the test ends (thousands of them, each with its metadata loop, were seen
// during a minute's wait).
func openClient(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, opts...)...)
	require.NoError(t, err)
	return cl
}

// produceIDs writes the records 0 ... n-1 to topic: record i goes to partition
// i % partitions, with key "k<i>" and value i as 8 big-endian bytes (valueOf).
func produceIDs(ctx context.Context, t *testing.T, c *kfake.Cluster, topic string, n int) {
	t.Helper()
	produceIDsWith(ctx, t, newIDProducer(t, c), topic, 0, n)
}

// newIDProducer returns the producer of produceIDs, closed when the test ends. Its
// record batches are small (about 20 records each): a fetch of at most 1 KiB per
// partition then spans every partition.
func newIDProducer(t *testing.T, c *kfake.Cluster) *kgo.Client {
	t.Helper()
	return newClient(t, c, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(1024))
}

// produceIDsWith writes the records of produceIDs from ... from+n-1 with cl (a
// newIDProducer).
func produceIDsWith(ctx context.Context, t *testing.T, cl *kgo.Client, topic string, from, n int) {
	t.Helper()
	recs := make([]*kgo.Record, 0, 512)
	flush := func() {
		require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
		recs = recs[:0]
	}
	for i := from; i < from+n; i++ {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Key: []byte("k" + strconv.Itoa(i)), Value: valueOf(i)})
		if len(recs) == cap(recs) {
			flush()
		}
	}
	flush()
}

func valueOf(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)) }

// idCodec decodes valueOf's format; any other length is an error (errNotAnID).
type idCodec = scenario.IDCodec[int]

var errNotAnID = scenario.ErrNotAnID

// idOf decodes r's value (idCodec).
func idOf(t *testing.T, r *kgo.Record) int {
	t.Helper()
	var id int
	require.NoError(t, idCodec{}.Unmarshal(r.Value, &id))
	return id
}

// countIDs counts the records of each id (idOf).
func countIDs(t *testing.T, recs []*kgo.Record) map[int]int {
	t.Helper()
	seen := map[int]int{}
	for _, r := range recs {
		seen[idOf(t, r)]++
	}
	return seen
}

// readTopic returns every record of topic, reading until each partition's end.
func readTopic(ctx context.Context, t *testing.T, c *kfake.Cluster, topic string) []*kgo.Record {
	t.Helper()
	want := int64(0)
	for _, end := range endOffsets(ctx, t, c, topic) {
		want += end
	}
	cl := newClient(t, c, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	var recs []*kgo.Record
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for int64(len(recs)) < want {
		fs := cl.PollFetches(rctx)
		require.NoError(t, rctx.Err(), "read %d of %d records of %s", len(recs), want, topic)
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	return recs
}

// committedOffsets returns the group's committed offset of each partition of topic
// (missing: none committed).
func committedOffsets(ctx context.Context, t *testing.T, c *kfake.Cluster, group, topic string) map[int32]int64 {
	t.Helper()
	return adminOffsets(t, c, func(adm *kadm.Client) (map[int32]int64, error) {
		offs, err := adm.FetchOffsets(ctx, group)
		got := map[int32]int64{}
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Topic == topic && o.Err == nil && o.At >= 0 {
				got[o.Partition] = o.At
			}
		})
		return got, err
	})
}

// endOffsets returns the end offset of each partition of topic.
func endOffsets(ctx context.Context, t *testing.T, c *kfake.Cluster, topic string) map[int32]int64 {
	t.Helper()
	return adminOffsets(t, c, func(adm *kadm.Client) (map[int32]int64, error) {
		ends, err := adm.ListEndOffsets(ctx, topic)
		got := map[int32]int64{}
		ends.Each(func(o kadm.ListedOffset) { got[o.Partition] = o.Offset })
		return got, err
	})
}

// adminOffsets returns the offsets by partition that read gets through an admin client
// of c, which it closes before it returns (see openClient: tests poll these).
func adminOffsets(t *testing.T, c *kfake.Cluster, read func(*kadm.Client) (map[int32]int64, error)) map[int32]int64 {
	t.Helper()
	cl := openClient(t, c)
	defer cl.Close()
	got, err := read(kadm.NewClient(cl))
	require.NoError(t, err)
	return got
}

// eventually polls cond every 10 ms for at most limit.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	scenario.Eventually(t, 10*time.Millisecond, limit, what, cond)
}

// eventuallyReaches polls count every 10 ms, for at most limit, until it reaches want,
// and then requires it to be want: a count that goes past want fails at once with its
// value, not at the limit as a wait for equality would.
func eventuallyReaches(t *testing.T, limit time.Duration, what string, want int64, count func() int64) {
	t.Helper()
	eventually(t, limit, what, func() bool { return count() >= want })
	require.Equal(t, want, count(), what)
}

func itoa32(i int32) string { return strconv.FormatInt(int64(i), 10) }

func itoa64(i int64) string { return strconv.FormatInt(i, 10) }

// stablePerPartition makes c answer a group's offset fetches as Kafka does (KIP-447):
// UNSTABLE_OFFSET_COMMIT only for the partitions that an open transaction holds
// offsets of. kfake answers it for every partition of the group while any
// transaction holds offsets of any of them, so with several transactional members
// a newly assigned partition waits for a moment when no member is between its
// TxnOffsetCommit and its EndTxn; the client retries each second, and under load a
// retry can keep landing in another member's transaction (seen once in CI: a member
// waited a minute). A fetch that asks for no partition held by an open transaction is
// passed on without RequireStable. A transaction is open from its TxnOffsetCommit
// until its EndTxn, or until its transactional id is initialised again (which aborts
// it); one kfake aborts on its own timeout stays held here, which only leaves kfake's
// own answer in place. Partitions are told apart by number only (newer requests name
// topics by ID), which can only leave more of kfake's answers in place. Tests whose
// EndTxn may be dropped must not use it.
func stablePerPartition(c *kfake.Cluster) {
	type txn struct {
		pid   int64
		epoch int16
		parts map[string]map[int32]bool // group → partitions (of any topic: newer versions name topics by ID only)
	}
	var mu sync.Mutex
	open := map[string]*txn{} // by transactional id
	observe := func(key kmsg.Key, fn func(kmsg.Request)) {
		c.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			mu.Lock()
			defer mu.Unlock()
			fn(req)
			return nil, nil, false
		})
	}
	observe(kmsg.InitProducerID, func(req kmsg.Request) {
		if id := req.(*kmsg.InitProducerIDRequest).TransactionalID; id != nil {
			delete(open, *id)
		}
	})
	observe(kmsg.TxnOffsetCommit, func(req kmsg.Request) {
		r := req.(*kmsg.TxnOffsetCommitRequest)
		x := open[r.TransactionalID]
		if x == nil || x.pid != r.ProducerID || x.epoch != r.ProducerEpoch {
			x = &txn{pid: r.ProducerID, epoch: r.ProducerEpoch, parts: map[string]map[int32]bool{}}
			open[r.TransactionalID] = x
		}
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				if x.parts[r.Group] == nil {
					x.parts[r.Group] = map[int32]bool{}
				}
				x.parts[r.Group][p.Partition] = true
			}
		}
	})
	observe(kmsg.EndTxn, func(req kmsg.Request) {
		r := req.(*kmsg.EndTxnRequest)
		if x := open[r.TransactionalID]; x != nil && x.pid == r.ProducerID && x.epoch == r.ProducerEpoch {
			delete(open, r.TransactionalID)
		}
	})
	observe(kmsg.OffsetFetch, func(req kmsg.Request) {
		r := req.(*kmsg.OffsetFetchRequest)
		if !r.RequireStable {
			return
		}
		for _, g := range r.Groups {
			if g.Topics == nil {
				return // every partition of the group: leave it to kfake
			}
			for _, t := range g.Topics {
				for _, x := range open {
					for _, p := range t.Partitions {
						if x.parts[g.Group][p] {
							return
						}
					}
				}
			}
		}
		r.RequireStable = false
	})
}
