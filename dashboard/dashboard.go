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
//	                 queue's fill, rates, busy workers, latency percentiles, dead
//	                 letters by cause and the bottleneck highlighted, then the numbers
//	                 in a table; it updates itself from .../events
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
// renders the page's content once per refresh for all of them: a background goroutine
// refreshes while at least one viewer is connected to .../events and stops with the
// last one. A request for data.json reuses the latest refresh when it is younger than
// the interval, and otherwise takes one itself (concurrent requests share it). A
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
// data.json is one object; field names are stable, and a change that is not an
// addition increments version. Durations are in seconds, times in RFC 3339.
//
//	{
//	  "version": 1,
//	  "time": "2026-12-01T09:30:00.123Z",   when the snapshots were taken
//	  "interval_seconds": 1,
//	  "pipelines": [{                        in the order of Add
//	    "name": "import",
//	    "run": 3, "running": true,           which run; whether it is in progress
//	    "started": "...", "elapsed_seconds": 12.5,
//	    "error": "...",                      the run's error, only when it has one
//	    "checkpoint": 1200,                  checkpointed runs only: the position saved
//	    "bottleneck": {"stage": "fetch", "why": "...", "workers": 16, "warnings": []},
//	    "edges": [{"from": "fetch", "to": "save", "inferred": false}],
//	    "stages": [{                         in the order of the report
//	      "name": "fetch", "kind": "stage",  source, stage, sink, filter or batch
//	      "workers": 16, "busy": 16,
//	      "in": 1000, "succeeded": 900, "out": 900, "retried": 12,
//	      "dead_lettered": 3, "failed": 0, "not_started": 0, "filtered": 0,
//	      "in_flight": 16, "window": 0,
//	      "queue": {"len": 64, "cap": 64, "peak": 64, "fill": 1},
//	      "rate_per_second": 781.2,
//	      "latency": {"count": 900, "p50_seconds": 0.02, "p90_seconds": 0.021,
//	                  "p99_seconds": 0.03, "max_seconds": 0.05},
//	      "timeout_seconds": 1,              0 when none
//	      "next": "save",                    the stage it feeds, "" when unknown
//	      "bottleneck": true,
//	      "flushes": {"size": 9, "bytes": 0, "linger": 1},  batches only
//	      "errors": [{"type": "*net.OpError", "retried": 12, "dead_lettered": 3, "failed": 0}],
//	      "causes": [{"type": "*net.OpError", "message": "connection reset", "count": 3}]
//	    }]
//	  }]
//	}
//
// Arrays are never null. "edges" is the graph the page draws: the report names the
// stage each stage feeds only where it knows it (a stage's input); where it does not
// (the input of a filter or a batch, the branches of a Merge or a Tee), an edge from a
// row to the one the report lists after it is drawn dashed and marked inferred, when
// that row is not a source and the first is not a sink.
package dashboard

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gopipeline/pipeline"
)

const (
	defaultInterval = time.Second
	minInterval     = 100 * time.Millisecond
	minWriteTimeout = 10 * time.Second
)

// Option configures a [Handler]; pass options to [New].
type Option interface{ apply(*config) }

type config struct{ interval time.Duration }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithInterval sets how often the view is refreshed: how often the handler takes a
// Snapshot of each pipeline while someone watches, and how old the data of data.json
// may be. The default is 1 s; an interval below 100 ms is raised to 100 ms. It panics
// if d is not positive.
func WithInterval(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("dashboard: WithInterval(%v): the interval must be positive", d))
	}
	return optionFunc(func(c *config) { c.interval = max(d, minInterval) })
}

// Handler is the live view of a set of named pipelines, an [http.Handler] (see the
// package doc for its endpoints and costs). It is safe for concurrent use; the zero
// value is not usable: call [New].
type Handler struct {
	interval time.Duration
	closed   chan struct{} // closed by Close
	close    sync.Once

	refresh sync.Mutex // held while a frame is taken: one Snapshot per pipeline at a time

	mu      sync.Mutex
	pipes   []entry
	latest  *frame
	dirty   bool          // pipes changed since latest was taken
	viewers int           // open event streams
	stop    chan struct{} // closed to stop the refresher; nil while none runs
	done    chan struct{} // closed when that refresher has exited
}

// entry is one named pipeline; snap is its Snapshot method (a counter in tests).
type entry struct {
	name string
	snap func() pipeline.Report
}

// New returns a handler with no pipeline; add them with [Handler.Add].
func New(opts ...Option) *Handler {
	c := config{interval: defaultInterval}
	for _, o := range opts {
		o.apply(&c)
	}
	return &Handler{interval: c.interval, closed: make(chan struct{})}
}

// Add shows p under name, after the pipelines added before it. Adding under a name
// already shown replaces that pipeline in place (a service that builds a new pipeline
// per job can show the current one). The pipeline may be running or not: between runs
// the view shows the last run's report. Add is safe to call at any time; it panics if
// p is nil or name is empty.
func (h *Handler) Add(name string, p *pipeline.Pipeline) {
	if p == nil {
		panic(fmt.Sprintf("dashboard: Add(%q, nil)", name))
	}
	h.add(name, p.Snapshot)
}

func (h *Handler) add(name string, snap func() pipeline.Report) {
	if name == "" {
		panic("dashboard: Add with an empty name")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dirty = true
	if i := slices.IndexFunc(h.pipes, func(e entry) bool { return e.name == name }); i >= 0 {
		h.pipes[i].snap = snap
		return
	}
	h.pipes = append(h.pipes, entry{name, snap})
}

// Close ends every events stream now and for good (the page then shows that it is
// reconnecting) and stops the refresher, waiting for it to exit; the page and
// data.json still work. Close is idempotent; register it with
// [http.Server.RegisterOnShutdown].
func (h *Handler) Close() {
	h.close.Do(func() { close(h.closed) })
	h.mu.Lock()
	done := h.stopRefresher()
	h.mu.Unlock()
	if done != nil {
		<-done
	}
}

// ServeHTTP serves the page, data.json or the events stream, by the last element of
// r.URL.Path (see the package doc).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	switch r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:] {
	case "data.json":
		h.serveJSON(w, r)
	case "events":
		h.serveEvents(w, r)
	case "", "index.html":
		h.servePage(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (h *Handler) serveJSON(w http.ResponseWriter, r *http.Request) {
	body := h.take(h.interval).json()
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(body) // the client went away: nothing to do
}

func (h *Handler) servePage(w http.ResponseWriter, r *http.Request) {
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, pageData{Frame: h.take(h.interval), Interval: h.interval}); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError) // a bug of this package
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if r.Method == http.MethodHead {
		return
	}
	_, _ = b.WriteTo(w)
}

// serveEvents streams the rendered view, one event per refresh, until the client goes
// away, a write fails or times out, or Close is called.
func (h *Handler) serveEvents(w http.ResponseWriter, r *http.Request) {
	select {
	case <-h.closed:
		http.Error(w, "the dashboard is shutting down", http.StatusServiceUnavailable)
		return
	default:
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	h.watch()
	defer h.unwatch()
	// A server's WriteTimeout would cut the stream: each write gets its own deadline,
	// and the connection none once the stream ends (the server sets its own per request).
	timeout := max(minWriteTimeout, 3*h.interval)
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	f := h.take(h.interval)
	retry := fmt.Appendf(nil, "retry: %d\n", 2*h.interval.Milliseconds())
	for {
		if err := rc.SetWriteDeadline(time.Now().Add(timeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return
		}
		if _, err := w.Write(retry); err != nil {
			return
		}
		if _, err := w.Write(f.event()); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		retry = nil
		select {
		case <-r.Context().Done():
			return
		case <-h.closed:
			return
		case <-f.next:
			f = h.current()
		}
	}
}

// watch counts a viewer in, starting the refresher for the first one.
func (h *Handler) watch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.viewers++
	if h.stop != nil {
		return
	}
	select {
	case <-h.closed:
		return // Close has been called: the stream ends at once
	default:
	}
	stop, done := make(chan struct{}), make(chan struct{})
	h.stop, h.done = stop, done
	go h.refresher(stop, done)
}

// unwatch counts a viewer out, stopping the refresher after the last one and waiting
// for it to exit (so that no goroutine of the handler outlives its last stream).
func (h *Handler) unwatch() {
	h.mu.Lock()
	h.viewers--
	var done chan struct{}
	if h.viewers == 0 {
		done = h.stopRefresher()
	}
	h.mu.Unlock()
	if done != nil {
		<-done
	}
}

// stopRefresher tells the refresher, if one runs, to stop, and returns the channel
// closed when it has. h.mu must be held.
func (h *Handler) stopRefresher() chan struct{} {
	if h.stop == nil {
		return nil
	}
	close(h.stop)
	done := h.done
	h.stop, h.done = nil, nil
	return done
}

// refresher takes a frame every interval until stop is closed.
func (h *Handler) refresher(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			h.take(h.interval / 2) // a frame a data.json request took just now will do
		}
	}
}

// current returns the latest frame.
func (h *Handler) current() *frame {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.latest
}

// take returns the latest frame if it is younger than maxAge and the pipelines have not
// changed since, and otherwise takes a new one: one Snapshot of each pipeline. Callers
// that arrive while a frame is being taken wait for it and share it.
func (h *Handler) take(maxAge time.Duration) *frame {
	h.refresh.Lock()
	defer h.refresh.Unlock()
	h.mu.Lock()
	old, pipes, dirty := h.latest, slices.Clone(h.pipes), h.dirty
	h.dirty = false
	h.mu.Unlock()
	now := time.Now()
	if old != nil && !dirty && now.Sub(old.At) < maxAge {
		return old
	}
	f := &frame{At: now, interval: h.interval, next: make(chan struct{})}
	f.Views = make([]pipelineView, len(pipes))
	for i, e := range pipes {
		f.Views[i] = newPipelineView(e.name, e.snap())
	}
	h.mu.Lock()
	h.latest = f
	h.mu.Unlock()
	if old != nil {
		close(old.next)
	}
	return f
}

// frame is one refresh: a snapshot of every pipeline, encoded at most once for all
// viewers, as JSON and as the page's content.
type frame struct {
	At       time.Time // when the snapshots were taken
	Views    []pipelineView
	interval time.Duration
	next     chan struct{} // closed when a newer frame replaces this one

	jsonOnce, eventOnce sync.Once
	jsonBody, eventBody []byte
}

// json returns the frame as the body of data.json.
func (f *frame) json() []byte {
	f.jsonOnce.Do(func() { f.jsonBody = encodeJSON(f) })
	return f.jsonBody
}

// event returns the frame as a server-sent event: the rendered view, one data: line
// per line of HTML.
func (f *frame) event() []byte {
	f.eventOnce.Do(func() {
		var html bytes.Buffer
		if err := viewTemplate.Execute(&html, f); err != nil {
			html.Reset()
			html.WriteString("<p class=error>dashboard: " + template.HTMLEscapeString(err.Error()) + "</p>")
		}
		var b bytes.Buffer
		for line := range strings.Lines(html.String()) {
			b.WriteString("data: ")
			b.WriteString(strings.TrimRight(line, "\r\n"))
			b.WriteByte('\n')
		}
		b.WriteByte('\n')
		f.eventBody = b.Bytes()
	})
	return f.eventBody
}

// pageData is what the page template renders.
type pageData struct {
	Frame    *frame
	Interval time.Duration
}
