// Package pipelineotel exports the live figures of a [pipeline.Pipeline] as OpenTelemetry
// metrics.
//
// [Register] creates observable instruments on a [metric.Meter] and one callback that
// reads [pipeline.Pipeline.Snapshot] once per collection. It starts no goroutine: the
// SDK's reader calls the callback when it collects (a periodic reader every interval, a
// Prometheus exporter on each scrape):
//
//	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
//	reg, err := pipelineotel.Register(p, provider.Meter("example.com/ingest"),
//		pipelineotel.WithAttributes(attribute.String("pipeline.name", "ingest")))
//	...
//	defer reg.Unregister()
//
// # Instruments
//
// Names and attributes follow the OpenTelemetry semantic-convention style: dot-separated
// namespaces, units in UCUM with annotations in braces, and no unit or "total" in the
// name. Every stage instrument has the attribute pipeline.stage, the name of the source,
// stage, sink, filter or batch row of the [pipeline.Report] (its [pipeline.Kind]).
//
//	name                             instrument     unit       attributes (and what)
//	pipeline.run.active              UpDownCounter  {run}      (1 while a run is in progress, else 0)
//	pipeline.run.elapsed             Gauge (float)  s          (since the run started; after it, its duration)
//	pipeline.stage.items             UpDownCounter  {item}     pipeline.stage, pipeline.outcome
//	pipeline.stage.input             UpDownCounter  {item}     pipeline.stage (items that reached it; a source: items it holds)
//	pipeline.stage.output            UpDownCounter  {item}     pipeline.stage (items sent on)
//	pipeline.stage.in_flight         UpDownCounter  {item}     pipeline.stage (started, not yet settled)
//	pipeline.stage.handed_back       UpDownCounter  {item}     pipeline.stage (of dead_lettered, those handed back to
//	                                                           their acknowledged source: WithHandBack)
//	pipeline.source.total            Gauge          {item}     pipeline.stage (sources: the items it holds or declared with
//	                                                           WithTotal, when known; earlier runs' included)
//	pipeline.source.resumed          Gauge          {item}     pipeline.stage (checkpointed sources: positions earlier runs
//	                                                           settled, not read again: StageReport.Resumed)
//	pipeline.source.lag              Gauge          {item}     pipeline.stage, pipeline.partition (sources with WithLag:
//	                                                           items behind on the partition, StageReport.Lag)
//	pipeline.stage.retries           UpDownCounter  {retry}    pipeline.stage (extra attempts)
//	pipeline.stage.errors            UpDownCounter  {error}    pipeline.stage, error.type, pipeline.outcome
//	pipeline.stage.queue.length      UpDownCounter  {item}     pipeline.stage
//	pipeline.stage.queue.capacity    UpDownCounter  {item}     pipeline.stage
//	pipeline.stage.queue.peak        Gauge          {item}     pipeline.stage (the longest the queue was in the run)
//	pipeline.stage.workers           UpDownCounter  {worker}   pipeline.stage, pipeline.worker.state (busy, idle)
//	pipeline.stage.reorder.held      UpDownCounter  {item}     pipeline.stage (ordered stages: finished items held; window stages: items in open windows)
//	pipeline.stage.attempt.duration  Gauge (float)  s          pipeline.stage, pipeline.quantile (0.5, 0.9, 0.99, 1)
//	pipeline.stage.attempt.timed     UpDownCounter  {attempt}  pipeline.stage (attempts behind those quantiles)
//	pipeline.stage.attempt.timeout   Gauge (float)  s          pipeline.stage (its WithTimeout, when it has one)
//	pipeline.stage.attempt.oldest    Gauge (float)  s          pipeline.stage (with WithTimeout: the oldest running attempt's
//	                                                           age, once it ran a quarter of the timeout)
//	pipeline.batch.flushes           UpDownCounter  {batch}    pipeline.stage, pipeline.flush.reason (size, bytes, linger, checkpoint, end)
//	pipeline.checkpoint.position     Gauge          {item}     (checkpointed runs: the position saved last)
//	pipeline.checkpoint.age          Gauge (float)  s          (checkpointed runs: time since it was saved)
//	pipeline.stage.worker.limit      UpDownCounter  {worker}   pipeline.stage (adaptive stages: workers allowed now)
//	pipeline.stage.throttled         Gauge (float)  s          pipeline.stage (rate-limited stages: time waiting for tokens)
//	pipeline.stage.breaker.state     UpDownCounter  {breaker}  pipeline.stage, pipeline.breaker.state (closed, open, half_open: 1 for the current)
//	pipeline.stage.breaker.open_time Gauge (float)  s          pipeline.stage (time open or half-open)
//	pipeline.stage.breaker.openings  UpDownCounter  {opening}  pipeline.stage (times it opened)
//	pipeline.stage.breaker.held      UpDownCounter  {attempt}  pipeline.stage (failed attempts held, not counted against items)
//	pipeline.stage.breaker.holding   UpDownCounter  {item}     pipeline.stage (a breaker per key: items it holds now)
//	pipeline.stage.breaker.keys_open UpDownCounter  {key}      pipeline.stage (a breaker per key: keys not closed now)
//
// All are observable instruments: Int64 unless marked float.
//
// pipeline.outcome is succeeded, dead_lettered, failed or not_started for the items of a
// source, stage, sink or batch, and filtered for a filter; for errors it is what the
// error did: retried, dead_lettered or failed. error.type is the error's Go type, or
// "timeout". For every stage, pipeline.stage.input = the sum of pipeline.stage.items over
// its outcomes + pipeline.stage.in_flight; during a run, not_started counts the items
// still queued. Sources and filters have no queue, workers or latency; batches have no
// latency. Before the pipeline's first run only pipeline.run.active (0) is observed.
//
// # Counts are per run, hence UpDownCounters
//
// A [pipeline.Pipeline] may be run many times, and each run counts from zero: the counts
// above are those of the run in progress (or, between runs, of the last one), and drop
// back to zero when a new run starts. An OpenTelemetry Counter must only grow, and an
// observable one cannot announce a reset (a new start time), so a drop would break the
// contract: with delta temporality the SDK would export a negative increase of a
// monotonic sum. The counts are therefore UpDownCounters (non-monotonic cumulative sums),
// which is what they are across runs. Within one run, the counts of items by outcome
// (except not_started, which includes the queued items), output, retries, errors,
// flushes and attempts timed only grow; input can dip by the items being handed to a
// worker, as the pipeline derives it from a queue length. (A report counts as failed
// the items still in flight when it is taken, as they are once the run has stopped;
// during a run this package counts the finished items an ordered stage holds in its
// reorder window as succeeded, and the item a source is handing on as in flight, so
// that no count of settled items goes down when they move on.)
//
// # Latency
//
// A stage's attempt durations come from the pipeline's own fixed-memory histogram, as
// quantiles within 12.5 % (see [pipeline.Latency]). The report has neither the buckets
// nor the sum, and the metric API has no observable histogram, so the quantiles are a
// gauge with a pipeline.quantile attribute ("1" is the maximum), observed once the stage
// has timed an attempt. The pipeline times one attempt in 64 on fast stages, so
// pipeline.stage.attempt.timed is not the number of attempts.
//
// # Cost
//
// A collection costs one Snapshot (about 6 µs for a three-stage pipeline while it runs)
// and one observation per data point. Snapshot also restarts the window of
// [pipeline.StageReport.Rate] for every other Snapshot caller; this package does not
// export Rate (a backend derives it from pipeline.stage.output).
package pipelineotel
