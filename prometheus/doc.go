// Package pipelineprom exports the live figures of a [pipeline.Pipeline] to Prometheus.
//
// [NewCollector] returns a [prometheus.Collector] that reads [pipeline.Pipeline.Snapshot]
// once per scrape and turns it into constant metrics. It starts no goroutine and keeps
// no state between scrapes, so it costs the pipeline nothing between scrapes:
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(pipelineprom.NewCollector(p, pipelineprom.WithConstLabels(prometheus.Labels{"pipeline": "ingest"})))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// # Metrics
//
// Every stage metric has a "stage" label: the name of the source, stage, sink, filter
// or batch row of the [pipeline.Report]; pipeline_stage_info's "kind" label is the
// row's [pipeline.Kind]. Counters end in _total, durations are in seconds.
//
//	name                                     type     labels               what
//	pipeline_running                         gauge                         1 while a run is in progress, else 0
//	pipeline_run_elapsed_seconds             gauge                         time since the run started (after a run: its duration)
//	pipeline_stage_info                      gauge    stage, kind          always 1; kind is source, stage, sink, filter, batch or window
//	pipeline_stage_items_total               counter  stage, outcome       items settled, by outcome: succeeded, dead_lettered
//	                                                                       or failed (sources, stages, sinks, batches), or
//	                                                                       filtered (filters)
//	pipeline_stage_out_total                 counter  stage                items sent on
//	pipeline_stage_handed_back_total         counter  stage                of dead_lettered, the items handed back to their
//	                                                                       acknowledged source (WithHandBack)
//	pipeline_stage_retries_total             counter  stage                extra attempts made (attempts, not items)
//	pipeline_stage_errors_total              counter  stage, type, outcome errors by Go type ("timeout" for a timeout) and by
//	                                                                       what they did: retried, dead_lettered or failed
//	pipeline_batch_flushes_total             counter  stage, reason        batches flushed by reason: size, bytes, linger, checkpoint, end
//	pipeline_stage_attempt_duration_seconds  summary  stage, quantile      attempt durations: quantiles 0.5, 0.9, 0.99 and 1
//	                                                                       (the max); _count, _sum: attempts timed
//	pipeline_stage_in_items                  gauge    stage                items that reached the stage (a source: items it holds)
//	pipeline_stage_not_started_items         gauge    stage                items that reached it and were not started
//	pipeline_stage_in_flight                 gauge    stage                items started and not yet settled
//	pipeline_stage_queue_length              gauge    stage                items waiting in the stage's input queue
//	pipeline_stage_queue_capacity            gauge    stage                capacity of that queue
//	pipeline_stage_queue_peak_length         gauge    stage                the longest it was in the run
//	pipeline_stage_workers                   gauge    stage                the stage's workers
//	pipeline_stage_busy_workers              gauge    stage                workers handling an item
//	pipeline_stage_reorder_held              gauge    stage                ordered stages: finished items held for earlier ones; window stages: items in open windows
//	pipeline_stage_attempt_timeout_seconds   gauge    stage                the stage's WithTimeout, when it has one
//	pipeline_stage_oldest_attempt_seconds    gauge    stage                with WithTimeout: the oldest running attempt's age, once
//	                                                                       it ran a quarter of the timeout (StageReport.OldestAttempt)
//	pipeline_source_total_items              gauge    stage                sources: the items it holds or declared (WithTotal),
//	                                                                       when known; a checkpointed run's, earlier runs' included
//	pipeline_source_resumed_items            gauge    stage                checkpointed sources: positions earlier runs settled,
//	                                                                       not read again (StageReport.Resumed)
//	pipeline_source_lag_items                gauge    stage, partition     sources with WithLag: items behind on each partition
//	                                                                       (StageReport.Lag); sum by stage for the total
//	pipeline_checkpoint_position             gauge                         checkpointed runs: the position saved last
//	pipeline_checkpoint_age_seconds          gauge                         checkpointed runs: time since it was saved
//	pipeline_stage_worker_limit              gauge    stage                adaptive stages: workers allowed to take items now
//	pipeline_stage_throttled_seconds_total   counter  stage                rate-limited stages: time spent waiting for tokens
//	pipeline_stage_breaker_state             gauge    stage                stages with a breaker: 0 closed, 1 open, 2 half-open
//	pipeline_stage_breaker_open_seconds_total counter stage                time the breaker spent open or half-open
//	pipeline_stage_breaker_opened_total      counter  stage                times it opened
//	pipeline_stage_breaker_held_total        counter  stage                failed attempts it held (not counted against items)
//	pipeline_stage_breaker_holding_items     gauge    stage                a breaker per key: items it holds now
//	pipeline_stage_breaker_keys_open         gauge    stage                a breaker per key: keys not closed now
//
// Sources and filters have no queue, workers or latency; batches have no latency. For
// every stage, in = succeeded + dead_lettered + failed + in_flight + not_started, where
// not_started counts the items still queued during a run and those never started after
// it. A run's progress is (pipeline_source_resumed_items + pipeline_stage_out_total) /
// pipeline_source_total_items of its source: what it read, not what is committed
// (pipeline_checkpoint_position). Before the pipeline's first run, only pipeline_running (0) is exposed.
//
// In and not-started items are gauges, not counters: the pipeline derives them from its
// queues' lengths, so during a run they can dip (not-started items drain from the queue;
// an item being handed to a worker is briefly in neither), and Prometheus would take any
// dip of a counter for a reset and count the whole value again. Everything exposed as a
// counter only grows during a run. (A report counts as failed the items still in flight
// when it is taken, as they are once the run has stopped; during a run the collector
// counts the finished items an ordered stage holds in its reorder window as succeeded,
// and the item a source is handing on as in flight, so that no counter goes down when
// they move on.)
//
// # Counts are per run
//
// A [pipeline.Pipeline] may be run many times, and each run counts from zero: the
// counters above are the counts of the run in progress (or, between runs, of the last
// one), so they drop back to zero when a new run starts. They are still exposed as
// counters, because that is exactly a Prometheus counter reset, as when a process
// restarts: rate() and increase() treat any decrease as a reset and stay right.
// Resets are detected from the values only, so two cases are undercounted: a run that
// starts and ends between two scrapes is not seen at all, and a run that starts after a
// scrape and has already passed the previous run's last scraped count at the next
// scrape is taken for a continuation, so its items up to that count are missed. Scrape
// more often than runs start (long-lived and streaming pipelines run once and are not
// affected) and read pipeline_running and pipeline_run_elapsed_seconds to see where
// runs begin. The alternatives are worse: gauges would lose rate(), a run label would
// add a set of series per run, and the collector cannot add runs up itself without
// seeing every run end (it has no goroutine, and a report does not say which run it
// is).
//
// # Latency
//
// A stage's attempt durations come from the pipeline's own fixed-memory histogram, as
// quantiles within 12.5 % (see [pipeline.Latency]); the report does not give the
// histogram's buckets, which rules out a Prometheus histogram, so they are a summary
// whose _count and _sum cover the attempts timed. The pipeline times one attempt in 64 on fast stages, so that count is
// not the number of attempts: count attempts with pipeline_stage_items_total and
// pipeline_stage_retries_total. The quantiles are NaN until the stage has timed an
// attempt. Aggregate quantiles across pipelines with max(), never avg() or sum().
//
// # Cost
//
// A scrape costs one Snapshot (about 6 µs for a three-stage pipeline with 22 workers
// while it runs, 35 ns between runs) plus one constant metric per series: Collect takes
// about 20 µs and 600 allocations for that pipeline's 58 metrics (measured before the
// 4 series of hand-backs and the source's total were added), the registry's Gather
// (what promhttp calls) about 65 µs and 940 allocations, 85 µs with the text encoding
// (see BenchmarkScrape). Snapshot also restarts the window of
// [pipeline.StageReport.Rate] for every other Snapshot caller; this package does not
// export Rate (use rate() on pipeline_stage_out_total instead).
package pipelineprom
