package pipelineotel

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/gopipeline/pipeline"
)

// Option configures [Register].
type Option interface {
	apply(*config)
}

type config struct {
	attrs []attribute.KeyValue
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithAttributes adds attributes to every observation, such as
// attribute.String("pipeline.name", "ingest") to tell the pipelines of one process
// apart. Several WithAttributes add up; an attribute the package sets itself
// (pipeline.stage, pipeline.outcome, ...) overrides one given here.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) { c.attrs = append(c.attrs, attrs...) })
}

// Attribute keys set by the package.
const (
	keyStage        = attribute.Key("pipeline.stage")
	keyOutcome      = attribute.Key("pipeline.outcome")
	keyErrorType    = attribute.Key("error.type")
	keyWorkerState  = attribute.Key("pipeline.worker.state")
	keyQuantile     = attribute.Key("pipeline.quantile")
	keyReason       = attribute.Key("pipeline.flush.reason")
	keyBreakerState = attribute.Key("pipeline.breaker.state")
	keyPartition    = attribute.Key("pipeline.partition")
)

// instruments are the observable instruments of one registration.
type instruments struct {
	active                            metric.Int64ObservableUpDownCounter
	elapsed                           metric.Float64ObservableGauge
	items, input, output, inFlight    metric.Int64ObservableUpDownCounter
	retries, errs, flushes            metric.Int64ObservableUpDownCounter
	queueLen, queueCap, workers, held metric.Int64ObservableUpDownCounter
	queuePeak                         metric.Int64ObservableGauge
	duration, timeout, oldestAttempt  metric.Float64ObservableGauge
	timed                             metric.Int64ObservableUpDownCounter
	checkpointPosition                metric.Int64ObservableGauge
	checkpointAge                     metric.Float64ObservableGauge
	handedBack                        metric.Int64ObservableUpDownCounter
	total, resumed, lag               metric.Int64ObservableGauge

	// Clients of a service (WithRateLimit, WithCircuitBreaker, WithAdaptiveWorkers).
	workerLimit, breakerState, breakerOpened, breakerHeld metric.Int64ObservableUpDownCounter
	throttled, breakerOpen                                metric.Float64ObservableGauge
	breakerHolding, breakerKeysOpen                       metric.Int64ObservableUpDownCounter // a breaker per key
}

// Register creates the package's instruments (see the package documentation) on meter
// and registers one callback that observes them from a [pipeline.Pipeline.Snapshot] of
// p at each collection. Unregister the returned registration to stop observing p; the
// instruments stay in the meter. Register returns an error if meter refuses an
// instrument or the callback; it panics if p or meter is nil. It starts no goroutine,
// and the callback is safe to run while p runs.
func Register(p *pipeline.Pipeline, meter metric.Meter, opts ...Option) (metric.Registration, error) {
	if p == nil || meter == nil {
		panic("pipelineotel: Register with a nil pipeline or meter")
	}
	var cfg config
	for _, o := range opts {
		o.apply(&cfg)
	}

	var in instruments
	var all []metric.Observable
	var errs []error
	// One row an instrument: the loop makes it and adds it to the callback's list, so
	// that none is made and left unobserved. dst is the field of in to set: its type
	// says the kind of instrument.
	for _, d := range []struct {
		dst              any
		name, unit, desc string
	}{
		{&in.active, "pipeline.run.active", "{run}", "1 while a run of the pipeline is in progress, else 0."},
		{&in.elapsed, "pipeline.run.elapsed", "s", "Time since the current run started; between runs, the duration of the last run."},
		{&in.items, "pipeline.stage.items", "{item}", "Items of the current or last run, by outcome: succeeded, dead_lettered, failed, not_started or filtered."},
		{&in.input, "pipeline.stage.input", "{item}", "Items that reached the stage in the current or last run (a source: the items it holds, when known)."},
		{&in.output, "pipeline.stage.output", "{item}", "Items the stage sent on in the current or last run."},
		{&in.handedBack, "pipeline.stage.handed_back", "{item}", "Of the items the stage dead-lettered in the current or last run, those it handed back to their acknowledged source (WithHandBack) for a later delivery."},
		{&in.total, "pipeline.source.total", "{item}", "Items the source holds (FromSlice) or declared (WithTotal), earlier runs' included for a checkpointed one; not observed when unknown."},
		{&in.resumed, "pipeline.source.resumed", "{item}", "Positions of a checkpointed source (FromCheckpoint) that earlier runs settled and this run does not read again; progress is (resumed + output) / total."},
		{&in.lag, "pipeline.source.lag", "{item}", "Items a source with WithLag has behind on a partition (for Kafka: the high watermark minus the committed offset), when it was observed."},
		{&in.inFlight, "pipeline.stage.in_flight", "{item}", "Items the stage started and has not settled yet."},
		{&in.retries, "pipeline.stage.retries", "{retry}", "Extra attempts the stage made in the current or last run."},
		{&in.errs, "pipeline.stage.errors", "{error}", "Errors of the stage function in the current or last run, by type and by what they did: retried, dead_lettered or failed."},
		{&in.flushes, "pipeline.batch.flushes", "{batch}", "Batches flushed in the current or last run, by reason: size, bytes, linger, checkpoint (a checkpointed source waited for its items) or end."},
		{&in.queueLen, "pipeline.stage.queue.length", "{item}", "Items waiting in the stage's input queue."},
		{&in.queueCap, "pipeline.stage.queue.capacity", "{item}", "Capacity of the stage's input queue."},
		{&in.queuePeak, "pipeline.stage.queue.peak", "{item}", "The longest the stage's input queue was in the current or last run."},
		{&in.workers, "pipeline.stage.workers", "{worker}", "Workers of the stage, by state: busy (handling an item) or idle."},
		{&in.held, "pipeline.stage.reorder.held", "{item}", "Finished items an ordered stage holds until earlier ones finish; for a window stage, the items in its open windows."},
		{&in.duration, "pipeline.stage.attempt.duration", "s", "Duration of the stage function's attempts in the current or last run, at quantiles 0.5, 0.9, 0.99 (within 12.5 %) and 1 (the max)."},
		{&in.timed, "pipeline.stage.attempt.timed", "{attempt}", "Attempts behind pipeline.stage.attempt.duration (fast stages time one in 64)."},
		{&in.timeout, "pipeline.stage.attempt.timeout", "s", "The stage's per-attempt timeout (WithTimeout)."},
		{&in.oldestAttempt, "pipeline.stage.attempt.oldest", "s", "Age of the oldest running attempt of a stage with WithTimeout, once it has run a quarter of the timeout (0 otherwise); past the timeout, its function does not return after its context is done."},
		{&in.checkpointPosition, "pipeline.checkpoint.position", "{item}", "The position a checkpointed run saved last."},
		{&in.checkpointAge, "pipeline.checkpoint.age", "s", "Time since a checkpointed run last saved its position."},
		{&in.workerLimit, "pipeline.stage.worker.limit", "{worker}", "Workers an adaptive stage (WithAdaptiveWorkers) lets take items now."},
		{&in.throttled, "pipeline.stage.throttled", "s", "Time the stage's workers spent waiting for rate-limit tokens (WithRateLimit), together, in the current or last run."},
		{&in.breakerState, "pipeline.stage.breaker.state", "{breaker}", "The stage's circuit breaker (WithCircuitBreaker): 1 for its state (closed, open or half_open), 0 for the others."},
		{&in.breakerOpen, "pipeline.stage.breaker.open_time", "s", "Time the stage's circuit breaker spent open or half-open in the current or last run (a WithSharedBreaker: since it was made)."},
		{&in.breakerOpened, "pipeline.stage.breaker.openings", "{opening}", "Times the stage's circuit breaker opened in the current or last run (a WithSharedBreaker: since it was made)."},
		{&in.breakerHeld, "pipeline.stage.breaker.held", "{attempt}", "Failed attempts the stage's circuit breaker held (not counted against their items) in the current or last run."},
		{&in.breakerHolding, "pipeline.stage.breaker.holding", "{item}", "Items a breaker per key (WithBreakerPerKey) holds now out of the workers' hands, for keys whose breaker is not closed."},
		{&in.breakerKeysOpen, "pipeline.stage.breaker.keys_open", "{key}", "Keys whose breaker is not closed now, of a breaker per key (WithBreakerPerKey)."},
	} {
		unit, desc := metric.WithUnit(d.unit), metric.WithDescription(d.desc)
		var inst metric.Observable
		var err error
		switch dst := d.dst.(type) {
		case *metric.Int64ObservableUpDownCounter:
			*dst, err = meter.Int64ObservableUpDownCounter(d.name, unit, desc)
			inst = *dst
		case *metric.Int64ObservableGauge:
			*dst, err = meter.Int64ObservableGauge(d.name, unit, desc)
			inst = *dst
		case *metric.Float64ObservableGauge:
			*dst, err = meter.Float64ObservableGauge(d.name, unit, desc)
			inst = *dst
		default: // a field of a kind the switch does not make
			panic(fmt.Sprintf("pipelineotel: instrument %s of type %T", d.name, d.dst))
		}
		errs = append(errs, err)
		all = append(all, inst)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		observe(o, &in, p.Snapshot(), cfg.attrs)
		return nil
	}, all...)
}

// observe records the figures of one snapshot.
func observe(o metric.Observer, in *instruments, r pipeline.Report, base []attribute.KeyValue) {
	// attrs returns the options for one data point: base, then kvs.
	attrs := func(kvs ...attribute.KeyValue) metric.MeasurementOption {
		all := make([]attribute.KeyValue, 0, len(base)+len(kvs))
		return metric.WithAttributes(append(append(all, base...), kvs...)...)
	}
	count := func(inst metric.Int64Observable, v int64, kvs ...attribute.KeyValue) {
		o.ObserveInt64(inst, v, attrs(kvs...))
	}
	seconds := func(inst metric.Float64Observable, d time.Duration, kvs ...attribute.KeyValue) {
		o.ObserveFloat64(inst, d.Seconds(), attrs(kvs...))
	}

	active := int64(0)
	if r.Running {
		active = 1
	}
	count(in.active, active)
	if len(r.Stages) == 0 { // no run yet: the zero Report
		return
	}
	seconds(in.elapsed, r.Elapsed)
	if r.Checkpoint >= 0 {
		count(in.checkpointPosition, r.Checkpoint)
		if !r.CheckpointSaved.IsZero() {
			seconds(in.checkpointAge, max(time.Since(r.CheckpointSaved), 0))
		}
	}

	for i := range r.Stages {
		s := &r.Stages[i]
		stage := keyStage.String(s.Name)
		if s.Kind == pipeline.KindFilter {
			count(in.items, s.Filtered, stage, keyOutcome.String("filtered"))
			continue
		}
		succeeded, failed, inFlight := settled(r, s)
		count(in.items, succeeded, stage, keyOutcome.String("succeeded"))
		count(in.items, s.DeadLettered, stage, keyOutcome.String("dead_lettered"))
		count(in.items, failed, stage, keyOutcome.String("failed"))
		count(in.items, s.NotStarted, stage, keyOutcome.String("not_started"))
		count(in.input, s.In, stage)
		count(in.output, s.Out, stage)
		count(in.inFlight, inFlight, stage)
		if s.Kind == pipeline.KindSource {
			if s.Total > 0 {
				count(in.total, s.Total, stage)
			}
			if r.Checkpoint >= 0 {
				count(in.resumed, s.Resumed, stage)
			}
			for _, l := range s.Lag { // labels are unique: the report adds up a label given twice
				count(in.lag, l.Lag, stage, keyPartition.String(l.Partition))
			}
			continue
		}

		count(in.handedBack, s.HandedBack, stage)
		count(in.retries, s.Retried, stage)
		for _, e := range s.Errors {
			typ := keyErrorType.String(e.Type)
			count(in.errs, e.Retried, stage, typ, keyOutcome.String("retried"))
			count(in.errs, e.DeadLettered, stage, typ, keyOutcome.String("dead_lettered"))
			count(in.errs, e.Failed, stage, typ, keyOutcome.String("failed"))
		}
		count(in.queueLen, int64(s.QueueLen), stage)
		count(in.queueCap, int64(s.QueueCap), stage)
		count(in.queuePeak, int64(s.PeakQueue), stage)
		count(in.workers, int64(s.Busy), stage, keyWorkerState.String("busy"))
		count(in.workers, int64(s.Workers-s.Busy), stage, keyWorkerState.String("idle"))
		observeClient(in, s, stage, count, seconds)
		if s.Kind == pipeline.KindBatch {
			count(in.flushes, s.Flushes.Size, stage, keyReason.String("size"))
			count(in.flushes, s.Flushes.Bytes, stage, keyReason.String("bytes"))
			count(in.flushes, s.Flushes.Linger, stage, keyReason.String("linger"))
			count(in.flushes, s.Flushes.Checkpoint, stage, keyReason.String("checkpoint"))
			count(in.flushes, s.Flushes.End, stage, keyReason.String("end"))
			continue
		}

		count(in.held, s.Window, stage)
		count(in.timed, s.Latency.Count, stage)
		if s.Latency.Count > 0 {
			seconds(in.duration, s.Latency.P50, stage, keyQuantile.String("0.5"))
			seconds(in.duration, s.Latency.P90, stage, keyQuantile.String("0.9"))
			seconds(in.duration, s.Latency.P99, stage, keyQuantile.String("0.99"))
			seconds(in.duration, s.Latency.Max, stage, keyQuantile.String("1"))
		}
		if s.Timeout > 0 {
			seconds(in.timeout, s.Timeout, stage)
			seconds(in.oldestAttempt, s.OldestAttempt, stage)
		}
	}
}

// settled returns a stage's succeeded, failed and in-flight counts. A live snapshot
// counts the items still moving (an ordered stage's reorder window, a source's item in
// hand) as succeeded or in flight, so these only grow during a run.
func settled(_ pipeline.Report, s *pipeline.StageReport) (succeeded, failed, inFlight int64) {
	return s.Succeeded, s.Failed, s.InFlight
}

// observeClient records the figures of a stage's rate limit, circuit breaker and
// adaptive workers, for the stages that have them.
func observeClient(in *instruments, s *pipeline.StageReport, stage attribute.KeyValue,
	count func(metric.Int64Observable, int64, ...attribute.KeyValue), seconds func(metric.Float64Observable, time.Duration, ...attribute.KeyValue),
) {
	if s.LimitHistory != nil {
		count(in.workerLimit, int64(s.Limit), stage)
	}
	if s.Throttled > 0 {
		seconds(in.throttled, s.Throttled, stage)
	}
	b := s.Breaker
	if b == nil {
		return
	}
	for _, st := range []pipeline.BreakerState{pipeline.BreakerClosed, pipeline.BreakerOpen, pipeline.BreakerHalfOpen} {
		v := int64(0)
		if b.State == st {
			v = 1
		}
		count(in.breakerState, v, stage, keyBreakerState.String(strings.ReplaceAll(st.String(), "-", "_")))
	}
	seconds(in.breakerOpen, b.TimeOpen, stage)
	count(in.breakerOpened, b.Opened, stage)
	count(in.breakerHeld, b.Held, stage)
	if b.PerKey {
		count(in.breakerHolding, b.Holding, stage)
		count(in.breakerKeysOpen, int64(b.KeysOpen), stage)
	}
}
