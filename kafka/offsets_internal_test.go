package kafka

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
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
	ss := &session[int]{s: &Source[int]{}, parts: map[TopicPartition]*part{}, changed: make(chan struct{})}
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
