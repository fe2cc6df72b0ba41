package kafkapg_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
	"github.com/gopipeline/pipeline/kafka"
	"github.com/gopipeline/pipeline/kafka/kafkapg"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

const (
	inTopic    = "in"
	partitions = 12
)

// newPool opens a pool on the test server, closed when the test ends.
func newPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), scenario.DatabaseURL(tb))
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

// uniqueName returns a name of its own for this test and process (a table, a store).
var uniqueName = scenario.UniqueName

// row is what the tests write: a record's id, partition and offset.
type row struct {
	ID   int64 `db:"id"`
	Part int32 `db:"part"`
	Off  int64 `db:"off"`
}

// newTable creates a table for rows, with no key: a row written twice shows.
func newTable(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	table := uniqueName("kafkapg_rows")
	_, err := pool.Exec(context.Background(), "CREATE TABLE "+table+" (id bigint NOT NULL, part integer NOT NULL, off bigint NOT NULL)")
	require.NoError(tb, err)
	tb.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	return table
}

// count returns count(*) and count(DISTINCT id) of table.
func count(tb testing.TB, pool *pgxpool.Pool, table string) (rows, distinct int64) {
	tb.Helper()
	err := pool.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT id) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&rows, &distinct)
	require.NoError(tb, err)
	return rows, distinct
}

// newCluster starts a kfake cluster in the process with the topic in (12 partitions),
// closed when the test ends.
func newCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, inTopic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// consumerOpts are a member's client options: short sessions and heartbeats, so that
// rebalances take a fraction of a second.
func consumerOpts(session time.Duration, brokers ...string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.SessionTimeout(session),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.FetchMaxPartitionBytes(1024), // a fetch spans every partition: batches mix them
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
	}
}

// produceIDs writes the records from ... from+n-1 to topic in: record i goes to
// partition i % partitions, its value i as 8 big-endian bytes.
func produceIDs(ctx context.Context, t *testing.T, c *kfake.Cluster, from, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(1024))
	require.NoError(t, err)
	defer cl.Close()
	recs := make([]*kgo.Record, 0, 1024)
	flush := func() {
		require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
		recs = recs[:0]
	}
	for i := from; i < from+n; i++ {
		recs = append(recs, &kgo.Record{Topic: inTopic, Partition: int32(i % partitions), Value: binary.BigEndian.AppendUint64(nil, uint64(i))})
		if len(recs) == cap(recs) {
			flush()
		}
	}
	flush()
}

// idCodec decodes produceIDs' values.
type idCodec = scenario.IDCodec[int64]

// member is one pipeline of a group: source, a stage keyed by partition, the sink.
type member struct {
	src  *kafka.Source[int64]
	p    *pipeline.Pipeline
	done chan error
}

// rowsSetup returns what a test of members writing rows needs: a pool, a new table of
// rows, a store of offsets (a job named after job) and the brokers of a new cluster
// whose input topic holds the records 0 ... n-1.
func rowsSetup(t *testing.T, job string, n int) (*pgxpool.Pool, string, *kafkapg.Offsets, []string) {
	t.Helper()
	pool := newPool(t)
	c := newCluster(t)
	produceIDs(t.Context(), t, c, 0, n)
	return pool, newTable(t, pool), kafkapg.NewOffsets(pool, uniqueName(job)), c.ListenAddrs()
}

// startMember runs a member of group that writes every record into table with w
// (nil: a plain writer), its offsets in store.
func startMember(ctx context.Context, t *testing.T, brokers []string, group string, store *kafkapg.Offsets, w *pgpipe.Writer[row], opts ...kafka.SourceOption) *member {
	t.Helper()
	m := newMember(brokers, group, store, w, 2*time.Second, opts...)
	go func() { m.done <- m.p.Run(ctx) }()
	return m
}

func newMember(brokers []string, group string, store *kafkapg.Offsets, w *pgpipe.Writer[row], session time.Duration, opts ...kafka.SourceOption) *member {
	opts = append([]kafka.SourceOption{
		kafka.WithOffsetStore(store), kafka.WithCommitInterval(100 * time.Millisecond),
		kafka.WithRevokeTimeout(200 * time.Millisecond), kafka.WithMaxPending(300),
	}, opts...)
	src := kafka.NewSource(consumerOpts(session, brokers...), group, []string{inTopic}, idCodec{}, opts...)
	p := pipeline.New()
	keyed := pipeline.Then(src.Stream(p), pipeline.NewStage("map", 4, func(_ context.Context, m kafka.Message[int64]) (kafka.Message[row], error) {
		return kafka.Message[row]{
			Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
			Value: row{ID: m.Value, Part: m.Partition, Off: m.Offset},
		}, nil
	}, pipeline.WithKey(kafka.Message[int64].TopicPartition)))
	pipeline.ToBatches(keyed, 50, kafkapg.NewSink("pg", src, w), pipeline.WithLinger(10*time.Millisecond))
	return &member{src: src, p: p, done: make(chan error, 1)}
}

// stop stops m gracefully and waits for its run.
func (m *member) stop(t *testing.T) {
	t.Helper()
	m.src.Stop()
	select {
	case err := <-m.done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("a member did not stop")
	}
}

// waitRows waits until table holds want distinct ids.
func waitRows(t *testing.T, pool *pgxpool.Pool, table string, want int64, limit time.Duration) {
	t.Helper()
	scenario.Eventually(t, 20*time.Millisecond, limit, fmt.Sprintf("%d ids in %s", want, table), func() bool {
		_, d := count(t, pool, table)
		return d >= want
	})
}
