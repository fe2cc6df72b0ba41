// Package dashboard serves a live web view of running pipelines: an [http.Handler]
// that a service mounts beside its other debug handlers, like net/http/pprof, with no
// dependency beyond the standard library.
//
//	h := dashboard.New()
//	h.Add("import", p) // p is a *pipeline.Pipeline
//	mux.Handle("/debug/pipeline/", h)
//	srv.RegisterOnShutdown(h.Close)
//
// # Endpoints
//
// The handler serves three paths, found by the last element of the request's path, so
// that it works under any prefix, with or without [http.StripPrefix]:
//
//	.../             the page: each pipeline's stages drawn as a graph (SVG), with each
//	                 queue's fill, rates, busy workers, latency percentiles (of the
//	                 last 10 s and of the run), the state of each control (circuit
//	                 breaker, adaptive limit, time waiting for a rate limit) and the
//	                 bottleneck highlighted; the run's progress when its sources know
//	                 their total; small charts of the last minutes (rate, queue fill,
//	                 p99, retries and dead letters per second, adaptive limit) per
//	                 stage; the numbers in a table; a connector's own counters on its
//	                 row ([WithRowStats]: a JetStream source's acks, naks and
//	                 redeliveries); a source's lag ([pipeline.WithLag]: a Kafka
//	                 source's consumer lag), in all on its node and in its column of
//	                 the table, and by partition in a table of its own; errors and
//	                 dead letters by cause, named in words;
//	                 it updates itself from .../events
//	.../data.json    the same data as JSON, for scripts (the schema is below)
//	.../events       server-sent events: the page's content, rendered anew each refresh
//
// Mount it with a pattern that ends in a slash ("/debug/pipeline/"): the page links
// to its endpoints by relative URLs, and [http.ServeMux] redirects "/debug/pipeline"
// to "/debug/pipeline/". Every other path gets 404, every method but GET and HEAD 405.
// The handler has no access control of its own: like pprof, serve it on an internal
// port or behind the service's authentication, since it shows stage names and error
// messages.
//
// # Cost
//
// The handler takes at most one [pipeline.Pipeline.Snapshot] per pipeline per refresh
// interval ([WithInterval], default 1 s), however many viewers are connected, and
// renders the page's content once per refresh for all of them. A background goroutine
// refreshes: with history (the default, [WithHistory]) from the first [Handler.Add]
// until [Handler.Close], so that the charts cover the minutes before anyone looked;
// without, only while at least one viewer is connected to .../events. A request for
// data.json reuses the latest refresh when it is younger than the interval, and
// otherwise takes one itself (concurrent requests share it). The history costs a few
// float64 per stage per point: at the default 15 minutes at 1 s, five or six series of
// 900 values, 36 to 55 KiB per stage; the page draws at most 150 points per chart. A
// Snapshot reads counters that the stages write anyway, so the pipelines pay nothing
// per item. No lock of the handler is held while it writes to a client, so a slow or
// stalled viewer delays no one: it misses refreshes (it always gets the latest) and
// is dropped once a write has blocked for ten seconds (or three intervals, if more).
//
// Server-sent events rather than polling: one request per viewer instead of one per
// viewer per refresh, a frame encoded once and written to every stream, and the
// browser's EventSource reconnects by itself after a restart.
//
// # Shutting down
//
// An events stream ends when its client goes away or when [Handler.Close] is called.
// [http.Server.Shutdown] does not cancel the requests in progress, so register Close
// with [http.Server.RegisterOnShutdown], or the streams keep Shutdown waiting until
// its context expires.
//
// # The JSON schema
//
// data.json is one object, without indentation (pipe it to jq to read it); field
// names are stable, and a change that is not an addition increments version.
// Durations are in seconds, times in RFC 3339.
//
//	{
//	  "version": 1,
//	  "time": "2026-12-01T09:30:00.123Z",   when the snapshots were taken
//	  "interval_seconds": 1,
//	  "pipelines": [{                        in the order of Add
//	    "name": "import",
//	    "run": 3, "running": true,           which run; whether it is in progress
//	    "started": "...", "elapsed_seconds": 12.5,  started: absent before the first run
//	    "error": "...",                      the run's error, only when it has one
//	    "checkpoint": 1200,                  checkpointed runs only: the position saved
//	    "progress": {"read": 6000, "resumed": 4000, "total": 10000, "fraction": 0.6, "eta_seconds": 5.1,
//	                 "committed": 5500, "committed_fraction": 0.55},
//	                                         only when every source knows its total (FromSlice)
//	                                         or declares it (WithTotal): items the sources read,
//	                                         resumed included (a checkpointed run's positions
//	                                         done before it started, only when there are some);
//	                                         eta only while running; committed, checkpointed
//	                                         runs only: the position the checkpoint holds (at
//	                                         most total), behind read by the items in flight
//	    "bottleneck": {"stage": "fetch", "why": "...", "workers": 16, "warnings": []},
//	    "edges": [{"from": "fetch", "to": "save", "inferred": false}],
//	    "stages": [{                         in the order of the report
//	      "name": "fetch", "kind": "stage",  a pipeline.Kind: source, stage, sink, filter or batch
//	      "workers": 16, "busy": 16,
//	      "in": 1000, "succeeded": 900, "out": 900, "retried": 12,
//	      "dead_lettered": 3, "failed": 0, "not_started": 0, "filtered": 0,
//	      "handed_back": 0,                  of dead_lettered, the items given back to their
//	                                         acknowledged source (pipeline.WithHandBack)
//	      "set_aside": 0,                    sinks: parts of their items they set aside
//	                                         themselves (pipeline.SetAside: a database's
//	                                         rejected rows), not in in or dead_lettered
//	      "in_flight": 16, "window": 0,
//	      "queue": {"len": 64, "cap": 64, "peak": 64, "fill": 1},
//	      "rate_per_second": 781.2,
//	      "latency": {"count": 900, "p50_seconds": 0.02, "p90_seconds": 0.021,
//	                  "p99_seconds": 0.03, "max_seconds": 0.05},  the whole run's
//	      "recent_latency": {...},           the same keys, over the last 10 s (running only)
//	      "timeout_seconds": 1,              0 when none
//	      "oldest_attempt_seconds": 0.3,     WithTimeout only, while an attempt has run a quarter
//	                                         of the timeout: its age (past the timeout: stuck)
//	      "next": ["save"],                  the rows it feeds, as far as the report knows
//	      "bottleneck": true,
//	      "flushes": {"size": 9, "bytes": 0, "linger": 1, "end": 1, "checkpoint": 0},
//	                                         batches only: flushes by reason
//	      "windows": {"open": 3, "watermark": "2026-12-02T09:00:50Z", "lag_seconds": 10,
//	                  "late": 0, "updates": 0, "forced": 0},
//	                                         window stages only (pipeline.WindowReport);
//	                                         watermark absent before the first item
//	      "errors": [{"type": "*net.OpError", "name": "network error",
//	                  "retried": 12, "dead_lettered": 3, "failed": 0}],
//	      "causes": [{"type": "*net.OpError", "name": "network error",
//	                  "message": "connection reset", "count": 3}],
//	                                         name: the type in words, as the page shows it
//	      "limit": 16,                       workers allowed to take items (the adaptive limit)
//	      "limit_history": [{"at_seconds": 2.5, "limit": 8, "reason": "latency"}],
//	                                         WithAdaptiveWorkers only: its latest changes
//	      "breaker": {"state": "open", "opened": 1, "open_seconds": 0.75, "held": 40,
//	                  "transitions": [{"to": "open", "at_seconds": 1.02}],
//	                  "per_key": true, "holding": 120, "keys_open": 1},
//	                                         WithCircuitBreaker only; the last three with
//	                                         WithBreakerPerKey only: items held now, keys
//	                                         whose breaker is not closed
//	      "throttled_seconds": 0,            time its workers waited for rate-limit tokens
//	      "counters": {"acked": 1200, "redelivered": 3}
//	                                         a connector's counters (WithRowStats) only: the
//	                                         keys its function returns
//	      "lag": {"total": 1234, "partitions": [{"partition": "orders/0", "lag": 600}]}
//	                                         sources with pipeline.WithLag only: items behind,
//	                                         in all and by partition, in the source's order
//	    }],
//	    "history": {                         the run's last minutes (WithHistory), oldest first
//	      "seconds": [1, 2, 3],              each point's time since the run started
//	      "stages": [{"name": "fetch",       in the order of "stages", one value per point:
//	        "rate_per_second": [780, 781, 779],        items (a batch: batches) sent on
//	        "queue_fill": [1, 1, 0.98],      rows with an input queue only
//	        "p99_seconds": [0.03, 0.03, 0.031],        of the last 10 s; rows with workers only
//	        "retried_per_second": [0, 2, 0],
//	        "dead_lettered_per_second": [0, 1, 0],
//	        "limit": [16, 12, 8]             WithAdaptiveWorkers only
//	      }]
//	    }
//	  }]
//	}
//
// Arrays are never null. The history starts afresh with each run (and when a pipeline
// is replaced by [Handler.Add]); between runs it holds the last run's points. "edges" is the graph the page draws, from each row's "next".
// Where the report names nothing a row feeds (pipeline v0.1 names only a stage's
// input: not the input of a filter or a batch, nor across a Merge or a Tee), the page
// draws a dashed edge, marked inferred, to the row the report lists next, unless the
// first row is a sink or the second a source.
package dashboard
