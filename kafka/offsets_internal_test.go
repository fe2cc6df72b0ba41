package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
)

// TestWatermarkFollowsFirstUnsettled settles the records of a partition (offsets with
// a gap, as compaction or transaction markers leave) in several orders: the watermark
// is always one past the settled prefix, and a record waiting to be retried holds it.
func TestWatermarkFollowsFirstUnsettled(t *testing.T) {
	t.Parallel()
	offsets := []int64{10, 11, 12, 15, 16}
	type step struct {
		i     int   // which record
		retry bool  // handed back instead of settled
		mark  int64 // the watermark after the step, -1 for none yet
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "in order", steps: []step{{0, false, 11}, {1, false, 12}, {2, false, 13}, {3, false, 16}, {4, false, 17}}},
		{name: "reversed", steps: []step{{4, false, -1}, {3, false, -1}, {2, false, -1}, {1, false, -1}, {0, false, 17}}},
		{name: "gap filled last", steps: []step{{0, false, 11}, {3, false, 11}, {4, false, 11}, {2, false, 11}, {1, false, 17}}},
		{
			name:  "a retry holds the watermark",
			steps: []step{{1, true, -1}, {0, false, 11}, {2, false, 11}, {3, false, 11}, {4, false, 11}, {1, false, 17}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPart(TopicPartition{"t", 0})
			es := make([]*entry, len(offsets))
			for i, o := range offsets {
				es[i] = p.add(&kgo.Record{Offset: o, LeaderEpoch: 3})
			}
			require.Equal(t, len(offsets), p.busy)
			for k, s := range tc.steps {
				if s.retry {
					p.toRetry(es[s.i])
				} else {
					p.retried(es[s.i]) // no-op unless it waits for a retry
					p.settle(es[s.i])
				}
				if s.mark < 0 {
					assert.False(t, p.due(), "step %d: a watermark before the first record settled", k)
					continue
				}
				require.True(t, p.due(), "step %d", k)
				assert.Equal(t, kgo.EpochOffset{Epoch: 3, Offset: s.mark}, p.mark, "step %d", k)
			}
			assert.Empty(t, p.pending)
			assert.Zero(t, p.busy)
		})
	}
}

// TestReassignedPartitionStartsWithoutWatermark loses a partition with records in
// flight and gets it assigned back: the new assignment commits nothing until one of
// its own records settles (the client starts it from the group's committed offset),
// and the old records' late settlements are stale, not counted in it.
func TestReassignedPartitionStartsWithoutWatermark(t *testing.T) {
	t.Parallel()
	ss := &session[int]{s: &Source[int]{cfg: sourceConfig{maxPending: 1000}}, parts: map[TopicPartition]*part{}, changed: make(chan struct{})}
	tp := TopicPartition{"t", 4}
	assign := map[string][]int32{"t": {4}}
	ss.outstanding = 5 // the five items below are emitted
	ss.assigned(t.Context(), nil, assign)
	old := ss.parts[tp]
	require.NotNil(t, old)
	var es []*entry
	for o := range int64(5) {
		ss.held++ // polled
		es = append(es, old.add(&kgo.Record{Topic: "t", Partition: 4, Offset: 100 + o}))
	}
	ss.settle(es[0], pipeline.Settlement{Outcome: pipeline.Committed})
	ss.settle(es[1], pipeline.Settlement{Outcome: pipeline.Committed})
	require.Equal(t, int64(102), old.mark.Offset)

	ss.lost(t.Context(), nil, assign)
	assert.Zero(t, ss.held, "a lost partition's records no longer count against the bound")
	ss.assigned(t.Context(), nil, assign)
	cur := ss.parts[tp]
	require.NotSame(t, old, cur)
	for _, e := range es[2:] {
		ss.settle(e, pipeline.Settlement{Outcome: pipeline.Committed})
	}
	assert.False(t, cur.due(), "the new assignment has a watermark of an old one")
	assert.Equal(t, int64(3), ss.s.stale.Load())
	assert.Equal(t, int64(2), ss.s.uncommitted.Load(), "two records settled and were not committed before the loss")
	assert.Equal(t, int64(1), ss.s.lost.Load())
	assert.Equal(t, int64(2), ss.s.assigned.Load())
}

// u64Codec decodes 8 big-endian bytes; any other length is an error.
type u64Codec = scenario.IDCodec[int]

// dueSession returns a session whose partitions a and b each have one record waiting
// for a retry that is due.
func dueSession() (ss *session[int], a, b *entry) {
	src := NewSource(nil, "g", []string{"t"}, u64Codec{})
	ss = &session[int]{s: src, parts: map[TopicPartition]*part{}, changed: make(chan struct{}), kick: make(chan struct{}, 1), stopped: make(chan struct{})}
	for i, pe := range []**entry{&a, &b} {
		p := newPart(TopicPartition{"t", int32(i)})
		ss.parts[p.tp] = p
		*pe = p.add(&kgo.Record{Topic: "t", Partition: int32(i), Value: binary.BigEndian.AppendUint64(nil, uint64(i))})
		p.toRetry(*pe)
		ss.retries = append(ss.retries, retryAt{e: *pe, due: time.Now().Add(-time.Second)})
		ss.held++
	}
	return ss, a, b
}

// checkTwelveEmittedAgain settles e, the entry of record 12 whose message a prospect
// held back: it must wait to be emitted again, and not count as committed.
func checkTwelveEmittedAgain(t *testing.T, ss *session[int], e *entry) {
	t.Helper()
	ss.settle(e, pipeline.Settlement{Outcome: pipeline.Committed})
	assert.Equal(t, waitingRetry, e.state, "12 waits to be emitted again")
	require.Len(t, ss.retries, 1)
	assert.Same(t, e, ss.retries[0].e)
	assert.Zero(t, ss.s.committed.Load(), "12 is not counted committed")
}

// pendingSession returns a session whose partition tp has the records from ... to-1
// in the pipeline.
func pendingSession(tp TopicPartition, from, to int64) (*session[int], []*entry) {
	ss := &session[int]{s: &Source[int]{}, parts: map[TopicPartition]*part{}, changed: make(chan struct{}), kick: make(chan struct{}, 1)}
	p := newPart(tp)
	ss.parts[tp] = p
	var es []*entry
	for o := from; o < to; o++ {
		es = append(es, p.add(&kgo.Record{Topic: tp.Topic, Partition: tp.Partition, Offset: o}))
	}
	ss.held = len(es)
	return ss, es
}

// TestRetryDueEmitErrorLeavesTheRestWaiting: when an emit of the due retries fails
// (the run is canceled, a budget drained it), the records after it were never emitted
// and are not in the pipeline: a revoke must not wait for them. (They stayed marked
// in the pipeline, and the run's last revoke waited the whole WithRevokeTimeout.)
func TestRetryDueEmitErrorLeavesTheRestWaiting(t *testing.T) {
	t.Parallel()
	ss, a, b := dueSession()
	canceled := errors.New("canceled")
	var emitted []int
	err := ss.retryDue(func(ms []Message[int], _ []func(pipeline.Settlement)) error {
		for _, m := range ms {
			emitted = append(emitted, m.Value)
		}
		return canceled
	})
	require.ErrorIs(t, err, canceled)
	assert.Equal(t, []int{0}, emitted)
	assert.Equal(t, inPipeline, a.state, "the failed emit's record: its settle was called NotProcessed")
	assert.Equal(t, waitingRetry, b.state)
	assert.Zero(t, b.p.busy, "a revoke of b's partition would wait for a record that is not in the pipeline")
}

// TestRetryDueSkipsPartitionRevokedMeanwhile: the emit of one due retry may wait for
// room while another record's partition begins its revoke; that record is not emitted
// (it was, and went into the pipeline after its revoke had given up on it).
func TestRetryDueSkipsPartitionRevokedMeanwhile(t *testing.T) {
	t.Parallel()
	ss, a, b := dueSession()
	var emitted []int
	require.NoError(t, ss.retryDue(func(ms []Message[int], _ []func(pipeline.Settlement)) error {
		for _, m := range ms {
			emitted = append(emitted, m.Value)
		}
		ss.mu.Lock()
		b.p.revoking = true // while this emit waited for room
		ss.mu.Unlock()
		return nil
	}))
	assert.Equal(t, []int{0}, emitted)
	assert.Equal(t, inPipeline, a.state)
	assert.Equal(t, waitingRetry, b.state)
	assert.Zero(t, b.p.busy)
}

// TestEndedPartitionKeepsNoRetryOrTxnEntry runs 50 assignments of a partition, each
// ended (revoked, lost, or assigned again with no revoke) while one record waits to be
// emitted again after an hour and another, which a transaction produced (txnDone),
// was handed back too: the session keeps neither once the assignment ended. (Both
// stayed: the retries until due, the txnDone entries for the run, each holding its
// ended part and the part's records, 50 assignments' worth here.)
func TestEndedPartitionKeepsNoRetryOrTxnEntry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tp := TopicPartition{"in", 0}
	ss, _ := pendingSession(tp, 0, 0)
	ss.txnDone = map[*entry]bool{}
	ends := []func(){
		func() { ss.revoked(ctx, nil, map[string][]int32{tp.Topic: {tp.Partition}}) },
		func() { ss.lost(ctx, nil, map[string][]int32{tp.Topic: {tp.Partition}}) },
		func() { ss.assigned(ctx, nil, map[string][]int32{tp.Topic: {tp.Partition}}) },
	}
	for i := range 50 {
		ss.mu.Lock()
		p := ss.parts[tp]
		base := int64(10 * i)
		back := p.add(&kgo.Record{Topic: tp.Topic, Partition: tp.Partition, Offset: base})
		produced := p.add(&kgo.Record{Topic: tp.Topic, Partition: tp.Partition, Offset: base + 1})
		ss.held += 2
		ss.txnDone[produced] = true
		ss.mu.Unlock()
		ss.retryLater(back, time.Hour)
		ss.retryLater(produced, time.Hour)
		require.Equal(t, waitingRetry, produced.state)
		ends[i%len(ends)]()
		if ss.parts[tp] == nil {
			ss.assigned(ctx, nil, map[string][]int32{tp.Topic: {tp.Partition}})
		}
		require.NotSame(t, p, ss.parts[tp], "a new assignment")
	}
	assert.Empty(t, ss.retries, "retries of ended assignments: %d", len(ss.retries))
	assert.Empty(t, ss.txnDone, "txnDone entries of ended assignments: %d", len(ss.txnDone))
	assert.Zero(t, ss.held)
}

// TestSettledBehindHeldRecordIsBounded hands one record back again and again: the
// records after it settle behind it, but keep only their offsets, and once
// WithMaxPending of them did, the partition's fetches pause. (Each settled record
// stayed in memory with its key and value, and the source kept polling: memory grew
// with the partition's backlog, not with WithMaxPending.)
func TestSettledBehindHeldRecordIsBounded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	require.NoError(t, err)
	defer c.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer prod.Close()
	const n = 5000
	recs := make([]*kgo.Record, n)
	for i := range n {
		recs[i] = &kgo.Record{Topic: "t", Value: binary.BigEndian.AppendUint64(make([]byte, 0, 1024), uint64(i))}
	}
	require.NoError(t, prod.ProduceSync(ctx, recs...).FirstErr())

	const maxPending = 100
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...), kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.SessionTimeout(3 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond),
	}
	src := NewSource(opts, "mem", []string{"t"}, u64Codec{}, WithMaxPending(maxPending))
	p := pipeline.New()
	work := pipeline.Then(src.Stream(p), pipeline.NewStage("work", 2, func(_ context.Context, m Message[int]) (int, error) {
		if m.Value == 0 {
			return 0, pipeline.Transient(errors.New("downstream unavailable for record 0"))
		}
		return m.Value, nil
	}, pipeline.WithHandBack(), pipeline.WithRetry(1, pipeline.ConstantBackoff(20*time.Millisecond))))
	pipeline.To(work, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(rctx) }()
	defer func() {
		src.Stop()
		assert.NoError(t, <-errc)
	}()
	check := func() {
		t.Helper()
		src.mu.Lock()
		ss := src.cur
		src.mu.Unlock()
		require.NotNil(t, ss)
		ss.mu.Lock()
		defer ss.mu.Unlock()
		settledN, withRec := 0, 0
		for _, pt := range ss.parts {
			for _, e := range pt.pending {
				if e.state == settled {
					settledN++
					assert.Nil(t, e.rec, "a settled entry keeps its record")
				} else {
					withRec++
				}
			}
		}
		assert.LessOrEqual(t, withRec, maxPending+1, "unsettled records")
		assert.LessOrEqual(t, settledN, 2*maxPending+1, "settled records behind the unsettled one")
	}
	scenario.Eventually(t, 10*time.Millisecond, 20*time.Second, "the partition to pause", func() bool { return src.Stats().Paused > 0 })
	check()
	back := src.Stats().HandedBack
	// Record 0 went round again: what was in flight settled.
	scenario.Eventually(t, 10*time.Millisecond, 20*time.Second, "record 0 to be retried", func() bool { return src.Stats().HandedBack >= back+5 })
	check()
	assert.Less(t, src.Stats().Fetched, int64(n), "the paused partition was fetched to its end")
}

// TestPartLagCountsFromTheBestKnownCommit takes a partition's committed offset from
// this assignment's commit, else the group's, else the first record taken, else the
// log's start: the lag is the high watermark minus it, unknown while either is.
func TestPartLagCountsFromTheBestKnownCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                                string
		hwm, committed, group, start, first int64
		lag                                 int64
		ok                                  bool
	}{
		{name: "nothing known", hwm: -1, committed: -1, group: -1, start: -1, first: -1},
		{name: "no high watermark", hwm: -1, committed: 5, group: -1, start: -1, first: -1},
		{name: "no offset", hwm: 50, committed: -1, group: -1, start: -1, first: -1},
		{name: "log start", hwm: 50, committed: -1, group: -1, start: 10, first: -1, lag: 40, ok: true},
		{name: "first record", hwm: 50, committed: -1, group: -1, start: 10, first: 20, lag: 30, ok: true},
		{name: "group's commit", hwm: 50, committed: -1, group: 25, start: 10, first: 20, lag: 25, ok: true},
		{name: "own commit", hwm: 50, committed: 45, group: 25, start: 10, first: 20, lag: 5, ok: true},
		{name: "caught up", hwm: 50, committed: 50, group: 25, start: 10, first: 20, lag: 0, ok: true},
		{name: "listing behind the commit", hwm: 40, committed: 50, group: -1, start: -1, first: -1, lag: 0, ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPart(TopicPartition{"t", 0})
			p.hwm, p.committed, p.logStart = tc.hwm, tc.committed, tc.start
			if tc.first >= 0 {
				p.add(&kgo.Record{Offset: tc.first})
			}
			lag, ok := p.lag(tc.group)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.lag, lag)
		})
	}
}

// settle follows the outcome of an emitted item as its settle callback (settleBy) does,
// without a callback to free.
func (ss *session[T]) settle(e *entry, st pipeline.Settlement) {
	if st.Outcome == pipeline.Committed && ss.committedDone(e, nil) {
		return
	}
	ss.settleRest(e, st)
}

// TestRecordsOutOfOrderKeepTheWatermarkBehindUnsettled adds a partition's records out
// of offset order, as a client can hand them over after a partition was lost and
// assigned back (records fetched for the earlier assignment, then the same range
// fetched again from the committed offset): each record takes its place by offset, a
// repeat of one pending or settled is refused, and the watermark never passes a record
// that has not settled.
func TestRecordsOutOfOrderKeepTheWatermarkBehindUnsettled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		adds    []int64 // offsets in the order the client hands them over
		refused []int64 // the repeats add refuses
		settle  []int64 // the order they settle in
		marks   []int64 // the watermark after each settle, -1 for none
	}{
		{
			name: "stale records before the refetch", adds: []int64{111, 112, 100, 101, 111, 112},
			refused: []int64{111, 112}, settle: []int64{111, 112, 100, 101}, marks: []int64{-1, -1, 101, 113},
		},
		{
			name: "a repeat behind the watermark", adds: []int64{5, 6, 7},
			settle: []int64{5}, marks: []int64{6},
		},
		{
			name: "a record between pending ones", adds: []int64{10, 14, 12, 12},
			refused: []int64{12}, settle: []int64{14, 10, 12}, marks: []int64{-1, 11, 15},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPart(TopicPartition{"t", 0})
			es := map[int64]*entry{}
			var refused []int64
			for _, o := range tc.adds {
				if e := p.add(&kgo.Record{Offset: o}); e != nil {
					es[o] = e
				} else {
					refused = append(refused, o)
				}
			}
			assert.Equal(t, tc.refused, refused)
			assert.Equal(t, len(es), p.busy)
			assert.Equal(t, slices.Min(tc.adds), p.start)
			for k, o := range tc.settle {
				p.settle(es[o])
				if tc.marks[k] < 0 {
					assert.False(t, p.due(), "settle %d: a watermark with %d unsettled", o, tc.adds[0])
					continue
				}
				require.True(t, p.due(), "settle %d", o)
				assert.Equal(t, tc.marks[k], p.mark.Offset, "settle %d", o)
			}
			// A repeat of a settled record, once the watermark is past it, is refused too.
			assert.Nil(t, p.add(&kgo.Record{Offset: tc.settle[0]}))
		})
	}
}

// TestRewoundPartitionTakesEveryOffsetOnce replays a partition after a rewind (a
// transactional source's, after an aborted transaction) while the client still hands
// over records of a fetch made before it, in the worst order: some while the replay is
// below where the fetch was (dropped), then more once the replay got there, before the
// replay's own copies of the dropped ones. Every offset from the rewind on is taken
// exactly once, and the watermark passes none untaken: the replay's copies of the
// dropped records were refused as repeats, and lost.
func TestRewoundPartitionTakesEveryOffsetOnce(t *testing.T) {
	t.Parallel()
	np := newPart(TopicPartition{"t", 0})
	np.replayTo = 120 // polled up to 120 before the rewind to 100
	var polled []int64
	seq := func(from, to int64) {
		for o := from; o <= to; o++ {
			polled = append(polled, o)
		}
	}
	seq(100, 110) // the replay
	seq(121, 125) // the earlier fetch, going on: dropped, the replay being below 120
	seq(111, 120) // the replay reaches 120
	seq(126, 130) // the earlier fetch's next records
	seq(121, 130) // the replay's copies
	var taken []int64
	var es []*entry
	for _, o := range polled {
		if !np.admit(o) {
			continue
		}
		if e := np.add(&kgo.Record{Offset: o}); e != nil {
			taken = append(taken, o)
			es = append(es, e)
		}
	}
	slices.Sort(taken)
	want := make([]int64, 0, 31)
	for o := int64(100); o <= 130; o++ {
		want = append(want, o)
	}
	assert.Equal(t, want, taken, "every offset from the rewind on, once")
	for _, e := range es {
		np.settle(e)
	}
	assert.Equal(t, int64(131), np.mark.Offset)
}
