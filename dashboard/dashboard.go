package dashboard

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gopipeline/pipeline"
)

const (
	defaultInterval = time.Second
	defaultHistory  = 15 * time.Minute
	minInterval     = 100 * time.Millisecond
	minWriteTimeout = 10 * time.Second
)

// Option configures a [Handler]; pass options to [New].
type Option interface{ apply(*config) }

type config struct{ interval, history time.Duration }

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

// WithHistory sets how much of each run's past the handler keeps for the page's charts
// and data.json's "history": one point per refresh interval, over the last d (the
// default is 15 minutes; at the default interval, 900 points of a few figures per
// stage). With history, the handler refreshes in the background from the first
// [Handler.Add] until [Handler.Close], viewers or not, so that a page opened late
// shows what happened; WithHistory(0) keeps no history and refreshes only while
// someone watches. It panics if d is negative.
func WithHistory(d time.Duration) Option {
	if d < 0 {
		panic(fmt.Sprintf("dashboard: WithHistory(%v): the history must not be negative", d))
	}
	return optionFunc(func(c *config) { c.history = d })
}

// Handler is the live view of a set of named pipelines, an [http.Handler] (see the
// package doc for its endpoints and costs). It is safe for concurrent use; the zero
// value is not usable: call [New].
type Handler struct {
	interval time.Duration
	points   int           // points of history per pipeline (0: none)
	always   bool          // refresh from the first Add to Close (with history), not only while watched
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

// entry is one named pipeline; snap is its Snapshot method (a counter in tests); hist
// is its history, written only by take (under Handler.refresh); rows are the counters
// of connectors shown on its rows (WithRowStats).
type entry struct {
	name string
	snap func() pipeline.Report
	hist *history
	rows []rowStats
}

// AddOption configures a pipeline shown by [Handler.Add]: [WithRowStats].
type AddOption interface{ addOption(*entry) }

// rowStats is the option WithRowStats returns.
type rowStats struct {
	row   string
	stats func() map[string]int64
}

func (o rowStats) addOption(e *entry) { e.rows = append(e.rows, o) }

// WithRowStats shows, on the row named row of the pipeline given to [Handler.Add], the
// counters that stats returns: a connector's figures that the pipeline's report does
// not know, such as the acks, naks and redeliveries of a JetStream source (its Stats)
// or the rows a database sink wrote and rejected. Each key names a counter; the page
// shows them in key order on the row's node and in a table of connector counters, and
// data.json as the stage's "counters". Give it once per row (a second one for the same
// row adds its counters, the later value winning for a key both return).
//
// stats is called once per refresh, from the handler's refresher or a request, while
// the pipeline runs: it must be safe for concurrent use and return at once (read
// atomics, not a server); the handler copies what it returns. A row the report does
// not have (before the first run, or a name the pipeline does not use) shows nothing.
// It panics if row is empty or stats is nil.
func WithRowStats(row string, stats func() map[string]int64) AddOption {
	if row == "" || stats == nil {
		panic(fmt.Sprintf("dashboard: WithRowStats(%q, %p): need a row name and a function", row, stats))
	}
	return rowStats{row, stats}
}

// New returns a handler with no pipeline; add them with [Handler.Add].
func New(opts ...Option) *Handler {
	c := config{interval: defaultInterval, history: defaultHistory}
	for _, o := range opts {
		o.apply(&c)
	}
	h := &Handler{interval: c.interval, closed: make(chan struct{})}
	if c.history > 0 {
		h.points = max(2, int(c.history/c.interval))
		h.always = true
	}
	return h
}

// Add shows p under name, after the pipelines added before it. Adding under a name
// already shown replaces that pipeline in place (a service that builds a new pipeline
// per job can show the current one). The pipeline may be running or not: between runs
// the view shows the last run's report. With history (the default, see [WithHistory]),
// the first Add starts the handler's background refresh, which [Handler.Close] stops.
// Options ([WithRowStats]) add what the report does not know. Add is safe to call at
// any time; it panics if p is nil, name is empty or an option is nil.
func (h *Handler) Add(name string, p *pipeline.Pipeline, opts ...AddOption) {
	if p == nil {
		panic(fmt.Sprintf("dashboard: Add(%q, nil)", name))
	}
	h.add(name, p.Snapshot, opts...)
}

func (h *Handler) add(name string, snap func() pipeline.Report, opts ...AddOption) {
	if name == "" {
		panic("dashboard: Add with an empty name")
	}
	e := entry{name: name, snap: snap, hist: newHistory(h.points)}
	for i, o := range opts {
		if o == nil {
			panic(fmt.Sprintf("dashboard: Add(%q): option %d of %d is nil", name, i+1, len(opts)))
		}
		o.addOption(&e)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dirty = true
	if h.always {
		h.startRefresher()
	}
	if i := slices.IndexFunc(h.pipes, func(e entry) bool { return e.name == name }); i >= 0 {
		h.pipes[i] = e
		return
	}
	h.pipes = append(h.pipes, e)
}

// Close ends every events stream now and for good (the page then shows that it is
// reconnecting) and stops the refresher, waiting for it to exit; the page and
// data.json still work (the history then grows only with data.json requests). Close
// is idempotent; register it with [http.Server.RegisterOnShutdown]. A handler with
// history that is never closed keeps its refresher running.
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
	if err := pageTemplate.Execute(&b, pageData{Frame: h.take(h.interval), Interval: h.interval, Retry: h.retry().Milliseconds()}); err != nil {
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
	retry := fmt.Appendf(nil, "retry: %d\n", h.retry().Milliseconds())
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

// retry is how long a page waits before it reconnects to the events stream.
func (h *Handler) retry() time.Duration { return max(2*time.Second, 2*h.interval) }

// watch counts a viewer in, starting the refresher for the first one.
func (h *Handler) watch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.viewers++
	h.startRefresher()
}

// startRefresher starts the refresher unless it runs or Close has been called. h.mu
// must be held.
func (h *Handler) startRefresher() {
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

// unwatch counts a viewer out, stopping the refresher after the last one, unless it
// keeps the history, and waiting for it to exit (so that no goroutine of the handler
// outlives its last stream).
func (h *Handler) unwatch() {
	h.mu.Lock()
	h.viewers--
	var done chan struct{}
	if h.viewers == 0 && !h.always {
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
		rep := e.snap()
		e.hist.add(rep)
		f.Views[i] = newPipelineView(e.name, rep, e.hist.view(rep), e.counters())
	}
	h.mu.Lock()
	h.latest = f
	h.mu.Unlock()
	if old != nil {
		close(old.next)
	}
	return f
}

// counters returns the counters of WithRowStats, by row; nil without.
func (e *entry) counters() map[string]map[string]int64 {
	if len(e.rows) == 0 {
		return nil
	}
	m := make(map[string]map[string]int64, len(e.rows))
	for _, rs := range e.rows {
		c := m[rs.row]
		if c == nil {
			c = map[string]int64{}
			m[rs.row] = c
		}
		maps.Copy(c, rs.stats())
	}
	return m
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
	Retry    int64 // milliseconds before the page reconnects to a stream that was refused
}
