package kafkapg_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline/internal/scenario"
	"github.com/gopipeline/pipeline/kafka"
	"github.com/gopipeline/pipeline/kafka/kafkapg"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// TestSinkResumesFromStoredOffsets writes 1,200 records, then 1,200 more with a group
// of another name (no committed offset: it would start at the log's start) and the
// same store: the second run starts from the offsets in PostgreSQL, and the table holds
// each record once. Without the claim's offsets it would hold the first 1,200 twice.
func TestSinkResumesFromStoredOffsets(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t)
	table := newTable(t, pool)
	store := kafkapg.NewOffsets(pool, uniqueName("resume"))
	c := newCluster(t)
	brokers := c.ListenAddrs()
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[row]())

	produceIDs(ctx, t, c, 0, 1200)
	m := startMember(ctx, t, brokers, "first", store, w)
	waitRows(t, pool, table, 1200, 30*time.Second)
	m.stop(t)
	st := m.src.Stats()
	assert.Equal(t, int64(partitions), st.Claimed, "partitions claimed")

	stored, err := store.Stored(ctx)
	require.NoError(t, err)
	want := map[kafka.TopicPartition]int64{}
	for i := range int32(partitions) {
		want[kafka.TopicPartition{Topic: inTopic, Partition: i}] = 100
	}
	assert.Equal(t, want, stored, "the offsets stored: 100 records a partition")

	produceIDs(ctx, t, c, 1200, 1200)
	m = startMember(ctx, t, brokers, "second", store, w)
	waitRows(t, pool, table, 2400, 30*time.Second)
	m.stop(t)
	rows, distinct := count(t, pool, table)
	assert.Equal(t, int64(2400), distinct)
	assert.Equal(t, int64(2400), rows, "each record once")
}

// gate blocks the rows' mapping of one writer at a row of the last partition, while
// armed, until released: a member paused in the middle of its transaction (its COPY
// under way). The last partition is one that a member joining a group of one takes
// over (kgo's cooperative-sticky balancer moves the upper half).
type gate struct {
	armed   atomic.Bool
	blocked chan struct{} // closed once a row waits
	release chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{blocked: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) mapping() pgpipe.Mapping[row] {
	return pgpipe.Func([]string{"id", "part", "off"}, func(r row) []any {
		if r.Part == partitions-1 && g.armed.Load() {
			g.once.Do(func() { close(g.blocked) })
			<-g.release
		}
		return []any{r.ID, r.Part, r.Off}
	})
}

// TestSinkFencesAPausedOwner pauses a member in the middle of a batch's transaction
// (its COPY waits), lets a second member join, take half the partitions over (its
// claims fence the first) and write their records from the offsets stored, then wakes
// the first: its transaction finds the moved partitions' epochs changed, rolls back,
// and is written again without their records. The table holds each record once;
// without the epoch in the transaction's UPDATE, the paused batch's records of the
// moved partitions would be there twice.
func TestSinkFencesAPausedOwner(t *testing.T) {
	ctx := t.Context()
	const n = 3600
	pool, table, store, brokers := rowsSetup(t, "fence", n)

	g := newGate()
	g.armed.Store(true)
	a := startMember(ctx, t, brokers, "fence", store, pgpipe.NewWriter(pool, table, g.mapping()))
	select {
	case <-g.blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the first member wrote no batch")
	}
	b := startMember(ctx, t, brokers, "fence", store, pgpipe.NewWriter(pool, table, pgpipe.Struct[row]()))
	scenario.Eventually(t, 10*time.Millisecond, 30*time.Second, "the second member wrote rows", func() bool {
		rows, _ := count(t, pool, table)
		return b.src.Stats().Claimed > 0 && rows > 0
	})
	g.armed.Store(false)
	close(g.release)
	waitRows(t, pool, table, n, 60*time.Second)
	a.stop(t)
	b.stop(t)
	rows, distinct := count(t, pool, table)
	assert.Equal(t, int64(n), distinct)
	assert.Equal(t, int64(n), rows, "each record once")
	assert.Positive(t, a.src.Stats().Fenced, "the first member found partitions fenced")
	t.Logf("first member: %+v", a.src.Stats().Counters())
}

// TestSinkWritesEachRecordOnceThroughRebalances runs members of one group that join
// and leave while records are in flight (four in all, at most three at once) over
// 12,000 records on 12 partitions: each record's row is in the table once.
func TestSinkWritesEachRecordOnceThroughRebalances(t *testing.T) {
	ctx := t.Context()
	const n = 12_000
	pool, table, store, brokers := rowsSetup(t, "rebalance", n)
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[row]())
	progress := func(at int64) {
		waitRows(t, pool, table, at, 60*time.Second)
	}
	m0 := startMember(ctx, t, brokers, "rebalance", store, w)
	progress(1000)
	m1 := startMember(ctx, t, brokers, "rebalance", store, w)
	progress(3000)
	m2 := startMember(ctx, t, brokers, "rebalance", store, w)
	progress(5000)
	m0.stop(t)
	progress(7000)
	m3 := startMember(ctx, t, brokers, "rebalance", store, w)
	progress(9000)
	m1.stop(t)
	waitRows(t, pool, table, n, 60*time.Second)
	var stale int64
	for _, m := range []*member{m2, m3} {
		m.stop(t)
	}
	for _, m := range []*member{m0, m1, m2, m3} {
		stale += m.src.Stats().Stale
	}
	rows, distinct := count(t, pool, table)
	assert.Equal(t, int64(n), distinct)
	assert.Equal(t, int64(n), rows, "each record once")
	t.Logf("stale (not written again) over the members: %d", stale)
}

// TestSinkSettlesCommitsCutOff ends the session of the first three COMMITs of the
// sink's transactions (a deferred trigger on the table terminates its own backend: a
// FATAL, whose outcome the client cannot know): the sink reads the offsets' rows back,
// finds the transactions did not commit, and writes the batches again. Each record
// once.
func TestSinkSettlesCommitsCutOff(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t)
	table := newTable(t, pool)
	seq, fn := table+"_kills", table+"_kill"
	for _, sql := range []string{
		"CREATE SEQUENCE " + seq,
		`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('` + seq + `') <= 3 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
			RETURN NULL;
		END $$`,
		"CREATE CONSTRAINT TRIGGER " + fn + " AFTER INSERT ON " + table + " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " + fn + "()",
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
		_, _ = pool.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+fn+"()")
		_, _ = pool.Exec(context.Background(), "DROP SEQUENCE IF EXISTS "+seq)
	})
	store := kafkapg.NewOffsets(pool, uniqueName("cutoff"))
	c := newCluster(t)
	produceIDs(ctx, t, c, 0, 1200)
	m := startMember(ctx, t, c.ListenAddrs(), "cutoff", store, pgpipe.NewWriter(pool, table, pgpipe.Struct[row]()))
	waitRows(t, pool, table, 1200, 30*time.Second)
	m.stop(t)
	var kills int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT last_value FROM "+seq).Scan(&kills))
	assert.GreaterOrEqual(t, kills, int64(3), "COMMITs cut off")
	rows, distinct := count(t, pool, table)
	assert.Equal(t, int64(1200), distinct)
	assert.Equal(t, int64(1200), rows, "each record once")
}
