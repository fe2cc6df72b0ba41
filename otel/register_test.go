package pipelineotel_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
	pipelineotel "github.com/gopipeline/pipeline/otel"
)

// TestS1Retry runs scenario S1 with the retry policy (in virtual time) and collects its
// figures through the SDK.
func TestS1Retry(t *testing.T) {
	fx := scenario.LoadS1(t, "../bench/testdata/items.json")
	synctest.Test(t, func(t *testing.T) {
		p := scenario.S1Retry(fx, nil)
		got := collectRun(t, p)
		src := scenario.RowName(t, p, pipeline.KindSource)
		checkValues(t, got, map[string]float64{
			`pipeline.stage.input{pipeline.stage=` + src + `}`:                                               10_000,
			`pipeline.stage.output{pipeline.stage=` + src + `}`:                                              10_000,
			`pipeline.run.active`:                                                                            0,
			`pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=enrich}`:                         9_895,
			`pipeline.stage.items{pipeline.outcome=dead_lettered,pipeline.stage=enrich}`:                     105,
			`pipeline.stage.items{pipeline.outcome=failed,pipeline.stage=enrich}`:                            0,
			`pipeline.stage.items{pipeline.outcome=not_started,pipeline.stage=enrich}`:                       0,
			`pipeline.stage.retries{pipeline.stage=enrich}`:                                                  200,
			`pipeline.stage.input{pipeline.stage=enrich}`:                                                    10_000,
			`pipeline.stage.output{pipeline.stage=enrich}`:                                                   9_895,
			`pipeline.stage.in_flight{pipeline.stage=enrich}`:                                                0,
			`pipeline.stage.errors{error.type=error,pipeline.outcome=retried,pipeline.stage=enrich}`:         200,
			`pipeline.stage.errors{error.type=error,pipeline.outcome=dead_lettered,pipeline.stage=enrich}`:   100,
			`pipeline.stage.errors{error.type=timeout,pipeline.outcome=dead_lettered,pipeline.stage=enrich}`: 5,
			`pipeline.stage.workers{pipeline.stage=enrich,pipeline.worker.state=busy}`:                       0,
			`pipeline.stage.workers{pipeline.stage=enrich,pipeline.worker.state=idle}`:                       20,
			`pipeline.stage.queue.length{pipeline.stage=enrich}`:                                             0,
			`pipeline.stage.queue.capacity{pipeline.stage=enrich}`:                                           100,
			`pipeline.stage.attempt.timeout{pipeline.stage=enrich}`:                                          1,
			`pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=sink}`:                           9_895,
		})
		assert.NotContains(t, got, "pipeline.checkpoint.position", "not a checkpointed run")

		items := got[`pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=enrich}`]
		assert.Equal(t, "sum", items.kind, "a count that resets at each run is not monotonic")
		assert.Equal(t, metricdata.CumulativeTemporality, items.temporality)
		assert.Equal(t, "{item}", items.unit)
		duration := got[`pipeline.stage.attempt.duration{pipeline.quantile=0.5,pipeline.stage=enrich}`]
		assert.Equal(t, "gauge", duration.kind)
		assert.Equal(t, "s", duration.unit)
		assert.InEpsilon(t, 0.001, duration.value, 0.125)
		assert.InEpsilon(t, 1, got[`pipeline.stage.attempt.duration{pipeline.quantile=1,pipeline.stage=enrich}`].value, 0.125)
		timed := got[`pipeline.stage.attempt.timed{pipeline.stage=enrich}`].value
		assert.True(t, timed > 9_000 && timed <= 10_200, "timed %v of 10,200 attempts", timed)
	})
}

// TestCollectDuringRun collects a run whose sink is blocked: the queues in front of it
// are full and its worker is busy.
func TestCollectDuringRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		p := scenario.StoreBlocked(release)
		reader := register(t, p)

		done := scenario.Start(t.Context(), p)
		synctest.Wait() // every goroutine of the run is blocked: the sink on release, the rest on full queues

		got := collect(t, reader)
		checkValues(t, got, map[string]float64{
			`pipeline.run.active`:                                                     1,
			`pipeline.stage.queue.length{pipeline.stage=store}`:                       4,
			`pipeline.stage.queue.capacity{pipeline.stage=store}`:                     4,
			`pipeline.stage.queue.length{pipeline.stage=double}`:                      4,
			`pipeline.stage.workers{pipeline.stage=store,pipeline.worker.state=busy}`: 1,
			`pipeline.stage.workers{pipeline.stage=store,pipeline.worker.state=idle}`: 0,
			`pipeline.stage.in_flight{pipeline.stage=store}`:                          1,
			`pipeline.stage.items{pipeline.outcome=not_started,pipeline.stage=store}`: 4,
			`pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=store}`:   0,
			`pipeline.stage.output{pipeline.stage=store}`:                             0,
		})
		// in = the sum of the outcomes + in flight.
		for _, stage := range []string{"double", "store"} {
			sum := got[`pipeline.stage.in_flight{pipeline.stage=`+stage+`}`].value
			for _, o := range []string{"succeeded", "dead_lettered", "failed", "not_started"} {
				sum += got[`pipeline.stage.items{pipeline.outcome=`+o+`,pipeline.stage=`+stage+`}`].value
			}
			assert.Equal(t, got[`pipeline.stage.input{pipeline.stage=`+stage+`}`].value, sum, stage)
		}

		close(release)
		require.NoError(t, <-done)
		got = collect(t, reader)
		checkValues(t, got, map[string]float64{
			`pipeline.run.active`: 0,
			`pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=store}`: 100,
			`pipeline.stage.queue.length{pipeline.stage=store}`:                     0,
		})
	})
}

// TestOldestAttempt collects the age of a stuck attempt (a function that ignores its
// context under WithTimeout) during the run, and 0 after it.
func TestOldestAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		p := scenario.StuckAttempt(release)
		reader := register(t, p)

		done := scenario.Start(t.Context(), p)
		time.Sleep(time.Second)
		synctest.Wait()
		got := collect(t, reader)
		age := got[`pipeline.stage.attempt.oldest{pipeline.stage=wait}`].value
		assert.True(t, age > 0.9 && age <= 1, "age %v s, 1 s into the attempt", age)

		close(release)
		require.NoError(t, <-done)
		checkValues(t, collect(t, reader), map[string]float64{`pipeline.stage.attempt.oldest{pipeline.stage=wait}`: 0})
	})
}

// TestCollectOrderedDuringRun: the finished items an ordered stage holds for an earlier
// one count as succeeded during a run.
func TestCollectOrderedDuringRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		p := scenario.OrderedHeadHeld(release) // the head item is slow: the others wait in the window
		reader := register(t, p)

		done := scenario.Start(t.Context(), p)
		synctest.Wait()
		checkValues(t, collect(t, reader), map[string]float64{
			`pipeline.stage.reorder.held{pipeline.stage=ordered}`:                     3,
			`pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=ordered}`: 3,
			`pipeline.stage.items{pipeline.outcome=failed,pipeline.stage=ordered}`:    0,
			`pipeline.stage.in_flight{pipeline.stage=ordered}`:                        1,
		})
		close(release)
		require.NoError(t, <-done)
		checkValues(t, collect(t, reader), map[string]float64{
			`pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=ordered}`: 4,
			`pipeline.stage.output{pipeline.stage=ordered}`:                           4,
		})
	})
}

// TestFilterAndBatch: a filter's dropped items and a batch's flushes by reason.
func TestFilterAndBatch(t *testing.T) {
	defer goleak.VerifyNone(t)
	p := scenario.FilterBatch()
	require.NoError(t, p.Run(t.Context()))

	reader := register(t, p)
	got := collect(t, reader)
	filter, batch := scenario.RowName(t, p, pipeline.KindFilter), scenario.RowName(t, p, pipeline.KindBatch)
	checkValues(t, got, map[string]float64{
		`pipeline.stage.items{pipeline.outcome=filtered,pipeline.stage=` + filter + `}`:         3,
		`pipeline.batch.flushes{pipeline.flush.reason=size,pipeline.stage=` + batch + `}`:       1,
		`pipeline.batch.flushes{pipeline.flush.reason=end,pipeline.stage=` + batch + `}`:        1,
		`pipeline.batch.flushes{pipeline.flush.reason=bytes,pipeline.stage=` + batch + `}`:      0,
		`pipeline.batch.flushes{pipeline.flush.reason=linger,pipeline.stage=` + batch + `}`:     0,
		`pipeline.batch.flushes{pipeline.flush.reason=checkpoint,pipeline.stage=` + batch + `}`: 0,
		`pipeline.stage.input{pipeline.stage=` + batch + `}`:                                    3,
		`pipeline.stage.output{pipeline.stage=` + batch + `}`:                                   2,
		`pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=save}`:                  2,
	})
	assert.NotContains(t, got, `pipeline.stage.attempt.timed{pipeline.stage=`+batch+`}`, "a batch calls no function")
	assert.NotContains(t, got, `pipeline.stage.input{pipeline.stage=`+filter+`}`, "a filter counts what it drops only")
}

// TestBeforeFirstRun: a pipeline that never ran is observed as not running, and nothing
// else.
func TestBeforeFirstRun(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []int{1}), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	reader := register(t, p)
	got := collect(t, reader)
	assert.Len(t, got, 1)
	checkValues(t, got, map[string]float64{`pipeline.run.active`: 0})
}

// TestCheckpoint: a checkpointed run observes the position it saved and its age.
func TestCheckpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &scenario.MemStore{}
		p := scenario.Checkpointed(store, 250, pipeline.WithSaveEvery(100))
		reader := register(t, p)
		require.NoError(t, p.Run(t.Context()))

		time.Sleep(90 * time.Second) // virtual time
		checkValues(t, collect(t, reader), map[string]float64{
			`pipeline.checkpoint.position`: 250,
			`pipeline.checkpoint.age`:      90,
		})
	})
}

// TestCheckpointResumed: a run resumed at position 100 of a declared 250 observes the
// positions it does not read again beside its total, so that progress is
// (resumed + output) / total.
func TestCheckpointResumed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &scenario.MemStore{}
		store.Pos.Store(100)
		p := scenario.Checkpointed(store, 250, pipeline.WithTotal(250))
		got := collectRun(t, p)
		name := scenario.RowName(t, p, pipeline.KindSource)
		checkValues(t, got, map[string]float64{
			`pipeline.source.resumed{pipeline.stage=` + name + `}`: 100,
			`pipeline.source.total{pipeline.stage=` + name + `}`:   250,
			`pipeline.stage.output{pipeline.stage=` + name + `}`:   150,
		})
		assert.Equal(t, "gauge", got[`pipeline.source.resumed{pipeline.stage=`+name+`}`].kind)
		assert.Equal(t, "{item}", got[`pipeline.source.resumed{pipeline.stage=`+name+`}`].unit)
	})
}

// TestSourceLag: a source with WithLag is observed with a gauge per partition, live
// (collected while its first item is in the sink) and after the run; a label the
// source gives twice is one point, the sum; a source that reports nothing (nil) and a
// source without WithLag have none.
func TestSourceLag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		lag     []pipeline.PartitionLag // nil: the source knows nothing
		withLag bool
		want    map[string]float64
	}{
		{"partitions", []pipeline.PartitionLag{{Partition: "orders/0", Lag: 7}, {Partition: "orders/1", Lag: 0}}, true, map[string]float64{
			`pipeline.source.lag{pipeline.partition=orders/0,pipeline.stage=orders}`: 7,
			`pipeline.source.lag{pipeline.partition=orders/1,pipeline.stage=orders}`: 0,
		}},
		{"a label twice", []pipeline.PartitionLag{{Partition: "p", Lag: 2}, {Partition: "p", Lag: 5}}, true, map[string]float64{
			`pipeline.source.lag{pipeline.partition=p,pipeline.stage=orders}`: 7,
		}},
		{"nothing known", nil, true, map[string]float64{}},
		{"without WithLag", nil, false, map[string]float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			opts := []pipeline.AckOption{pipeline.WithName("orders")}
			if tt.withLag {
				opts = append(opts, pipeline.WithLag(func() []pipeline.PartitionLag { return tt.lag }))
			}
			src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
				for i := range 3 {
					if err := emit(i, nil); err != nil {
						return err
					}
				}
				return nil
			}, opts...)
			reader := register(t, p)
			var live map[string]point
			pipeline.To(src, pipeline.NewSink("sink", 1, func(context.Context, int) error {
				if live == nil { // one worker: no other call runs meanwhile
					live = collect(t, reader)
				}
				return nil
			}))
			require.NoError(t, p.Run(t.Context()))
			for when, got := range map[string]map[string]point{"live": live, "after the run": collect(t, reader)} {
				checkValues(t, got, tt.want)
				n := 0
				for k, pt := range got {
					if strings.HasPrefix(k, "pipeline.source.lag{") {
						n++
						assert.Equal(t, "gauge", pt.kind, k)
						assert.Equal(t, "{item}", pt.unit, k)
					}
				}
				assert.Equal(t, len(tt.want), n, "%s: the lag points", when)
			}
		})
	}
}

// TestHandedBack: of a stage's dead letters, those handed back to their acknowledged
// source count in pipeline.stage.handed_back; a dead letter kept by the run
// (WithDeadLetter) does not.
func TestHandedBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var kept atomic.Int64
		p := scenario.HandBack(&kept)
		got := collectRun(t, p)
		checkValues(t, got, map[string]float64{
			`pipeline.stage.items{pipeline.outcome=dead_lettered,pipeline.stage=call}`: 2,
			`pipeline.stage.handed_back{pipeline.stage=call}`:                          2,
			`pipeline.stage.items{pipeline.outcome=dead_lettered,pipeline.stage=sink}`: 1,
			`pipeline.stage.handed_back{pipeline.stage=sink}`:                          0,
		})
		assert.Equal(t, "sum", got[`pipeline.stage.handed_back{pipeline.stage=call}`].kind)
	})
}

// TestCountsPerRun: each run counts from zero, which a non-monotonic sum may do.
func TestCountsPerRun(t *testing.T) {
	t.Parallel()
	n := 0 // items of the next run
	p := scenario.ItemsPerRun(&n)
	reader := register(t, p)
	for _, n = range []int{5, 3} {
		require.NoError(t, p.Run(t.Context()))
		checkValues(t, collect(t, reader), map[string]float64{
			`pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=sink}`: float64(n),
		})
	}
}

// TestAttributesAndUnregister: WithAttributes tells two pipelines apart in one meter,
// and Unregister stops observing a pipeline.
func TestAttributesAndUnregister(t *testing.T) {
	t.Parallel()
	reader, provider := newReader(t)
	meter := provider.Meter("test")
	var regs []func() error
	for _, name := range []string{"orders", "refunds"} {
		p := pipeline.New()
		pipeline.To(pipeline.FromSlice(p, make([]int, len(name))), pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		require.NoError(t, p.Run(t.Context()))
		reg, err := pipelineotel.Register(p, meter, pipelineotel.WithAttributes(attribute.String("pipeline.name", name)),
			pipelineotel.WithAttributes(attribute.String("pipeline.stage", "overridden")))
		require.NoError(t, err)
		regs = append(regs, reg.Unregister)
	}
	checkValues(t, collect(t, reader), map[string]float64{
		`pipeline.stage.items{pipeline.name=orders,pipeline.outcome=succeeded,pipeline.stage=sink}`:  6,
		`pipeline.stage.items{pipeline.name=refunds,pipeline.outcome=succeeded,pipeline.stage=sink}`: 7,
		`pipeline.run.active{pipeline.name=orders,pipeline.stage=overridden}`:                        0,
	})

	require.NoError(t, regs[0]())
	got := collect(t, reader)
	assert.NotContains(t, got, `pipeline.stage.items{pipeline.name=orders,pipeline.outcome=succeeded,pipeline.stage=sink}`)
	assert.Contains(t, got, `pipeline.stage.items{pipeline.name=refunds,pipeline.outcome=succeeded,pipeline.stage=sink}`)
	require.NoError(t, regs[1]())

	assert.PanicsWithValue(t, "pipelineotel: Register with a nil pipeline or meter", func() { _, _ = pipelineotel.Register(nil, meter) })
}

// BenchmarkCollect measures one collection through the SDK's manual reader of a
// finished three-stage pipeline (source → parse → enrich → store): one Snapshot and
// every data point.
func BenchmarkCollect(b *testing.B) {
	p := pipeline.New()
	parsed := pipeline.Then(pipeline.FromSlice(p, make([]int, 1000)), pipeline.NewStage("parse", 4,
		func(_ context.Context, i int) (int, error) { return i, nil }))
	enriched := pipeline.Then(parsed, pipeline.NewStage("enrich", 16, func(_ context.Context, i int) (int, error) { return i, nil },
		pipeline.WithTimeout(time.Second)))
	pipeline.To(enriched, pipeline.NewSink("store", 2, func(context.Context, int) error { return nil }))
	if err := p.Run(b.Context()); err != nil {
		b.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(b.Context()) }()
	if _, err := pipelineotel.Register(p, provider.Meter("bench")); err != nil {
		b.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	b.ReportAllocs()
	for b.Loop() {
		if err := reader.Collect(b.Context(), &rm); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBreakerPerKey collects the instruments of a breaker per key, in virtual time:
// while key 1's service is down, its breaker is open and holds key 1's items, and key
// 0's go on; once it is back (before OpenFor), the probe closes it and nothing is held.
func TestBreakerPerKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		p := scenario.KeyOneDown(&down)
		reader := register(t, p)
		ran := scenario.Start(t.Context(), p)
		synctest.Wait() // key 0 done; key 1's items held until OpenFor

		checkValues(t, collect(t, reader), map[string]float64{
			`pipeline.stage.breaker.holding{pipeline.stage=call}`:   10,
			`pipeline.stage.breaker.keys_open{pipeline.stage=call}`: 1,
		})
		down.Store(false)
		require.NoError(t, <-ran)
		got := collect(t, reader)
		checkValues(t, got, map[string]float64{
			`pipeline.stage.breaker.holding{pipeline.stage=call}`:   0,
			`pipeline.stage.breaker.keys_open{pipeline.stage=call}`: 0,
		})
		assert.Equal(t, "{item}", got[`pipeline.stage.breaker.holding{pipeline.stage=call}`].unit)
	})
}

// TestClient collects the instruments of a stage's circuit breaker, rate limit and
// adaptive workers, in virtual time: a service down for its first 3 calls opens the
// breaker once, for OpenFor and the successful probe's 1 ms.
func TestClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := scenario.ClientDownThree()
		got := collectRun(t, p)
		checkValues(t, got, map[string]float64{
			`pipeline.stage.breaker.state{pipeline.breaker.state=closed,pipeline.stage=call}`:    1,
			`pipeline.stage.breaker.state{pipeline.breaker.state=open,pipeline.stage=call}`:      0,
			`pipeline.stage.breaker.state{pipeline.breaker.state=half_open,pipeline.stage=call}`: 0,
			`pipeline.stage.breaker.open_time{pipeline.stage=call}`:                              2.001,
			`pipeline.stage.breaker.openings{pipeline.stage=call}`:                               1,
		})
		assert.Positive(t, got[`pipeline.stage.breaker.held{pipeline.stage=call}`].value)
		assert.Positive(t, got[`pipeline.stage.throttled{pipeline.stage=call}`].value)
		limit := got[`pipeline.stage.worker.limit{pipeline.stage=call}`].value
		assert.True(t, limit >= 1 && limit <= 4, "limit %v", limit)
		assert.NotContains(t, got, `pipeline.stage.worker.limit{pipeline.stage=plain}`)
		assert.NotContains(t, got, `pipeline.stage.breaker.openings{pipeline.stage=plain}`)
	})
}
