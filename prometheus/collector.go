package pipelineprom

import (
	"fmt"
	"maps"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gopipeline/pipeline"
)

// Option configures a [Collector] (see [NewCollector]).
type Option interface {
	apply(*config)
}

type config struct {
	namespace string
	labels    prometheus.Labels
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithNamespace prefixes every metric name with ns and an underscore
// ("ns_pipeline_running"). The default is no prefix.
func WithNamespace(ns string) Option {
	return optionFunc(func(c *config) { c.namespace = ns })
}

// WithConstLabels adds labels with fixed values to every metric, such as
// {"pipeline": "ingest"} to tell the pipelines of one process apart: two collectors
// registered in one registry need different values. The labels must not be named
// "stage", "kind", "outcome", "type", "reason", "quantile" or "partition", nor start with "__":
// registering the collector fails if they do. Several WithConstLabels add up.
func WithConstLabels(labels prometheus.Labels) Option {
	return optionFunc(func(c *config) {
		if c.labels == nil {
			c.labels = prometheus.Labels{}
		}
		maps.Copy(c.labels, labels)
	})
}

// Collector is a [prometheus.Collector] of one pipeline's metrics. It reads
// [pipeline.Pipeline.Snapshot] once per Collect and starts no goroutine. It is safe for
// concurrent use, also while the pipeline runs. Create one with [NewCollector].
type Collector struct {
	p   *pipeline.Pipeline
	err error // an invalid option: every descriptor is invalid, Collect sends the error

	running, elapsed                  *prometheus.Desc
	info, in, out, items, notStarted  *prometheus.Desc
	retries, errs, flushes            *prometheus.Desc
	queueLen, queueCap, queuePeak     *prometheus.Desc
	workers, busy, inFlight, held     *prometheus.Desc
	latency, timeout, oldestAttempt   *prometheus.Desc
	checkpointPosition, checkpointAge *prometheus.Desc
	handedBack, total, resumed        *prometheus.Desc
	lag                               *prometheus.Desc

	// Clients of a service (WithRateLimit, WithCircuitBreaker, WithAdaptiveWorkers).
	workerLimit, throttled                                *prometheus.Desc
	breakerState, breakerOpen, breakerOpened, breakerHeld *prometheus.Desc
	breakerHolding, breakerKeysOpen                       *prometheus.Desc // a breaker per key
}

// NewCollector returns a collector of the metrics of p, which it reads on each scrape;
// the package documentation lists them. Register it in a [prometheus.Registry]: the
// registry's Register returns an error for invalid options. NewCollector panics if p is
// nil.
func NewCollector(p *pipeline.Pipeline, opts ...Option) *Collector {
	if p == nil {
		panic("pipelineprom: NewCollector with a nil pipeline")
	}
	var cfg config
	for _, o := range opts {
		o.apply(&cfg)
	}
	var err error
	for _, l := range ownLabels {
		if _, ok := cfg.labels[l]; ok {
			err = fmt.Errorf("pipelineprom: the constant label %q is a label of the collector's own metrics", l)
		}
	}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		if err != nil {
			return prometheus.NewInvalidDesc(err)
		}
		return prometheus.NewDesc(prometheus.BuildFQName(cfg.namespace, "", name), help, labels, cfg.labels)
	}
	return &Collector{
		p:       p,
		err:     err,
		running: desc("pipeline_running", "1 while a run of the pipeline is in progress, else 0."),
		elapsed: desc("pipeline_run_elapsed_seconds", "Time since the current run started; between runs, the duration of the last run."),
		info:    desc("pipeline_stage_info", "Always 1: the kind of each stage (source, stage, sink, filter, batch or window).", "stage", "kind"),
		items: desc("pipeline_stage_items_total",
			"Items the stage settled in the current or last run, by outcome: succeeded, dead_lettered, failed or filtered.",
			"stage", "outcome"),
		handedBack: desc("pipeline_stage_handed_back_total",
			"Of the items the stage dead-lettered in the current or last run, those it handed back to their acknowledged source (WithHandBack) for a later delivery.",
			"stage"),
		out: desc("pipeline_stage_out_total", "Items the stage sent on in the current or last run.", "stage"),
		total: desc("pipeline_source_total_items",
			"Items the source holds (FromSlice) or declared (WithTotal), earlier runs' included for a checkpointed one; not sent when unknown.", "stage"),
		resumed: desc("pipeline_source_resumed_items",
			"Positions of a checkpointed source (FromCheckpoint) that earlier runs settled and this run does not read again; progress is (resumed + out) / total.", "stage"),
		lag: desc("pipeline_source_lag_items",
			"Items a source with WithLag has behind on a partition (for Kafka: the high watermark minus the committed offset), when it was scraped.",
			"stage", "partition"),
		retries: desc("pipeline_stage_retries_total", "Extra attempts the stage made in the current or last run.", "stage"),
		errs: desc("pipeline_stage_errors_total",
			"Errors of the stage function in the current or last run, by Go type and by what they did: retried, dead_lettered or failed.",
			"stage", "type", "outcome"),
		flushes: desc("pipeline_batch_flushes_total",
			"Batches flushed in the current or last run, by reason: size, bytes, linger, checkpoint (a checkpointed source waited for its items) or end.", "stage", "reason"),
		latency: desc("pipeline_stage_attempt_duration_seconds",
			"Duration of the stage function's attempts in the current or last run, at quantiles 0.5, 0.9, 0.99 (within 12.5 %) and 1 (the max); _count and _sum cover the timed attempts.",
			"stage"),
		in: desc("pipeline_stage_in_items",
			"Items that reached the stage in the current or last run (a source: the items it holds, when known).", "stage"),
		notStarted: desc("pipeline_stage_not_started_items",
			"Items that reached the stage and were not started: during a run, mostly those still queued.", "stage"),
		queueLen:           desc("pipeline_stage_queue_length", "Items waiting in the stage's input queue.", "stage"),
		queueCap:           desc("pipeline_stage_queue_capacity", "Capacity of the stage's input queue.", "stage"),
		queuePeak:          desc("pipeline_stage_queue_peak_length", "The longest the stage's input queue was in the current or last run.", "stage"),
		workers:            desc("pipeline_stage_workers", "Workers of the stage.", "stage"),
		busy:               desc("pipeline_stage_busy_workers", "Workers of the stage handling an item.", "stage"),
		inFlight:           desc("pipeline_stage_in_flight", "Items the stage started and has not settled yet.", "stage"),
		held:               desc("pipeline_stage_reorder_held", "Finished items an ordered stage holds until earlier ones finish; for a window stage, the items in its open windows.", "stage"),
		timeout:            desc("pipeline_stage_attempt_timeout_seconds", "The stage's per-attempt timeout (WithTimeout).", "stage"),
		oldestAttempt:      desc("pipeline_stage_oldest_attempt_seconds", "Age of the oldest running attempt of a stage with WithTimeout, once it has run a quarter of the timeout (0 otherwise); past the timeout, its function does not return after its context is done.", "stage"),
		checkpointPosition: desc("pipeline_checkpoint_position", "The position a checkpointed run saved last."),
		checkpointAge:      desc("pipeline_checkpoint_age_seconds", "Time since a checkpointed run last saved its position."),
		workerLimit: desc("pipeline_stage_worker_limit",
			"Workers an adaptive stage (WithAdaptiveWorkers) lets take items now.", "stage"),
		throttled: desc("pipeline_stage_throttled_seconds_total",
			"Time the stage's workers spent waiting for rate-limit tokens (WithRateLimit), together, in the current or last run.", "stage"),
		breakerState: desc("pipeline_stage_breaker_state",
			"The stage's circuit breaker (WithCircuitBreaker): 0 closed, 1 open, 2 half-open.", "stage"),
		breakerOpen: desc("pipeline_stage_breaker_open_seconds_total",
			"Time the stage's circuit breaker spent open or half-open in the current or last run (a WithSharedBreaker: since it was made).", "stage"),
		breakerOpened: desc("pipeline_stage_breaker_opened_total",
			"Times the stage's circuit breaker opened in the current or last run (a WithSharedBreaker: since it was made).", "stage"),
		breakerHeld: desc("pipeline_stage_breaker_held_total",
			"Failed attempts the stage's circuit breaker held (not counted against their items) in the current or last run.", "stage"),
		breakerHolding: desc("pipeline_stage_breaker_holding_items",
			"Items a breaker per key (WithBreakerPerKey) holds now out of the workers' hands, for keys whose breaker is not closed.", "stage"),
		breakerKeysOpen: desc("pipeline_stage_breaker_keys_open",
			"Keys whose breaker is not closed now, of a breaker per key (WithBreakerPerKey).", "stage"),
	}
}

// ownLabels are the labels of the collector's metrics, which constant labels must not use.
var ownLabels = []string{"stage", "kind", "outcome", "type", "reason", "quantile", "partition"}

func (c *Collector) descs() []*prometheus.Desc {
	return []*prometheus.Desc{
		c.running, c.elapsed, c.info, c.in, c.out, c.items, c.notStarted, c.retries, c.errs, c.flushes,
		c.queueLen, c.queueCap, c.queuePeak, c.workers, c.busy, c.inFlight, c.held,
		c.latency, c.timeout, c.oldestAttempt, c.checkpointPosition, c.checkpointAge,
		c.workerLimit, c.throttled, c.breakerState, c.breakerOpen, c.breakerOpened, c.breakerHeld,
		c.breakerHolding, c.breakerKeysOpen,
		c.handedBack, c.total, c.resumed, c.lag,
	}
}

// Describe implements [prometheus.Collector]: it sends the descriptor of every metric the
// collector may send. A scrape sends only those that apply (no checkpoint metrics for a
// run without one, no queue metrics for a source, ...).
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
}

// Collect implements [prometheus.Collector]: it takes one [pipeline.Pipeline.Snapshot]
// and sends its figures.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.err != nil {
		ch <- prometheus.NewInvalidMetric(c.running, c.err)
		return
	}
	r := c.p.Snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}

	gauge(c.running, b2f(r.Running))
	if len(r.Stages) == 0 { // no run yet: the zero Report
		return
	}
	gauge(c.elapsed, r.Elapsed.Seconds())
	if r.Checkpoint >= 0 {
		gauge(c.checkpointPosition, float64(r.Checkpoint))
		if !r.CheckpointSaved.IsZero() {
			gauge(c.checkpointAge, max(time.Since(r.CheckpointSaved), 0).Seconds())
		}
	}

	for i := range r.Stages {
		s := &r.Stages[i]
		name := s.Name
		gauge(c.info, 1, name, string(s.Kind))
		if s.Kind == pipeline.KindFilter {
			counter(c.items, s.Filtered, name, "filtered")
			continue
		}
		succeeded, failed, inFlight := settled(r, s)
		counter(c.items, succeeded, name, "succeeded")
		counter(c.items, s.DeadLettered, name, "dead_lettered")
		counter(c.items, failed, name, "failed")
		counter(c.out, s.Out, name)
		gauge(c.in, float64(s.In), name)
		gauge(c.notStarted, float64(s.NotStarted), name)
		gauge(c.inFlight, float64(inFlight), name)
		if s.Kind == pipeline.KindSource {
			if s.Total > 0 {
				gauge(c.total, float64(s.Total), name)
			}
			if r.Checkpoint >= 0 {
				gauge(c.resumed, float64(s.Resumed), name)
			}
			for _, l := range s.Lag { // labels are unique: the report adds up a label given twice
				gauge(c.lag, float64(l.Lag), name, l.Partition)
			}
			continue
		}

		counter(c.handedBack, s.HandedBack, name)
		counter(c.retries, s.Retried, name)
		for _, e := range s.Errors {
			counter(c.errs, e.Retried, name, e.Type, "retried")
			counter(c.errs, e.DeadLettered, name, e.Type, "dead_lettered")
			counter(c.errs, e.Failed, name, e.Type, "failed")
		}
		gauge(c.queueLen, float64(s.QueueLen), name)
		gauge(c.queueCap, float64(s.QueueCap), name)
		gauge(c.queuePeak, float64(s.PeakQueue), name)
		gauge(c.workers, float64(s.Workers), name)
		gauge(c.busy, float64(s.Busy), name)
		c.collectClient(ch, s)
		if s.Kind == pipeline.KindBatch {
			counter(c.flushes, s.Flushes.Size, name, "size")
			counter(c.flushes, s.Flushes.Bytes, name, "bytes")
			counter(c.flushes, s.Flushes.Linger, name, "linger")
			counter(c.flushes, s.Flushes.Checkpoint, name, "checkpoint")
			counter(c.flushes, s.Flushes.End, name, "end")
			continue
		}

		gauge(c.held, float64(s.Window), name)
		ch <- prometheus.MustNewConstSummary(c.latency, uint64(s.Latency.Count), s.Latency.Sum.Seconds(), quantiles(s.Latency), name)
		if s.Timeout > 0 {
			gauge(c.timeout, s.Timeout.Seconds(), name)
			gauge(c.oldestAttempt, s.OldestAttempt.Seconds(), name)
		}
	}
}

// settled returns a stage's succeeded, failed and in-flight counts, so that the
// counters only grow during a run. The items an ordered stage holds in its reorder
// window (a window stage: in its open windows, s.Window) count as succeeded in a live
// snapshot, and as failed in the final report of a run that stopped before they went
// on: here they are in flight until they do go on, never succeeded and then not.
func settled(rep pipeline.Report, s *pipeline.StageReport) (succeeded, failed, inFlight int64) {
	if rep.Running {
		return s.Succeeded - s.Window, s.Failed, s.InFlight + s.Window
	}
	return s.Succeeded, s.Failed, s.InFlight
}

// quantiles returns the quantiles of a latency for a summary: NaN before any attempt was
// timed, as a Prometheus summary without observations has.
func quantiles(l pipeline.Latency) map[float64]float64 {
	q := map[float64]float64{0.5: math.NaN(), 0.9: math.NaN(), 0.99: math.NaN(), 1: math.NaN()}
	if l.Count > 0 {
		q[0.5], q[0.9], q[0.99], q[1] = l.P50.Seconds(), l.P90.Seconds(), l.P99.Seconds(), l.Max.Seconds()
	}
	return q
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// collectClient sends the metrics of a stage's rate limit, circuit breaker and adaptive
// workers, for the stages that have them.
func (c *Collector) collectClient(ch chan<- prometheus.Metric, s *pipeline.StageReport) {
	if s.LimitHistory != nil {
		ch <- prometheus.MustNewConstMetric(c.workerLimit, prometheus.GaugeValue, float64(s.Limit), s.Name)
	}
	if s.Throttled > 0 {
		ch <- prometheus.MustNewConstMetric(c.throttled, prometheus.CounterValue, s.Throttled.Seconds(), s.Name)
	}
	if b := s.Breaker; b != nil {
		ch <- prometheus.MustNewConstMetric(c.breakerState, prometheus.GaugeValue, float64(b.State), s.Name)
		ch <- prometheus.MustNewConstMetric(c.breakerOpen, prometheus.CounterValue, b.TimeOpen.Seconds(), s.Name)
		ch <- prometheus.MustNewConstMetric(c.breakerOpened, prometheus.CounterValue, float64(b.Opened), s.Name)
		ch <- prometheus.MustNewConstMetric(c.breakerHeld, prometheus.CounterValue, float64(b.Held), s.Name)
		if b.PerKey {
			ch <- prometheus.MustNewConstMetric(c.breakerHolding, prometheus.GaugeValue, float64(b.Holding), s.Name)
			ch <- prometheus.MustNewConstMetric(c.breakerKeysOpen, prometheus.GaugeValue, float64(b.KeysOpen), s.Name)
		}
	}
}
