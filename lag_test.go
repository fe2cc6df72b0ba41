package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// lagRun runs items 0..n-1 of a source made by mk (given the WithLag option) into a
// one-worker sink that takes a Snapshot at the first item, and returns that snapshot
// and the final report.
func lagRun(t *testing.T, n int, mk func(p *pipeline.Pipeline, lag pipeline.LagOption) *pipeline.Stream[int],
	lag func() []pipeline.PartitionLag,
) (live, final pipeline.Report) {
	t.Helper()
	p := pipeline.New()
	src := mk(p, pipeline.WithLag(lag))
	var once sync.Once
	pipeline.To(src, pipeline.NewSink("sink", 1, func(context.Context, int) error {
		once.Do(func() { live = p.Snapshot() })
		return nil
	}))
	require.NoError(t, p.Run(t.Context()))
	return live, p.Report()
}

func acked(n int) func(p *pipeline.Pipeline, lag pipeline.LagOption) *pipeline.Stream[int] {
	return func(p *pipeline.Pipeline, lag pipeline.LagOption) *pipeline.Stream[int] {
		return pipeline.FromAcked(p, ackBody(n, noSettle), pipeline.WithName("src"), lag)
	}
}

func noSettle(int) func(pipeline.Settlement) { return nil }

func checkpointed(n int) func(p *pipeline.Pipeline, lag pipeline.LagOption) *pipeline.Stream[int] {
	return func(p *pipeline.Pipeline, lag pipeline.LagOption) *pipeline.Stream[int] {
		return pipeline.FromCheckpoint(p, &memStore{}, from(n), pipeline.WithName("src"), lag)
	}
}

// TestWithLagPutsThePartitionsOnTheSourceRow checks that what a tracked source's lag
// function returns reaches its row, live and final, in the function's order, with a
// label given twice added up, nil kept nil and an empty list kept empty.
func TestWithLagPutsThePartitionsOnTheSourceRow(t *testing.T) {
	t.Parallel()
	many := make([]pipeline.PartitionLag, 40) // past the scan of a few labels: the map's path
	for i := range many {
		many[i] = pipeline.PartitionLag{Partition: fmt.Sprintf("t/%d", i%20), Lag: 1}
	}
	manyWant := make([]pipeline.PartitionLag, 20)
	for i := range manyWant {
		manyWant[i] = pipeline.PartitionLag{Partition: fmt.Sprintf("t/%d", i), Lag: 2}
	}
	tests := []struct {
		name  string
		given []pipeline.PartitionLag
		want  []pipeline.PartitionLag
		total int64
	}{
		{"nil", nil, nil, 0},
		{"empty", []pipeline.PartitionLag{}, []pipeline.PartitionLag{}, 0},
		{
			"in the source's order",
			[]pipeline.PartitionLag{{"t/10", 5}, {"t/2", 7}, {"t/1", 0}},
			[]pipeline.PartitionLag{{"t/10", 5}, {"t/2", 7}, {"t/1", 0}},
			12,
		},
		{
			"a label twice added up",
			[]pipeline.PartitionLag{{"a", 1}, {"b", 2}, {"a", 3}},
			[]pipeline.PartitionLag{{"a", 4}, {"b", 2}},
			6,
		},
		{"many labels, each twice", many, manyWant, 40},
	}
	for _, tt := range tests {
		for src, mk := range map[string]func(int) func(*pipeline.Pipeline, pipeline.LagOption) *pipeline.Stream[int]{
			"FromAcked": acked, "FromCheckpoint": checkpointed,
		} {
			t.Run(tt.name+"/"+src, func(t *testing.T) {
				t.Parallel()
				var calls atomic.Int64
				live, final := lagRun(t, 5, mk(5), func() []pipeline.PartitionLag {
					calls.Add(1)
					return tt.given
				})
				for _, rep := range []pipeline.Report{live, final} {
					s, ok := rep.Stage("src")
					require.True(t, ok)
					assert.Equal(t, tt.want, s.Lag)
					assert.Equal(t, tt.total, s.TotalLag())
					sink, _ := rep.Stage("sink")
					assert.Nil(t, sink.Lag, "only the source's row")
				}
				assert.Equal(t, int64(2), calls.Load(), "once per report: the Snapshot and the final one")
			})
		}
	}
}

// TestWithLagCopiesWhatItIsGiven checks that a lag function may reuse its slice: a
// report keeps what it read.
func TestWithLagCopiesWhatItIsGiven(t *testing.T) {
	t.Parallel()
	buf := []pipeline.PartitionLag{{"p/0", 3}}
	live, _ := lagRun(t, 3, acked(3), func() []pipeline.PartitionLag { return buf })
	buf[0].Lag = 99
	s, _ := live.Stage("src")
	assert.Equal(t, []pipeline.PartitionLag{{"p/0", 3}}, s.Lag)
}

// TestSourcesWithoutWithLagReportNoLag checks that the rows of a run without WithLag
// have a nil Lag, and that the report's text says nothing about lag.
func TestSourcesWithoutWithLagReportNoLag(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	pipeline.To(pipeline.FromAcked(p, ackBody(3, noSettle)), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	require.NoError(t, p.Run(t.Context()))
	rep := p.Report()
	for _, s := range rep.Stages {
		assert.Nil(t, s.Lag, s.Name)
		assert.Zero(t, s.TotalLag(), s.Name)
	}
	assert.NotContains(t, rep.String(), "lag")
	assert.NotContains(t, rep.Line(), "lag")
}

// TestReportShowsTheSourcesLag checks the report's line about a source's lag, and the
// progress line's lag field.
func TestReportShowsTheSourcesLag(t *testing.T) {
	t.Parallel()
	twelve := make([]pipeline.PartitionLag, 12)
	for i := range twelve {
		twelve[i] = pipeline.PartitionLag{Partition: fmt.Sprintf("orders/%d", i), Lag: int64(i % 5)}
	}
	tests := []struct {
		name      string
		lag       []pipeline.PartitionLag
		text      string // the line in String
		progress  string // the start of Line
		noLagLine bool
	}{
		{
			"three partitions",
			[]pipeline.PartitionLag{{"orders/0", 600}, {"orders/1", 634}, {"orders/2", 0}},
			"source kafka: lag 1234 on 3 partitions: orders/0 600, orders/1 634, orders/2 0\n", "kafka lag=1234 | ", false,
		},
		{
			"one partition",
			[]pipeline.PartitionLag{{"file", 7}},
			"source kafka: lag 7 on 1 partition: file 7\n", "kafka lag=7 | ", false,
		},
		{
			"none held",
			[]pipeline.PartitionLag{},
			"source kafka: lag 0 on 0 partitions\n", "kafka lag=0 | ", false,
		},
		{
			"twelve: the furthest behind", twelve,
			"source kafka: lag 21 on 12 partitions, furthest behind: orders/4 4, orders/9 4, orders/3 3, orders/8 3, orders/2 2, orders/7 2\n",
			"kafka lag=21 | ", false,
		},
		{"not known", nil, "", "sink ", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rep := pipeline.Report{Stages: []pipeline.StageReport{
				{Name: "kafka", Kind: pipeline.KindSource, Lag: tt.lag, Next: []string{"sink"}},
				{Name: "sink", Kind: pipeline.KindSink, Workers: 1, QueueCap: 4},
			}}
			if tt.noLagLine {
				assert.NotContains(t, rep.String(), "lag")
			} else {
				assert.Contains(t, rep.String(), tt.text)
			}
			assert.True(t, strings.HasPrefix(rep.Line(), tt.progress), "Line: %q", rep.Line())
		})
	}
}

func TestWithLagPanicsOnNil(t *testing.T) {
	t.Parallel()
	assert.PanicsWithValue(t, "pipeline: WithLag(nil)", func() { pipeline.WithLag(nil) })
}
