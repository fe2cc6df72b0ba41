package kafkapg_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"

	"github.com/gopipeline/pipeline/internal/scenario"
	"github.com/gopipeline/pipeline/kafka"
	"github.com/gopipeline/pipeline/kafka/kafkapg"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// The kill test's child processes get the seed brokers (childEnv), the store's name
// and the table (childStoreEnv, childTableEnv); DATABASE_URL is inherited.
const (
	childEnv      = "KAFKAPG_KILL_CHILD_BROKERS"
	childStoreEnv = "KAFKAPG_KILL_CHILD_STORE"
	childTableEnv = "KAFKAPG_KILL_CHILD_TABLE"
	// fullEnv set to 1 makes the kill test the full-size one: 300,000 records, 30 kills.
	fullEnv   = "KAFKAPG_KILL_FULL"
	killGroup = "killed"
)

// runChild is a member process of TestSIGKILLedMembersWriteEachRecordOnce: the
// pipeline of newMember, with one-second sessions (a killed member's partitions move
// a second later), until its standard input closes; the test SIGKILLs it before that,
// most times.
func runChild() int {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	store := kafkapg.NewOffsets(pool, os.Getenv(childStoreEnv))
	w := pgpipe.NewWriter(pool, os.Getenv(childTableEnv), pgpipe.Struct[row]())
	m := newMember(strings.Split(os.Getenv(childEnv), ","), killGroup, store, w, time.Second, kafka.WithRequestTimeout(5*time.Second))
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		m.src.Stop()
	}()
	if err := m.p.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// killRuns counts the runs of the kill test in this process.
var killRuns atomic.Int64

// startChild starts a member process of the kill test.
func startChild(t *testing.T, brokers, store, table string) *scenario.Child {
	t.Helper()
	return scenario.StartChild(t, nil, childEnv+"="+brokers, childStoreEnv+"="+store, childTableEnv+"="+table)
}

// TestSIGKILLedMembersWriteEachRecordOnce runs three member processes of one group
// (the test binary again) that write 12 partitions' records into PostgreSQL with
// NewSink, while the test produces them in chunks and, after each chunk is half
// written, SIGKILLs one member (its transaction cut off anywhere: before, in or after
// COMMIT) and starts it again; a fourth member joins for a while and leaves, to force
// more rebalances. The table then holds each record once, counted from the rows. In
// CI: 30,000 records and 15 kills the first time in the process (about 30 s under the
// race detector on a shared 2-vCPU machine), 1,500 and 1 when -count or -cpu repeats it;
// with KAFKAPG_KILL_FULL=1, 300,000 and 30.
func TestSIGKILLedMembersWriteEachRecordOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills processes")
	}
	n, kills := 30_000, 15
	switch {
	case os.Getenv(fullEnv) == "1":
		n, kills = 300_000, 30
	case killRuns.Add(1) > 1: // -count or -cpu repeats it: a smaller one
		n, kills = 1_500, 1
	}
	ctx := t.Context()
	pool := newPool(t)
	table := newTable(t, pool)
	storeName := uniqueName("killed")
	c := newCluster(t)
	brokers := strings.Join(c.ListenAddrs(), ",")
	start := time.Now()
	chunk := n / (kills + 1)
	produced := 0
	produce := func(k int) {
		produceIDs(ctx, t, c, produced, k)
		produced += k
	}
	children := []*scenario.Child{startChild(t, brokers, storeName, table), startChild(t, brokers, storeName, table), startChild(t, brokers, storeName, table)}
	var extra *scenario.Child
	for k := range kills {
		produce(chunk)
		waitRows(t, pool, table, int64(produced-chunk/2), 2*time.Minute)
		i := k % len(children)
		children[i].Kill(t)
		children[i] = startChild(t, brokers, storeName, table)
		switch k {
		case kills / 3: // a member joins
			extra = startChild(t, brokers, storeName, table)
		case 2 * kills / 3: // and leaves
			extra.Stop(t)
			extra = nil
		}
	}
	if extra != nil { // a short run: it leaves now
		extra.Stop(t)
	}
	produce(n - produced)
	waitRows(t, pool, table, int64(n), 2*time.Minute)
	for _, ch := range children {
		ch.Stop(t)
	}
	rows, distinct := count(t, pool, table)
	assert.Equal(t, int64(n), distinct, "every record")
	assert.Equal(t, int64(n), rows, "each record once")
	t.Logf("%d records, %d kills, 4 members joining and leaving: %d rows, %d ids, in %v", n, kills, rows, distinct, time.Since(start).Round(time.Second))
}
