package kafka_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
	"github.com/gopipeline/pipeline/kafka"
)

// The kill test's child processes: killChildEnv holds the seed brokers, killIDEnv the
// member's name (its transactional id, in the transactional mode), killModeEnv its
// sink: killTransact (NewTransactSink) or killProduce (NewSink, the plain producing
// sink).
const (
	killChildEnv = "KAFKA_KILL_CHILD_BROKERS"
	killIDEnv    = "KAFKA_KILL_CHILD_ID"
	killModeEnv  = "KAFKA_KILL_CHILD_MODE"
	killGroup    = "killed"
	killTransact = "transact"
	killProduce  = "produce"
)

// killFails tells the records the kill test's members fail permanently (about one in
// a hundred): their dead letters go to the dead-letter topic, and no output.
func killFails(id int) bool { return id%97 == 13 }

var errInjected = errors.New("injected permanent failure")

// messageCodec encodes a message as its value's id (for NewSink, whose items are the
// messages themselves); it decodes nothing.
type messageCodec struct{}

func (messageCodec) Marshal(m kafka.Message[int]) ([]byte, error) { return valueOf(m.Value), nil }

func (messageCodec) Unmarshal([]byte, *kafka.Message[int]) error {
	return errors.New("messageCodec only encodes")
}

// runKillChild is a member process of TestSIGKILLedMembersOutputEveryRecord: the
// source, a stage keyed by partition that fails the killFails records permanently
// (dead-lettered to the dead-letter topic), and batches into the sink of its mode,
// against the cluster at killChildEnv. It prints "ready" once it committed a few
// transactions (or offset commits, with the plain sink), and stops (gracefully) when
// its standard input closes; the test kills it with SIGKILL before that, most times.
func runKillChild() int {
	brokers := strings.Split(os.Getenv(killChildEnv), ",")
	id, mode := os.Getenv(killIDEnv), os.Getenv(killModeEnv)
	opts := []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...)) // dead letters, and the plain sink's output
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer prod.Close()
	srcOpts := []kafka.SourceOption{
		kafka.WithCommitInterval(50 * time.Millisecond), kafka.WithMaxPending(300),
		kafka.WithDeadLetterTopic(prod, deadTopic),
	}
	if mode == killTransact {
		srcOpts = append(srcOpts, kafka.WithTransactionalID(id))
	}
	src := kafka.NewSource(opts, killGroup, []string{inTopic}, idCodec{}, srcOpts...)
	p := pipeline.New()
	checked := pipeline.Then(src.Stream(p), pipeline.NewStage("check", 4, func(_ context.Context, m kafka.Message[int]) (kafka.Message[int], error) {
		if killFails(m.Value) {
			return m, pipeline.Permanent(errInjected)
		}
		return m, nil
	}, pipeline.WithKey(kafka.Message[int].TopicPartition), pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[kafka.Message[int]])))
	ready := func() bool { return src.Stats().Transactions >= 3 }
	if mode == killTransact {
		pipeline.ToBatches(checked, 40, kafka.NewTransactSink("out", src, outTopic, idCodec{}, originHeaders(id)), pipeline.WithLinger(10*time.Millisecond))
	} else {
		pipeline.ToBatches(checked, 40, kafka.NewSink("out", 2, prod, outTopic, messageCodec{}, originHeaders(id)), pipeline.WithLinger(10*time.Millisecond))
		ready = func() bool { return src.Stats().Commits >= 3 }
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		src.Stop()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if ready() {
					fmt.Println("ready")
					return
				}
			}
		}
	}()
	if err := p.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// killRuns counts the runs of the kill test in this process.
var killRuns atomic.Int64

// killChild is a member process of the kill test.
type killChild struct {
	*scenario.Child
	ready chan error // gets nil once the child said ready, or why it did not
}

func startKillChild(t *testing.T, brokers, mode, id string) *killChild {
	t.Helper()
	ready := make(chan error, 1)
	c := scenario.StartChild(t, func(out io.Reader) {
		r := bufio.NewReader(out)
		line, err := r.ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("child %s said %q", id, line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, r)
	}, killChildEnv+"="+brokers, killIDEnv+"="+id, killModeEnv+"="+mode)
	return &killChild{Child: c, ready: ready}
}

// TestSIGKILLedMembersOutputEveryRecord runs three member processes of one group,
// consuming 12 partitions into an output topic, and SIGKILLs one of them again and
// again once it has committed a few times (an open transaction left behind, its
// session left to expire), restarting it under the same name (its transactional id,
// which fences what it left open); meanwhile a fourth member joins and leaves
// (gracefully) every few kills, forcing more rebalances. About one record in a hundred
// fails permanently in a stage (killFails) and is dead-lettered to the dead-letter
// topic. Counted from the topics themselves, for each sink:
//   - transact (NewTransactSink): a read-committed consumer of the output finds each
//     record's output exactly once;
//   - produce (NewSink): at least once: every record's output present, the duplicates
//     counted and logged;
//   - either way, the dead-letter topic holds exactly the failed records (each at
//     least once: a member killed after its dead letter's produce and before its
//     offset's commit has it produced again), with their headers, and no output.
//
// At least 20,000 records (more are produced while the test waits for a restarted
// member to commit, so that it has records to commit) and 8 kills per sink, some 20 s
// each under the race detector on a shared 2-vCPU machine; KAFKA_KILL_RECORDS and
// KAFKA_KILL_KILLS set other sizes (the issue's: 300000 and 15).
//
// It runs once per test process: the repeats of -count and -cpu skip it. -cpu does not
// reach the member processes (each runs with the default GOMAXPROCS, whatever the
// parent's), and a repeat only draws other kill moments, at some 10 s each: CI's
// -count=3 -cpu=1,4 would run it six times. To draw more kill moments, run more
// processes: for i in $(seq 10); do go test -race -run SIGKILLed; done.
func TestSIGKILLedMembersOutputEveryRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills processes")
	}
	if killRuns.Add(1) > 1 {
		t.Skip("runs once per test process (see the doc comment): this is a repeat of -count or -cpu")
	}
	records, kills := envInt(t, "KAFKA_KILL_RECORDS", 20_000), envInt(t, "KAFKA_KILL_KILLS", 8)
	for _, mode := range []string{killTransact, killProduce} {
		t.Run(mode, func(t *testing.T) { testKills(t, mode, records, kills) })
	}
}

// envInt returns the environment's positive integer name, or def if it is not set.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, name)
	require.Positive(t, n, name)
	return n
}

func testKills(t *testing.T, mode string, records, kills int) {
	const trickle = 240
	n := records / 2 // at least records in the end: the trickle adds more, the rest comes after the kills
	ctx := t.Context()
	c := newCluster(t)
	stablePerPartition(c)
	producer := newIDProducer(t, c)
	produceIDsWith(ctx, t, producer, inTopic, 0, n)
	brokers := strings.Join(c.ListenAddrs(), ",")
	ids := []string{"m0", "m1", "m2"}
	children := make([]*killChild, len(ids))
	for i, id := range ids {
		children[i] = startKillChild(t, brokers, mode, id)
	}
	var extra *killChild // the member that joins and leaves
	joins := 0
	for k := range kills {
		i := k % len(ids)
		switch {
		case k%3 == 1 && extra == nil:
			extra = startKillChild(t, brokers, mode, "x"+strconv.Itoa(k))
			joins++
		case k%3 == 0 && extra != nil:
			extra.Stop(t)
			extra = nil
		}
		// A member is ready once it committed a few times, so it needs records of its
		// partitions: while the test waits, it produces more (trickle on every
		// partition each 100 ms). With all the records produced up front, a member
		// restarted late found none left and never got ready ("member m1 not ready"
		// on a loaded machine).
		tick := time.NewTicker(100 * time.Millisecond)
		limit := time.NewTimer(3 * time.Minute)
	wait:
		for {
			select {
			case err := <-children[i].ready:
				require.NoError(t, err)
				break wait
			case <-tick.C:
				produceIDsWith(ctx, t, producer, inTopic, n, trickle)
				n += trickle
			case <-limit.C:
				t.Fatalf("member %s not ready after 3 minutes", ids[i])
			}
		}
		tick.Stop()
		limit.Stop()
		children[i].Kill(t)
		children[i] = startKillChild(t, brokers, mode, ids[i])
	}
	if extra != nil {
		children = append(children, extra)
	}
	if n < records {
		produceIDsWith(ctx, t, producer, inTopic, n, records-n)
		n = records
	}
	ends := endOffsets(ctx, t, c, inTopic)
	eventually(t, 3*time.Minute, "every input offset committed", func() bool {
		return assert.ObjectsAreEqual(ends, committedOffsets(ctx, t, c, killGroup, inTopic))
	})
	for _, ch := range children {
		ch.Stop(t)
	}
	failed := 0
	for id := range n {
		if killFails(id) {
			failed++
		}
	}
	var recs []*kgo.Record
	if mode == killTransact {
		recs = readCommitted(ctx, t, c, outTopic, n-failed)
	} else {
		recs = readTopic(ctx, t, c, outTopic)
	}
	out := map[int]int{}
	for _, r := range recs {
		id := idOf(t, r)
		require.False(t, killFails(id), "record %d failed, and has an output", id)
		out[id]++
	}
	dups := len(recs) - len(out)
	if mode == killTransact && dups > 0 {
		reportDuplicates(t, recs)
	}
	dead := map[int]int{}
	for _, r := range readTopic(ctx, t, c, deadTopic) {
		id := idOf(t, r)
		require.True(t, killFails(id), "record %d has a dead letter, and did not fail", id)
		require.Equal(t, "check", header(r, kafka.HeaderStage), "the dead letter of %d", id)
		require.Equal(t, errInjected.Error(), header(r, kafka.HeaderError), "the dead letter of %d", id)
		require.Equal(t, inTopic, header(r, kafka.HeaderTopic), "the dead letter of %d", id)
		require.Equal(t, itoa32(int32(id%partitions)), header(r, kafka.HeaderPartition), "the dead letter of %d", id)
		require.Equal(t, "k"+strconv.Itoa(id), string(r.Key), "the dead letter of %d", id)
		dead[id]++
	}
	deadRepeats := 0
	for _, k := range dead {
		deadRepeats += k - 1
	}
	t.Logf("%s: %d records, %d kills, %d joins: %d outputs (%d duplicates), %d failed: %d dead letters (%d repeated)",
		mode, n, kills, joins, len(recs), dups, failed, len(dead)+deadRepeats, deadRepeats)
	require.Len(t, out, n-failed, "every record's output")
	require.Len(t, dead, failed, "every failed record's dead letter")
	if mode == killTransact {
		// One run in four once read a record's output twice here: a stale message
		// produced past an earlier record's replay (see
		// TestTransactSinkOutputsEachRecordOnceAcrossRepeatedCrashes).
		require.Zero(t, dups, "duplicates read committed")
	}
}
