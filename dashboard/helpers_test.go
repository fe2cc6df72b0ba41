package dashboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

var (
	errMalformed = errors.New("malformed record")
	errTooLarge  = errors.New("record too large")
)

// demo builds a finished-able pipeline of every kind of row: a source, a filter, a
// stage that dead-letters some items under two causes, a batch and a sink.
func demo(n int) *pipeline.Pipeline {
	p := pipeline.New(pipeline.WithBuffer(8))
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i + 1
	}
	src := pipeline.Filter(pipeline.FromSlice(p, ids), func(id int) bool { return id%10 != 0 })
	parsed := pipeline.Then(src, pipeline.NewStage("parse", 4, func(_ context.Context, id int) (int, error) {
		switch {
		case id%7 == 0:
			return 0, pipeline.Permanent(fmt.Errorf("parse %d: %w", id, errMalformed))
		case id%13 == 0:
			return 0, pipeline.Permanent(fmt.Errorf("parse %d: %w", id, errTooLarge))
		}
		return id * 2, nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]), pipeline.WithTimeout(time.Second)))
	pipeline.ToBatches(parsed, 5, pipeline.NewSink("save", 1, func(context.Context, []int) error { return nil }))
	return p
}

// get serves one request to h and returns the response.
func get(t *testing.T, h http.Handler, method, target string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), method, target, nil))
	return rec.Result()
}

func body(t *testing.T, res *http.Response) string {
	t.Helper()
	var b bytes.Buffer
	_, err := b.ReadFrom(res.Body)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	return b.String()
}

// stream is a ResponseWriter for an events stream served in-process: it keeps what was
// written, and with block set each Write waits until block is closed (a stalled viewer).
type stream struct {
	header http.Header
	block  chan struct{}

	mu  sync.Mutex
	buf bytes.Buffer
}

func newStream() *stream { return &stream{header: http.Header{}} }

func (s *stream) Header() http.Header { return s.header }
func (s *stream) WriteHeader(int)     {}
func (s *stream) Flush()              {}

func (s *stream) Write(p []byte) (int, error) {
	if s.block != nil {
		<-s.block
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

// events returns the data of each event received so far.
func (s *stream) events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for ev := range strings.SplitSeq(s.buf.String(), "\n\n") {
		var data []string
		for line := range strings.Lines(ev) {
			if d, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: "); ok {
				data = append(data, d)
			}
		}
		if len(data) > 0 {
			out = append(out, strings.Join(data, "\n"))
		}
	}
	return out
}

// serve runs h.ServeHTTP for target in a goroutine, with a context the returned
// function cancels; that function returns once ServeHTTP has.
func serve(t *testing.T, h http.Handler, w http.ResponseWriter, target string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodGet, target, nil))
	}()
	return func() {
		cancel()
		<-done
	}
}

// counter is a pipeline stand-in that counts its snapshots.
type counter struct {
	mu    sync.Mutex
	calls int
	rep   pipeline.Report
}

func (c *counter) snapshot() pipeline.Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	r := c.rep
	r.Stages = append([]pipeline.StageReport(nil), c.rep.Stages...)
	r.Stages[0].Out = int64(c.calls)
	return r
}

func (c *counter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// newCounter returns a counter whose report is that of a real run (FromSlice, work,
// sink), marked as running.
func newCounter() *counter {
	return &counter{rep: reportOf(pipeline.NewStage("work", 2, func(_ context.Context, n int) (int, error) { return n, nil }))}
}

// reportOf runs FromSlice -> work -> sink over three items and returns its report,
// marked as running.
func reportOf(work *pipeline.Stage[int, int]) pipeline.Report {
	p := pipeline.New(pipeline.WithBuffer(4))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{1, 2, 3}), work),
		pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	_ = p.Run(context.Background()) // a failing item is a dead letter
	r := p.Report()
	r.Running = true
	return r
}

// ranDemo runs demo(n) and returns it with a handler (newHandler, with opts) that shows
// it as "etl".
func ranDemo(t *testing.T, n int, opts ...Option) (*pipeline.Pipeline, *Handler) {
	t.Helper()
	p := demo(n)
	require.NoError(t, p.Run(t.Context()))
	h := newHandler(t, opts...)
	h.Add("etl", p)
	return p, h
}

// newHandler returns New(opts...), closed when the test ends: with history, the
// handler refreshes in the background from its first Add until Close.
func newHandler(t *testing.T, opts ...Option) *Handler {
	t.Helper()
	h := New(opts...)
	t.Cleanup(h.Close)
	return h
}
