package kafka_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
)

// TestStatsLagFollowsHighWatermarkAndCommits holds every item at the sink: each
// partition's lag is its every record, 100 (nothing committed); released, the lag goes
// to 0 as the watermarks are committed; records produced while the sink holds again
// show as lag once more (the fetch or the source's listing of end offsets sees them),
// and between runs Lag is nil.
func TestStatsLagFollowsHighWatermarkAndCommits(t *testing.T) {
	t.Parallel()
	const n = 1200
	ctx, c := clusterWithIDs(t, n)
	src := kafka.NewSource(consumerOpts(c), "lag", []string{inTopic}, idCodec{},
		kafka.WithMaxPending(2*n), kafka.WithCommitInterval(50*time.Millisecond))
	var mu sync.Mutex
	gate := make(chan struct{})
	wait := func() <-chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		return gate
	}
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("held", 4, func(ctx context.Context, _ kafka.Message[int]) error {
		select {
		case <-wait():
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}))
	assert.Nil(t, src.Stats().Lag, "before the run")
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errc := runAsync(rctx, p)

	every := func(want int64) func() bool {
		return func() bool {
			lag := src.Stats().Lag
			if len(lag) != partitions {
				return false
			}
			for _, l := range lag {
				if l != want {
					return false
				}
			}
			return true
		}
	}
	eventually(t, 30*time.Second, "a lag of 100 on each partition", every(n/partitions))
	assert.Equal(t, int64(n), src.Stats().TotalLag())
	assert.Equal(t, int64(n), src.Stats().Counters()["lag"])
	// The pipeline's report carries the same lag on the source's row, by partition.
	row := sourceRow(t, p.Snapshot())
	want := make([]pipeline.PartitionLag, partitions)
	for i := range want {
		want[i] = pipeline.PartitionLag{Partition: fmt.Sprintf("%s/%d", inTopic, i), Lag: n / partitions}
	}
	assert.Equal(t, want, row.Lag)
	assert.Equal(t, int64(n), row.TotalLag())

	mu.Lock()
	close(gate)
	mu.Unlock()
	eventually(t, 30*time.Second, "no lag once committed", every(0))

	mu.Lock()
	gate = make(chan struct{})
	mu.Unlock()
	produceIDs(ctx, t, c, inTopic, n)
	eventually(t, 30*time.Second, "the new records as lag", every(n/partitions))

	mu.Lock()
	close(gate)
	mu.Unlock()
	eventually(t, 30*time.Second, "no lag once committed again", every(0))
	src.Stop()
	require.NoError(t, <-errc)
	st := src.Stats()
	assert.Nil(t, st.Lag, "after the run")
	assert.Equal(t, int64(2*n), st.Committed)
	assert.Nil(t, sourceRow(t, p.Report()).Lag, "the final report: the source has left the group")
}

// sourceRow returns the source's row of a report.
func sourceRow(t *testing.T, rep pipeline.Report) pipeline.StageReport {
	t.Helper()
	for _, s := range rep.Stages {
		if s.Kind == pipeline.KindSource {
			return s
		}
	}
	require.FailNow(t, "no source row", "%v", rep)
	return pipeline.StageReport{}
}

// TestEndOffsetsListedOnlyWhileLagIsRead counts the source's listings of end offsets
// (ListOffsets requests for the latest offsets, which keep Stats.Lag's high watermarks
// current while backpressure holds fetches back) with a commit interval of 20 ms. The
// test produces one record at a time and waits for its offset commit, so that each
// commit marks an interval gone by. While nobody reads the lag (no Stats, no report)
// the source lists nothing; while it is read, it lists at most once a second, not at
// every interval. (It listed at every interval: 50 requests a second at 20 ms.)
func TestEndOffsetsListedOnlyWhileLagIsRead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := newCluster(t)
	var commits, listings atomic.Int64
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if req.(*kmsg.OffsetCommitRequest).Group == "ends" {
			commits.Add(1)
		}
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, t := range req.(*kmsg.ListOffsetsRequest).Topics {
			for _, p := range t.Partitions {
				if p.Timestamp == -1 { // the latest offset (a listing of the start asks -2)
					listings.Add(1)
					return nil, nil, false
				}
			}
		}
		return nil, nil, false
	})
	src := kafka.NewSource(consumerOpts(c), "ends", []string{inTopic}, idCodec{}, kafka.WithCommitInterval(20*time.Millisecond))
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("done", 1, func(context.Context, kafka.Message[int]) error { return nil }))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errc := runAsync(rctx, p)
	producer := newIDProducer(t, c)
	// rounds produces k records, one at a time, each once the one before is committed,
	// with read called while it waits.
	produced := 0
	rounds := func(k int, read func()) {
		for range k {
			want := commits.Load() + 1
			produceIDsWith(ctx, t, producer, inTopic, produced, 1)
			produced++
			eventually(t, 30*time.Second, "the commit of record "+strconv.Itoa(produced), func() bool {
				read()
				return commits.Load() >= want
			})
		}
	}
	rounds(30, func() {})
	unread := listings.Load()
	rounds(60, func() { _ = src.Stats() }) // Stats reads Lag
	read := listings.Load() - unread
	src.Stop()
	require.NoError(t, <-errc)
	t.Logf("end offset listings: %d over 30 commits with the lag not read, %d over 60 commits with the lag read", unread, read)
	assert.Zero(t, unread, "listings while the lag is not read")
	assert.Positive(t, read, "listings while the lag is read")
	assert.Less(t, read, int64(30), "listings while the lag is read: at most one a second, not one per commit")
}
