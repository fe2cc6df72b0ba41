package pipelineprom_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
	pipelineprom "github.com/gopipeline/pipeline/prometheus"
)

// checkSamples asserts that got holds each sample of want with its value.
func checkSamples(t *testing.T, got, want map[string]float64, text string) {
	t.Helper()
	for k, v := range want {
		if assert.Contains(t, got, k, "%s", text) {
			assert.Equal(t, v, got[k], k)
		}
	}
}

// checkGathered asserts that what reg gathers holds each sample of want with its
// value (checkSamples), and returns the samples and the metric types.
func checkGathered(t *testing.T, reg prometheus.Gatherer, want map[string]float64) (map[string]float64, map[string]dto.MetricType) {
	t.Helper()
	text := gather(t, reg)
	got, types := samples(t, text)
	checkSamples(t, got, want, text)
	return got, types
}

// TestS1Retry runs scenario S1 with the retry policy (in virtual time) and reads its
// figures from a real scrape over HTTP.
func TestS1Retry(t *testing.T) {
	fx := scenario.LoadS1(t, "../bench/testdata/items.json")
	synctest.Test(t, func(t *testing.T) {
		p := scenario.S1Retry(fx, nil)
		reg := prometheus.NewPedanticRegistry() // also checks Collect against Describe
		reg.MustRegister(pipelineprom.NewCollector(p))
		require.NoError(t, p.Run(t.Context()))

		// The server starts after the run: goroutines blocked on the network are not
		// durably blocked, so they would keep the bubble's clock from advancing.
		text := scrape(t, serve(t, reg))
		got, types := samples(t, text)
		src := scenario.RowName(t, p, pipeline.KindSource)
		checkSamples(t, got, map[string]float64{
			`pipeline_stage_info{kind="source",stage="` + src + `"}`: 1,
			`pipeline_stage_in_items{stage="` + src + `"}`:           10_000,
			`pipeline_stage_out_total{stage="` + src + `"}`:          10_000,
			`pipeline_source_total_items{stage="` + src + `"}`:       10_000,
			`pipeline_stage_handed_back_total{stage="enrich"}`:       0,
			`pipeline_running`: 0,
			`pipeline_stage_items_total{outcome="succeeded",stage="enrich"}`:                     9_895,
			`pipeline_stage_items_total{outcome="dead_lettered",stage="enrich"}`:                 105,
			`pipeline_stage_items_total{outcome="failed",stage="enrich"}`:                        0,
			`pipeline_stage_retries_total{stage="enrich"}`:                                       200,
			`pipeline_stage_out_total{stage="enrich"}`:                                           9_895,
			`pipeline_stage_in_items{stage="enrich"}`:                                            10_000,
			`pipeline_stage_not_started_items{stage="enrich"}`:                                   0,
			`pipeline_stage_errors_total{outcome="retried",stage="enrich",type="error"}`:         200,
			`pipeline_stage_errors_total{outcome="dead_lettered",stage="enrich",type="error"}`:   100,
			`pipeline_stage_errors_total{outcome="failed",stage="enrich",type="error"}`:          0,
			`pipeline_stage_errors_total{outcome="dead_lettered",stage="enrich",type="timeout"}`: 5,
			`pipeline_stage_workers{stage="enrich"}`:                                             20,
			`pipeline_stage_busy_workers{stage="enrich"}`:                                        0,
			`pipeline_stage_in_flight{stage="enrich"}`:                                           0,
			`pipeline_stage_queue_length{stage="enrich"}`:                                        0,
			`pipeline_stage_queue_capacity{stage="enrich"}`:                                      100,
			`pipeline_stage_attempt_timeout_seconds{stage="enrich"}`:                             1,
			`pipeline_stage_items_total{outcome="succeeded",stage="sink"}`:                       9_895,
			`pipeline_stage_info{kind="stage",stage="enrich"}`:                                   1,
			`pipeline_stage_info{kind="sink",stage="sink"}`:                                      1,
		}, text)
		assert.NotContains(t, got, "pipeline_checkpoint_position", "not a checkpointed run")
		assert.NotContains(t, got, `pipeline_source_resumed_items{stage="`+src+`"}`, "not a checkpointed run")
		assert.Equal(t, dto.MetricType_COUNTER, types["pipeline_stage_items_total"])
		assert.Equal(t, dto.MetricType_GAUGE, types["pipeline_stage_in_items"])
		assert.Equal(t, dto.MetricType_SUMMARY, types["pipeline_stage_attempt_duration_seconds"])

		// Attempts sleep 1 ms, the five hanging ones until their 1 s timeout: the quantiles
		// are within 12.5 % of that. Once one attempt took more than 20 µs, a worker times
		// every attempt, so nearly all of the 10,200 attempts are timed.
		timed := got[`pipeline_stage_attempt_duration_seconds_count{stage="enrich"}`]
		assert.True(t, timed > 9_000 && timed <= 10_200, "timed %v of 10,200 attempts", timed)
		assert.InEpsilon(t, 0.001, got[`pipeline_stage_attempt_duration_seconds{quantile="0.5",stage="enrich"}`], 0.125)
		assert.InEpsilon(t, 0.001, got[`pipeline_stage_attempt_duration_seconds{quantile="0.99",stage="enrich"}`], 0.125)
		assert.InEpsilon(t, 1, got[`pipeline_stage_attempt_duration_seconds{quantile="1",stage="enrich"}`], 0.125)
		// The sum: about 1 ms per timed attempt, plus up to 5 s for the hanging ones.
		sum := got[`pipeline_stage_attempt_duration_seconds_sum{stage="enrich"}`]
		assert.True(t, sum >= 0.001*timed && sum <= 0.0011*timed+5.01, "sum %v s for %v timed attempts", sum, timed)

		problems, err := testutil.GatherAndLint(reg)
		require.NoError(t, err)
		assert.Empty(t, problems, "promlint")
	})
}

// TestScrapeDuringRun scrapes a run whose sink is blocked: the queues in front of it are
// full and its worker is busy.
func TestScrapeDuringRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		p := scenario.StoreBlocked(release)
		reg := registry(p)

		done := scenario.Start(t.Context(), p)
		synctest.Wait() // every goroutine of the run is blocked: the sink on release, the rest on full queues

		// A real scrape: the run needs no timer from here on, so the server's goroutines
		// (not durably blocked) cannot hold up the bubble's clock.
		text := scrape(t, serve(t, reg))
		got, _ := samples(t, text)
		src := scenario.RowName(t, p, pipeline.KindSource)
		checkSamples(t, got, map[string]float64{
			`pipeline_stage_in_items{stage="` + src + `"}`: 100,
			// The item the source is handing on is in flight, not failed as in the report.
			`pipeline_stage_in_flight{stage="` + src + `"}`:                    1,
			`pipeline_stage_items_total{outcome="failed",stage="` + src + `"}`: 0,
			`pipeline_running`:                                              1,
			`pipeline_stage_queue_length{stage="store"}`:                    4,
			`pipeline_stage_queue_capacity{stage="store"}`:                  4,
			`pipeline_stage_queue_length{stage="double"}`:                   4,
			`pipeline_stage_busy_workers{stage="store"}`:                    1,
			`pipeline_stage_in_flight{stage="store"}`:                       1,
			`pipeline_stage_workers{stage="double"}`:                        2,
			`pipeline_stage_not_started_items{stage="store"}`:               4,
			`pipeline_stage_out_total{stage="store"}`:                       0,
			`pipeline_stage_items_total{outcome="succeeded",stage="store"}`: 0,
		}, text)
		// The queued items are not started yet: in = settled + in flight + not started.
		for _, stage := range []string{"double", "store"} {
			sum := got[`pipeline_stage_in_flight{stage="`+stage+`"}`] + got[`pipeline_stage_not_started_items{stage="`+stage+`"}`]
			for _, o := range []string{"succeeded", "dead_lettered", "failed"} {
				sum += got[`pipeline_stage_items_total{outcome="`+o+`",stage="`+stage+`"}`]
			}
			assert.Equal(t, got[`pipeline_stage_in_items{stage="`+stage+`"}`], sum, stage)
		}

		close(release)
		require.NoError(t, <-done)
		got, _ = samples(t, gather(t, reg))
		assert.Equal(t, 0.0, got[`pipeline_running`])
		assert.Equal(t, 100.0, got[`pipeline_stage_items_total{outcome="succeeded",stage="store"}`])
		assert.Equal(t, 0.0, got[`pipeline_stage_queue_length{stage="store"}`])
	})
}

// TestOldestAttemptGauge checks the age of a stuck attempt (a function that ignores its
// context under WithTimeout) during the run, and 0 after it.
func TestOldestAttemptGauge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		p := scenario.StuckAttempt(release)
		reg := registry(p)

		done := scenario.Start(t.Context(), p)
		time.Sleep(time.Second)
		synctest.Wait()
		got, types := samples(t, gather(t, reg))
		age := got[`pipeline_stage_oldest_attempt_seconds{stage="wait"}`]
		assert.True(t, age > 0.9 && age <= 1, "age %v s, 1 s into the attempt", age)
		assert.Equal(t, dto.MetricType_GAUGE, types["pipeline_stage_oldest_attempt_seconds"])

		close(release)
		require.NoError(t, <-done)
		got, _ = samples(t, gather(t, reg))
		assert.Contains(t, got, `pipeline_stage_oldest_attempt_seconds{stage="wait"}`)
		assert.Zero(t, got[`pipeline_stage_oldest_attempt_seconds{stage="wait"}`])
	})
}

// TestScrapeOrderedDuringRun: the finished items an ordered stage holds for an earlier
// one are in flight during a run, not succeeded: the final report counts them as failed
// if the run stops before they go on, and a succeeded counter that counted them would
// then go down within the run (a counter reset to Prometheus, whose increase() would
// count the whole value again). Once they go on, they are succeeded; if the run is
// canceled first, failed, and the succeeded counter never went down.
func TestScrapeOrderedDuringRun(t *testing.T) {
	for _, cancelFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "released", true: "canceled"}[cancelFirst], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				p := scenario.OrderedHeadHeld(release) // the head item is slow: the others wait in the window
				reg := registry(p)

				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				done := scenario.Start(ctx, p)
				synctest.Wait()

				checkGathered(t, reg, map[string]float64{
					`pipeline_stage_reorder_held{stage="ordered"}`:                    3,
					`pipeline_stage_items_total{outcome="succeeded",stage="ordered"}`: 0,
					`pipeline_stage_items_total{outcome="failed",stage="ordered"}`:    0,
					`pipeline_stage_in_flight{stage="ordered"}`:                       4,
					`pipeline_stage_out_total{stage="ordered"}`:                       0,
				})

				if cancelFirst {
					cancel()
					require.Error(t, <-done)
					got, _ := samples(t, gather(t, reg))
					assert.Zero(t, got[`pipeline_stage_items_total{outcome="succeeded",stage="ordered"}`])
					assert.Equal(t, 4.0, got[`pipeline_stage_items_total{outcome="failed",stage="ordered"}`], "the held ones and the one in hand")
					return
				}
				close(release)
				require.NoError(t, <-done)
				got, _ := samples(t, gather(t, reg))
				assert.Equal(t, 4.0, got[`pipeline_stage_items_total{outcome="succeeded",stage="ordered"}`])
				assert.Equal(t, 4.0, got[`pipeline_stage_out_total{stage="ordered"}`])
			})
		})
	}
}

// TestScrapeHTTP scrapes a small pipeline with a filter and a batch over HTTP, outside
// any bubble, and compares the exposition text with the expected one.
func TestScrapeHTTP(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the server's Cleanup, which runs first
	p := scenario.FilterBatch(pipeline.WithBuffer(8))
	require.NoError(t, p.Run(t.Context()))

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(pipelineprom.NewCollector(p, pipelineprom.WithConstLabels(prometheus.Labels{"pipeline": "squares"})))
	const want = `
# HELP pipeline_batch_flushes_total Batches flushed in the current or last run, by reason: size, bytes, linger, checkpoint (a checkpointed source waited for its items) or end.
# TYPE pipeline_batch_flushes_total counter
pipeline_batch_flushes_total{pipeline="squares",reason="bytes",stage="$batch"} 0
pipeline_batch_flushes_total{pipeline="squares",reason="checkpoint",stage="$batch"} 0
pipeline_batch_flushes_total{pipeline="squares",reason="end",stage="$batch"} 1
pipeline_batch_flushes_total{pipeline="squares",reason="linger",stage="$batch"} 0
pipeline_batch_flushes_total{pipeline="squares",reason="size",stage="$batch"} 1
# HELP pipeline_running 1 while a run of the pipeline is in progress, else 0.
# TYPE pipeline_running gauge
pipeline_running{pipeline="squares"} 0
# HELP pipeline_stage_in_items Items that reached the stage in the current or last run (a source: the items it holds, when known).
# TYPE pipeline_stage_in_items gauge
pipeline_stage_in_items{pipeline="squares",stage="$batch"} 3
pipeline_stage_in_items{pipeline="squares",stage="save"} 2
pipeline_stage_in_items{pipeline="squares",stage="$source"} 6
pipeline_stage_in_items{pipeline="squares",stage="square"} 3
# HELP pipeline_stage_info Always 1: the kind of each stage (source, stage, sink, filter, batch or window).
# TYPE pipeline_stage_info gauge
pipeline_stage_info{kind="batch",pipeline="squares",stage="$batch"} 1
pipeline_stage_info{kind="filter",pipeline="squares",stage="$filter"} 1
pipeline_stage_info{kind="sink",pipeline="squares",stage="save"} 1
pipeline_stage_info{kind="source",pipeline="squares",stage="$source"} 1
pipeline_stage_info{kind="stage",pipeline="squares",stage="square"} 1
# HELP pipeline_stage_items_total Items the stage settled in the current or last run, by outcome: succeeded, dead_lettered, failed or filtered.
# TYPE pipeline_stage_items_total counter
pipeline_stage_items_total{outcome="dead_lettered",pipeline="squares",stage="$batch"} 0
pipeline_stage_items_total{outcome="dead_lettered",pipeline="squares",stage="save"} 0
pipeline_stage_items_total{outcome="dead_lettered",pipeline="squares",stage="$source"} 0
pipeline_stage_items_total{outcome="dead_lettered",pipeline="squares",stage="square"} 0
pipeline_stage_items_total{outcome="failed",pipeline="squares",stage="$batch"} 0
pipeline_stage_items_total{outcome="failed",pipeline="squares",stage="save"} 0
pipeline_stage_items_total{outcome="failed",pipeline="squares",stage="$source"} 0
pipeline_stage_items_total{outcome="failed",pipeline="squares",stage="square"} 0
pipeline_stage_items_total{outcome="filtered",pipeline="squares",stage="$filter"} 3
pipeline_stage_items_total{outcome="succeeded",pipeline="squares",stage="$batch"} 3
pipeline_stage_items_total{outcome="succeeded",pipeline="squares",stage="save"} 2
pipeline_stage_items_total{outcome="succeeded",pipeline="squares",stage="$source"} 6
pipeline_stage_items_total{outcome="succeeded",pipeline="squares",stage="square"} 3
# HELP pipeline_stage_not_started_items Items that reached the stage and were not started: during a run, mostly those still queued.
# TYPE pipeline_stage_not_started_items gauge
pipeline_stage_not_started_items{pipeline="squares",stage="$batch"} 0
pipeline_stage_not_started_items{pipeline="squares",stage="save"} 0
pipeline_stage_not_started_items{pipeline="squares",stage="$source"} 0
pipeline_stage_not_started_items{pipeline="squares",stage="square"} 0
# HELP pipeline_stage_out_total Items the stage sent on in the current or last run.
# TYPE pipeline_stage_out_total counter
pipeline_stage_out_total{pipeline="squares",stage="$batch"} 2
pipeline_stage_out_total{pipeline="squares",stage="save"} 2
pipeline_stage_out_total{pipeline="squares",stage="$source"} 6
pipeline_stage_out_total{pipeline="squares",stage="square"} 3
# HELP pipeline_stage_queue_capacity Capacity of the stage's input queue.
# TYPE pipeline_stage_queue_capacity gauge
pipeline_stage_queue_capacity{pipeline="squares",stage="$batch"} 8
pipeline_stage_queue_capacity{pipeline="squares",stage="save"} 8
pipeline_stage_queue_capacity{pipeline="squares",stage="square"} 8
# HELP pipeline_stage_workers Workers of the stage.
# TYPE pipeline_stage_workers gauge
pipeline_stage_workers{pipeline="squares",stage="$batch"} 1
pipeline_stage_workers{pipeline="squares",stage="save"} 1
pipeline_stage_workers{pipeline="squares",stage="square"} 2
`
	names := strings.NewReplacer(`"$source"`, `"`+scenario.RowName(t, p, pipeline.KindSource)+`"`,
		`"$filter"`, `"`+scenario.RowName(t, p, pipeline.KindFilter)+`"`, `"$batch"`, `"`+scenario.RowName(t, p, pipeline.KindBatch)+`"`)
	err := testutil.ScrapeAndCompare(serve(t, reg), strings.NewReader(names.Replace(want)),
		"pipeline_running", "pipeline_stage_info", "pipeline_stage_in_items", "pipeline_stage_not_started_items", "pipeline_stage_out_total",
		"pipeline_stage_items_total", "pipeline_batch_flushes_total", "pipeline_stage_queue_capacity",
		"pipeline_stage_workers", "pipeline_checkpoint_position")
	require.NoError(t, err)
}

// TestBeforeFirstRun: a pipeline that never ran exposes pipeline_running only.
func TestBeforeFirstRun(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []int{1}), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	reg := registry(p)
	got, _ := samples(t, gather(t, reg))
	assert.Equal(t, map[string]float64{"pipeline_running": 0}, got)
}

// TestCountsPerRun: each run counts from zero, and a scrape between runs shows the last
// run's counts.
func TestCountsPerRun(t *testing.T) {
	t.Parallel()
	n := 0 // items of the next run
	p := scenario.ItemsPerRun(&n)
	reg := registry(p)
	for _, n = range []int{5, 3} {
		require.NoError(t, p.Run(t.Context()))
		got, _ := samples(t, gather(t, reg))
		assert.Equal(t, float64(n), got[`pipeline_stage_items_total{outcome="succeeded",stage="sink"}`])
	}
}

// TestCheckpoint: a checkpointed run exposes the position it saved and its age.
func TestCheckpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &scenario.MemStore{}
		p := scenario.Checkpointed(store, 250, pipeline.WithSaveEvery(100))
		reg := registry(p)
		require.NoError(t, p.Run(t.Context()))

		time.Sleep(90 * time.Second) // virtual time
		got, _ := samples(t, gather(t, reg))
		assert.Equal(t, 250.0, got["pipeline_checkpoint_position"])
		assert.Equal(t, 90.0, got["pipeline_checkpoint_age_seconds"])
		assert.Equal(t, int64(250), store.Pos.Load())
	})
}

// TestCheckpointResumed: a run resumed at position 100 of a declared 250 exposes the
// positions it does not read again beside its total, so that progress is
// (resumed + out) / total.
func TestCheckpointResumed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &scenario.MemStore{}
		store.Pos.Store(100)
		p := scenario.Checkpointed(store, 250, pipeline.WithTotal(250))
		reg := registry(p)
		require.NoError(t, p.Run(t.Context()))

		name := scenario.RowName(t, p, pipeline.KindSource)
		_, types := checkGathered(t, reg, map[string]float64{
			`pipeline_source_resumed_items{stage="` + name + `"}`: 100,
			`pipeline_source_total_items{stage="` + name + `"}`:   250,
			`pipeline_stage_out_total{stage="` + name + `"}`:      150,
			`pipeline_checkpoint_position`:                        250,
		})
		assert.Equal(t, dto.MetricType_GAUGE, types["pipeline_source_resumed_items"])
	})
}

// TestSourceLag: a source with WithLag exposes a gauge per partition, live (scraped
// while its first item is in the sink) and after the run; a label the source gives
// twice is one sample, the sum; a source that reports nothing (nil) and a source
// without WithLag expose none.
func TestSourceLag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		lag  []pipeline.PartitionLag // nil: the source knows nothing
		want map[string]float64
	}{
		{"partitions", []pipeline.PartitionLag{{Partition: "orders/0", Lag: 7}, {Partition: "orders/1", Lag: 0}, {Partition: "orders/10", Lag: 3}}, map[string]float64{
			`pipeline_source_lag_items{partition="orders/0",stage="orders"}`:  7,
			`pipeline_source_lag_items{partition="orders/1",stage="orders"}`:  0,
			`pipeline_source_lag_items{partition="orders/10",stage="orders"}`: 3,
		}},
		{"a label twice", []pipeline.PartitionLag{{Partition: "p", Lag: 2}, {Partition: "p", Lag: 5}}, map[string]float64{
			`pipeline_source_lag_items{partition="p",stage="orders"}`: 7,
		}},
		{"nothing known", nil, map[string]float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
				for i := range 3 {
					if err := emit(i, nil); err != nil {
						return err
					}
				}
				return nil
			}, pipeline.WithName("orders"), pipeline.WithLag(func() []pipeline.PartitionLag { return tt.lag }))
			reg := registry(p)
			var live string
			pipeline.To(src, pipeline.NewSink("sink", 1, func(context.Context, int) error {
				if live == "" { // one worker: no other call runs meanwhile
					live = gather(t, reg)
				}
				return nil
			}))
			require.NoError(t, p.Run(t.Context()))
			for when, text := range map[string]string{"live": live, "after the run": gather(t, reg)} {
				got, types := samples(t, text)
				checkSamples(t, got, tt.want, text)
				n := 0
				for k := range got {
					if strings.HasPrefix(k, "pipeline_source_lag_items") {
						n++
					}
				}
				assert.Equal(t, len(tt.want), n, "%s: the lag samples\n%s", when, text)
				if len(tt.want) > 0 {
					assert.Equal(t, dto.MetricType_GAUGE, types["pipeline_source_lag_items"])
				}
			}
		})
	}
}

// TestNoLagWithoutWithLag: a tracked source without WithLag exposes no lag.
func TestNoLagWithoutWithLag(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		return emit(1, nil)
	})
	pipeline.To(src, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	reg := registry(p)
	require.NoError(t, p.Run(t.Context()))
	assert.NotContains(t, gather(t, reg), "pipeline_source_lag_items")
}

// TestHandedBack: of a stage's dead letters, those handed back to their acknowledged
// source count in pipeline_stage_handed_back_total; a dead letter kept by the run
// (WithDeadLetter) does not.
func TestHandedBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var kept atomic.Int64
		p := scenario.HandBack(&kept)
		reg := registry(p)
		require.NoError(t, p.Run(t.Context()))

		_, types := checkGathered(t, reg, map[string]float64{
			`pipeline_stage_items_total{outcome="dead_lettered",stage="call"}`: 2,
			`pipeline_stage_handed_back_total{stage="call"}`:                   2,
			`pipeline_stage_items_total{outcome="dead_lettered",stage="sink"}`: 1,
			`pipeline_stage_handed_back_total{stage="sink"}`:                   0,
		})
		assert.Equal(t, int64(1), kept.Load())
		assert.Equal(t, dto.MetricType_COUNTER, types["pipeline_stage_handed_back_total"])
	})
}

// TestOptions: a namespace prefixes every name; const labels tell the collectors of two
// pipelines apart in one registry; labels the collector uses itself are refused.
func TestOptions(t *testing.T) {
	t.Parallel()
	newPipeline := func(n int) *pipeline.Pipeline {
		p := pipeline.New()
		pipeline.To(pipeline.FromSlice(p, make([]int, n)), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		return p
	}
	a, b := newPipeline(2), newPipeline(5)
	for _, p := range []*pipeline.Pipeline{a, b} {
		require.NoError(t, p.Run(t.Context()))
	}
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(pipelineprom.NewCollector(a, pipelineprom.WithNamespace("app"),
		pipelineprom.WithConstLabels(prometheus.Labels{"pipeline": "a"}), pipelineprom.WithConstLabels(prometheus.Labels{"env": "test"}))))
	require.NoError(t, reg.Register(pipelineprom.NewCollector(b, pipelineprom.WithNamespace("app"),
		pipelineprom.WithConstLabels(prometheus.Labels{"pipeline": "b", "env": "test"}))))
	got, _ := samples(t, gather(t, reg))
	assert.Equal(t, 2.0, got[`app_pipeline_stage_items_total{env="test",outcome="succeeded",pipeline="a",stage="sink"}`])
	assert.Equal(t, 5.0, got[`app_pipeline_stage_items_total{env="test",outcome="succeeded",pipeline="b",stage="sink"}`])

	// The same labels twice, a label of the collector's own, an invalid name.
	err := reg.Register(pipelineprom.NewCollector(b, pipelineprom.WithNamespace("app"),
		pipelineprom.WithConstLabels(prometheus.Labels{"pipeline": "b", "env": "test"})))
	require.Error(t, err)
	for _, labels := range []prometheus.Labels{{"stage": "x"}, {"outcome": "x"}, {"quantile": "x"}, {"partition": "x"}, {"__reserved": "x"}} {
		err := prometheus.NewRegistry().Register(pipelineprom.NewCollector(b, pipelineprom.WithConstLabels(labels)))
		require.Error(t, err, "%v", labels)
	}
	ch := make(chan prometheus.Metric, 1) // unregistered, an invalid collector sends its error
	pipelineprom.NewCollector(b, pipelineprom.WithConstLabels(prometheus.Labels{"stage": "x"})).Collect(ch)
	require.ErrorContains(t, (<-ch).Write(&dto.Metric{}), `the constant label "stage"`)
	assert.PanicsWithValue(t, "pipelineprom: NewCollector with a nil pipeline", func() { pipelineprom.NewCollector(nil) })
}

// BenchmarkScrape measures one scrape of a three-stage pipeline (source → parse (4
// workers) → enrich (16 workers, with a timeout and a dead-letter destination) → store (2
// workers)), while it runs (its sink blocked: Snapshot sums the live counters and
// latency histograms) and once it has finished (Snapshot returns the final report):
// Snapshot alone, the collector's Collect (Snapshot and the constant metrics), the
// registry's Gather (what promhttp calls), and Gather plus the text encoding.
func BenchmarkScrape(b *testing.B) {
	release := make(chan struct{})
	ids := make([]int, 10_000)
	for i := range ids {
		ids[i] = i
	}
	p := pipeline.New()
	parsed := pipeline.Then(pipeline.FromSlice(p, ids), pipeline.NewStage("parse", 4,
		func(_ context.Context, i int) (int, error) { return i, nil }))
	enriched := pipeline.Then(parsed, pipeline.NewStage("enrich", 16, func(_ context.Context, i int) (int, error) {
		if i%100 == 0 {
			return 0, pipeline.Permanent(errors.New("bad record"))
		}
		return i, nil
	}, pipeline.WithTimeout(time.Second), pipeline.WithDeadLetter(pipeline.NewDeadLetterBuffer[int](100).Add)))
	var stored atomic.Int64
	pipeline.To(enriched, pipeline.NewSink("store", 2, func(ctx context.Context, _ int) error {
		if stored.Add(1) < 5_000 {
			return nil
		}
		select { // from the 5,000th item on, wait for the benchmark
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	c := pipelineprom.NewCollector(p)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	done := make(chan error, 1)
	go func() { done <- p.Run(b.Context()) }()
	for stored.Load() < 5_000 { // setup: wait until the run holds items everywhere
		select {
		case err := <-done:
			b.Fatalf("the run ended early: %v", err)
		default:
			runtime.Gosched()
		}
	}
	for _, phase := range []string{"running", "finished"} {
		if phase == "finished" {
			close(release)
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
		b.Run(phase, func(b *testing.B) {
			b.Run("snapshot", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					p.Snapshot()
				}
			})
			b.Run("collect", func(b *testing.B) {
				ch := make(chan prometheus.Metric, 1000)
				b.ReportAllocs()
				for b.Loop() {
					c.Collect(ch)
					for len(ch) > 0 {
						<-ch
					}
				}
			})
			b.Run("gather", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := reg.Gather(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("gather+encode", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					fams, err := reg.Gather()
					if err != nil {
						b.Fatal(err)
					}
					enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
					for _, f := range fams {
						if err := enc.Encode(f); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		})
	}
}

// TestCollectorBreakerPerKey checks the gauges of a breaker per key, in virtual time:
// while key 1's service is down, its breaker is open and holds key 1's items, and key
// 0's go on; once it is back (before OpenFor), the probe closes it and nothing is held.
func TestCollectorBreakerPerKey(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		p := scenario.KeyOneDown(&down)
		reg := prometheus.NewRegistry()
		require.NoError(t, reg.Register(pipelineprom.NewCollector(p)))
		ran := scenario.Start(t.Context(), p)
		synctest.Wait() // key 0 done; key 1's items held until OpenFor

		_, types := checkGathered(t, reg, map[string]float64{
			`pipeline_stage_breaker_holding_items{stage="call"}`: 10,
			`pipeline_stage_breaker_keys_open{stage="call"}`:     1,
		})
		assert.Equal(t, dto.MetricType_GAUGE, types["pipeline_stage_breaker_holding_items"])
		assert.Equal(t, dto.MetricType_GAUGE, types["pipeline_stage_breaker_keys_open"])

		down.Store(false)
		require.NoError(t, <-ran)
		checkGathered(t, reg, map[string]float64{
			`pipeline_stage_breaker_holding_items{stage="call"}`:           0,
			`pipeline_stage_breaker_keys_open{stage="call"}`:               0,
			`pipeline_stage_items_total{outcome="succeeded",stage="call"}`: 20,
		})
	})
}

// TestCollectorClient checks the metrics of a stage's circuit breaker, rate limit and
// adaptive workers, in virtual time: a service down for its first 3 calls opens the
// breaker once (the first probe, at OpenFor, succeeds), and a stage without those
// options has none of them.
func TestCollectorClient(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := scenario.ClientDownThree()
		reg := prometheus.NewRegistry()
		require.NoError(t, reg.Register(pipelineprom.NewCollector(p)))
		require.NoError(t, p.Run(t.Context()))

		got, types := checkGathered(t, reg, map[string]float64{
			`pipeline_stage_breaker_state{stage="call"}`:              0,
			`pipeline_stage_breaker_open_seconds_total{stage="call"}`: 2.001, // OpenFor, then the probe's 1 ms
			`pipeline_stage_breaker_opened_total{stage="call"}`:       1,
		})
		limit, ok := got[`pipeline_stage_worker_limit{stage="call"}`]
		assert.True(t, ok)
		assert.GreaterOrEqual(t, limit, 1.0)
		assert.LessOrEqual(t, limit, 4.0)
		assert.Positive(t, got[`pipeline_stage_breaker_held_total{stage="call"}`])
		assert.Positive(t, got[`pipeline_stage_throttled_seconds_total{stage="call"}`])
		assert.Equal(t, dto.MetricType_COUNTER, types["pipeline_stage_breaker_held_total"])
		assert.Equal(t, dto.MetricType_GAUGE, types["pipeline_stage_breaker_state"])
		for _, m := range []string{"breaker_state", "worker_limit", "throttled_seconds_total", "breaker_opened_total"} {
			assert.NotContains(t, got, `pipeline_stage_`+m+`{stage="plain"}`)
		}
	})
}
