package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"iter"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// paced is a pipeline of n items through a stage of 4 workers that take d each, and
// dead-letter every 10th item: 4/d items per second.
func paced(n int, d time.Duration) *pipeline.Pipeline {
	p := pipeline.New(pipeline.WithBuffer(16))
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i + 1
	}
	work := pipeline.Then(pipeline.FromSlice(p, ids), pipeline.NewStage("work", 4, func(_ context.Context, id int) (int, error) {
		time.Sleep(d)
		if id%10 == 0 {
			return 0, pipeline.Permanent(errMalformed)
		}
		return id, nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int])))
	pipeline.To(work, pipeline.NewSink("save", 1, func(context.Context, int) error { return nil }))
	return p
}

type historyData struct {
	Pipelines []struct {
		Run     uint64
		Running bool
		History struct {
			Seconds []float64
			Stages  []struct {
				Name    string
				Rate    []float64 `json:"rate_per_second"`
				Fill    []float64 `json:"queue_fill"`
				P99     []float64 `json:"p99_seconds"`
				Retried []float64 `json:"retried_per_second"`
				Dead    []float64 `json:"dead_lettered_per_second"`
			}
		}
	}
}

func readHistory(t *testing.T, h *Handler) historyData {
	t.Helper()
	var d historyData
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
	require.Len(t, d.Pipelines, 1)
	return d
}

// TestHistory: without any viewer, the handler keeps one point per interval of the run
// in progress, at most the window's worth (the oldest go first); the points stop when
// the run ends and stay until the next run, which starts afresh. The page draws them.
func TestHistory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := paced(10_000, 10*time.Millisecond) // 400/s: 25 s
		h := newHandler(t, WithInterval(time.Second), WithHistory(10*time.Second))
		h.Add("job", p)
		done := make(chan error)
		go func() { done <- p.Run(t.Context()) }()

		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		d := readHistory(t, h)
		hist := d.Pipelines[0].History
		assert.Equal(t, []float64{1, 2, 3, 4, 5}, hist.Seconds, "a point a second, with no viewer")
		require.Len(t, hist.Stages, 3)
		work := hist.Stages[1]
		assert.Equal(t, "work", work.Name)
		require.Len(t, work.Rate, 5)
		assert.InDelta(t, 360, work.Rate[4], 10, "4 workers at 10 ms, one item in ten dead-lettered")
		assert.InDelta(t, 40, work.Dead[4], 5, "one in ten dead-lettered")
		assert.Equal(t, []float64{0, 0, 0, 0, 0}, work.Retried)
		assert.Equal(t, 0.01, work.P99[4], "the recent p99: 10 ms")
		assert.GreaterOrEqual(t, work.Fill[4], 0.5, "the stage is the bottleneck: its queue is full, or nearly")
		assert.Nil(t, hist.Stages[0].Fill, "a source has no queue")
		assert.Nil(t, hist.Stages[0].P99, "nor workers")

		page := body(t, get(t, h, "GET", "/"))
		assert.Contains(t, page, `<table class="history" data-points="5">`)
		assert.Equal(t, 3+2*4, strings.Count(page, `<polyline class="line"`), "rate for each row; queue, p99, retries and dead letters for the two with workers")
		assert.Contains(t, page, "<h3>the last 4s</h3>")

		time.Sleep(10 * time.Second)
		synctest.Wait()
		hist = readHistory(t, h).Pipelines[0].History
		assert.Len(t, hist.Seconds, 10, "the window's worth")
		assert.Equal(t, 6.0, hist.Seconds[0], "the oldest went first")

		require.NoError(t, <-done)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		d = readHistory(t, h)
		assert.False(t, d.Pipelines[0].Running)
		ended := d.Pipelines[0].History.Seconds
		assert.Len(t, ended, 10)
		assert.Less(t, ended[9], 26.0, "no point after the run ended")

		go func() { done <- p.Run(t.Context()) }()
		time.Sleep(2*time.Second + time.Millisecond)
		synctest.Wait()
		d = readHistory(t, h)
		assert.Equal(t, uint64(2), d.Pipelines[0].Run)
		assert.Equal(t, []float64{1, 2}, d.Pipelines[0].History.Seconds, "a new run starts afresh")
		h.Close()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assert.Len(t, readHistory(t, h).Pipelines[0].History.Seconds, 3, "after Close, only data.json requests add points")
		require.NoError(t, <-done)
	})
}

// TestHistoryOff: WithHistory(0) keeps no history and starts no refresher.
// failingLoads is a checkpoint store whose Load succeeds once (position 0), then fails.
type failingLoads struct{ loads atomic.Int32 }

func (s *failingLoads) Load(context.Context) (int64, error) {
	if s.loads.Add(1) > 1 {
		return 0, errors.New("store down")
	}
	return 0, nil
}

func (*failingLoads) Save(context.Context, int64) error { return nil }

// TestHistoryIsOfTheRunShown takes a frame during a run (a point of its history), then
// one after a later run that was never seen running: one that ran to its end, or one
// whose checkpoint failed to load (a report with no rows). The frame shows no history:
// the earlier run's was shown with the later run's report, and with no rows the page
// looked up its stages by index and panicked in the refresher, killing the process.
func TestHistoryIsOfTheRunShown(t *testing.T) {
	t.Parallel()
	for _, loadFails := range []bool{false, true} {
		t.Run(map[bool]string{false: "a run never seen", true: "a run that failed to start"}[loadFails], func(t *testing.T) {
			t.Parallel()
			p := pipeline.New(pipeline.WithBuffer(4))
			started, release := make(chan struct{}), make(chan struct{})
			var first atomic.Bool
			var src *pipeline.Stream[int]
			if !loadFails {
				src = pipeline.FromSlice(p, []int{1, 2, 3})
			} else {
				src = pipeline.FromCheckpoint(p, &failingLoads{}, func(context.Context, int64) iter.Seq2[int, error] {
					return func(yield func(int, error) bool) {
						for i := range 3 {
							if !yield(i, nil) {
								return
							}
						}
					}
				})
			}
			pipeline.To(src, pipeline.NewSink("save", 1, func(context.Context, int) error {
				if first.CompareAndSwap(false, true) {
					close(started)
					<-release
				}
				return nil
			}))
			h := newHandler(t, WithInterval(time.Hour))
			h.Add("p", p)
			done := make(chan error, 1)
			go func() { done <- p.Run(t.Context()) }()
			<-started
			require.NotEmpty(t, h.take(0).Views[0].Data.History.Seconds, "a point of run 1")
			close(release)
			require.NoError(t, <-done)
			if loadFails {
				require.Error(t, p.Run(t.Context()))
				require.Empty(t, p.Report().Stages)
			} else {
				require.NoError(t, p.Run(t.Context()))
			}
			var f *frame
			require.NotPanics(t, func() { f = h.take(0) })
			d := f.Views[0].Data
			assert.Equal(t, uint64(2), d.Run)
			assert.Empty(t, d.History.Seconds, "run 2's frame with run 1's history")
			assert.Empty(t, d.History.Stages)
		})
	}
}

func TestHistoryOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCounter()
		h := newHandler(t, WithHistory(0))
		h.add("p", c.snapshot)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assert.Zero(t, c.count(), "no refresh without a viewer")
		assert.Contains(t, body(t, get(t, h, "GET", "/data.json")), `"history":{"seconds":[],"stages":[]}`)
		assert.PanicsWithValue(t, "dashboard: WithHistory(-1s): the history must not be negative", func() { WithHistory(-time.Second) })
	})
}

// TestChart: a chart draws at most one point per unit of width whatever the history's
// length, from the left edge to the right, highest values at the top.
func TestChart(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 10, 150, 151, 900, 9000} {
		times, values := make([]float64, n), make([]float64, n)
		for i := range n {
			times[i], values[i] = float64(i), float64(i%7)
		}
		c := newChart(times, values, 0, true, rate)
		pts := strings.Fields(c.Points)
		assert.LessOrEqual(t, len(pts), chartW, n)
		assert.Len(t, pts, min(n, chartW), n)
		assert.True(t, strings.HasPrefix(pts[0], "0.0,"), pts[0])
		assert.True(t, strings.HasPrefix(pts[len(pts)-1], "150.0,"), pts[len(pts)-1])
		assert.Equal(t, rate(values[n-1]), c.Now)
		assert.Equal(t, rate(float64(min(n-1, 6))), c.Peak)
	}
	c := newChart([]float64{0, 1}, []float64{0, 10}, 0, false, rate)
	assert.Equal(t, "0.0,33.0 150.0,1.0", c.Points, "0 at the bottom, the peak at the top")
	assert.Nil(t, newChart(nil, nil, 0, false, rate))
	late := newChart([]float64{0, 1, 2, 3}, []float64{0, 10}, 0, false, rate)
	assert.Equal(t, "100.0,33.0 150.0,1.0", late.Points, "a series begun late is drawn at the times of its values")
	one := newChart([]float64{3}, []float64{5}, 0, false, rate)
	assert.Empty(t, one.Points, "one point: labels only")
	assert.Equal(t, "5.0/s", one.Now)
}

func TestErrorName(t *testing.T) {
	t.Parallel()
	for typ, want := range map[string]string{
		"timeout":                   "timeout",
		"error":                     "error",
		"*pipeline.PanicError":      "panic",
		"*pipeline.retryAfterError": "retry later (Retry-After)",
		"*net.OpError":              "network error",
		"*url.Error":                "HTTP request failed",
		"*main.statusError":         "status error",
		"*myapp.HTTPError":          "HTTP error",
		"myapp.ErrRateLimited":      "err rate limited",
		"*pgconn.PgError":           "PostgreSQL error",
		"x.E":                       "e",
	} {
		assert.Equal(t, want, errorName(typ), typ)
	}
}

// TestPageWords: the page names errors in words, says "queued" on a running stage and
// "not started" on a finished one, gives a batch's rate in batches, shows recent
// percentiles beside the run's, the progress of a source that knows its total, and
// the state of every control.
func TestPageWords(t *testing.T) {
	t.Parallel()
	p := demo(200)
	require.NoError(t, p.Run(t.Context()))
	rep := p.Report()
	h := newHandler(t)
	h.Add("finished", p)
	page := body(t, get(t, h, "GET", "/"))
	assert.Contains(t, page, "<th>not started</th>")
	assert.Contains(t, page, " batches/s</td>")
	assert.Contains(t, page, "read 200 of 200 (100 %)")
	assert.NotContains(t, page, "s left", "no ETA once finished")
	assert.Contains(t, page, `<td class="l" title="error">error</td><td class="l">malformed record</td>`)

	live := rep
	live.Running = true
	for i := range live.Stages {
		s := &live.Stages[i]
		switch s.Name {
		case "FromSlice":
			s.Out, s.Rate = 50, 25
		case "parse":
			s.Recent = pipeline.Latency{Count: 10, P50: 40 * time.Millisecond, P90: 41 * time.Millisecond, P99: 45 * time.Millisecond, Max: 45 * time.Millisecond}
			s.Latency.P50 = 10 * time.Millisecond
			s.Breaker = &pipeline.BreakerReport{State: pipeline.BreakerOpen, Opened: 2, TimeOpen: 1500 * time.Millisecond, Held: 7}
			s.Limit, s.LimitHistory = 3, []pipeline.LimitChange{{At: 2 * time.Second, Limit: 3, Reason: "latency"}}
			s.Throttled = 250 * time.Millisecond
			s.Errors = append(s.Errors, pipeline.ErrorCount{Type: "*pipeline_test.httpError", Retried: 9})
		case "save": // its function ignores its context: an attempt past its timeout
			s.Timeout, s.OldestAttempt = 100*time.Millisecond, 1250*time.Millisecond
		}
	}
	h.add("live", func() pipeline.Report { return live })
	page = body(t, get(t, h, "GET", "/"))
	i := strings.Index(page, `data-pipeline="live"`)
	require.Positive(t, i)
	page = page[i:]
	assert.Contains(t, page, "<th>queued</th>")
	assert.Contains(t, page, "read 50 of 200 (25 %) · about 6s left")
	assert.Contains(t, page, "10s: p50 40ms p99 45ms", "the node shows the recent figures")
	assert.Contains(t, page, `<td data-field="recent-p50">40ms</td><td data-field="recent-p99">45ms</td>`)
	assert.Contains(t, page, `<td data-field="p50">10ms</td>`)
	assert.Contains(t, page, `class="dead" data-field="stuck">stuck attempt 1.25s</text>`, "the node shows the stuck attempt")
	assert.Contains(t, page, `class="control alert" data-field="control">breaker open 1.5s, 7 held</text>`, "what fits: the breaker first")
	assert.Contains(t, page, `<td class="l" data-field="breaker">open</td><td>2</td><td>1.5s</td><td>7</td><td data-field="limit">3/4</td><td class="l">latency at 2s</td><td>250ms</td>`)
	assert.Contains(t, page, `<td class="l" title="*pipeline_test.httpError">http error</td><td>9</td>`)
	assert.NotContains(t, page, ">*pipeline", "no Go type shown as a name")
}

// TestJSONControls: data.json carries each control's state, the recent percentiles and
// the causes' names.
func TestJSONControls(t *testing.T) {
	t.Parallel()
	c := newCounter()
	w := &c.rep.Stages[1]
	w.Breaker = &pipeline.BreakerReport{
		State: pipeline.BreakerHalfOpen, Opened: 1, TimeOpen: 2 * time.Second, Held: 3,
		Transitions: []pipeline.BreakerTransition{{To: pipeline.BreakerOpen, At: time.Second}, {To: pipeline.BreakerHalfOpen, At: 3 * time.Second}},
	}
	w.Limit, w.LimitHistory = 1, []pipeline.LimitChange{{At: time.Second, Limit: 1, Reason: "errors"}}
	w.Throttled = 1500 * time.Millisecond
	w.Recent = pipeline.Latency{Count: 4, P50: time.Millisecond, P90: 2 * time.Millisecond, P99: 3 * time.Millisecond, Max: 3 * time.Millisecond}
	w.Causes = []pipeline.Cause{{Type: "*net.OpError", Message: "connection reset", Count: 2}}
	c.rep.Stages[2].SetAside = 5        // a database's rejected rows, set aside by the sink
	w.DeadLettered, w.HandedBack = 4, 3 // 3 given back to an acknowledged source
	h := newHandler(t)
	h.add("p", c.snapshot)
	var d struct {
		Pipelines []struct {
			Stages []struct {
				Limit        int
				LimitHistory []limitJSON `json:"limit_history"`
				Breaker      *breakerJSON
				Throttled    float64     `json:"throttled_seconds"`
				Recent       latencyJSON `json:"recent_latency"`
				Causes       []causeJSON
				SetAside     int64 `json:"set_aside"`
				HandedBack   int64 `json:"handed_back"`
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
	s := d.Pipelines[0].Stages[1]
	assert.Equal(t, 1, s.Limit)
	assert.Equal(t, []limitJSON{{At: 1, Limit: 1, Reason: "errors"}}, s.LimitHistory)
	assert.Equal(t, &breakerJSON{
		State: "half-open", Opened: 1, Open: 2, Held: 3,
		Transitions: []transitionJSON{{To: "open", At: 1}, {To: "half-open", At: 3}},
	}, s.Breaker)
	assert.Equal(t, 1.5, s.Throttled)
	assert.Equal(t, latencyJSON{Count: 4, P50: 0.001, P90: 0.002, P99: 0.003, Max: 0.003}, s.Recent)
	assert.Equal(t, []causeJSON{{Type: "*net.OpError", Name: "network error", Message: "connection reset", Count: 2}}, s.Causes)
	assert.Equal(t, int64(5), d.Pipelines[0].Stages[2].SetAside)
	assert.Equal(t, int64(3), s.HandedBack)
	assert.Zero(t, d.Pipelines[0].Stages[2].HandedBack)
	assert.Contains(t, body(t, get(t, h, "GET", "/")), " · dead 4 (3 handed back)", "the stage's node")
	assert.Contains(t, body(t, get(t, h, "GET", "/")), "ok 3 · set aside 5</text>", "the sink's node")
	assert.Nil(t, d.Pipelines[0].Stages[2].Breaker, "none without WithCircuitBreaker")
	assert.Nil(t, d.Pipelines[0].Stages[2].LimitHistory, "none without WithAdaptiveWorkers")
}

// TestJSONBreakerPerKey: data.json and the stage's node carry a breaker per key's items
// held now and its keys not closed.
func TestJSONBreakerPerKey(t *testing.T) {
	t.Parallel()
	c := newCounter()
	w := &c.rep.Stages[1]
	w.Breaker = &pipeline.BreakerReport{
		State: pipeline.BreakerOpen, Opened: 2, TimeOpen: time.Second, PerKey: true, Holding: 120, KeysOpen: 1,
		Keys: []pipeline.KeyBreakerReport{{Key: "3", State: pipeline.BreakerOpen, Holding: 120, Opened: 2}},
	}
	h := newHandler(t)
	h.add("p", c.snapshot)
	var d struct {
		Pipelines []struct {
			Stages []struct{ Breaker *breakerJSON }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
	b := d.Pipelines[0].Stages[1].Breaker
	require.NotNil(t, b)
	assert.True(t, b.PerKey)
	assert.Equal(t, int64(120), b.Holding)
	assert.Equal(t, 1, b.KeysOpen)
	assert.Contains(t, body(t, get(t, h, "GET", "/")), "breaker 1 key open, 120 items held", "the stage's node")
}

// TestProgressResumed: a resumed checkpointed run's progress counts the positions done
// before it started, and shows beside what is read the position its checkpoint holds
// (behind what is read), on the page and in data.json.
func TestProgressResumed(t *testing.T) {
	t.Parallel()
	rep := reportOf(pipeline.NewStage("work", 2, func(_ context.Context, n int) (int, error) { return n, nil }))
	src := &rep.Stages[0]
	src.Total, src.Resumed, src.Out, src.Rate = 1000, 400, 100, 50
	rep.Checkpoint = 450
	h := newHandler(t)
	h.add("resumed", func() pipeline.Report { return rep })
	page := body(t, get(t, h, "GET", "/"))
	assert.Contains(t, page, "read 500 of 1,000 (50 %) · 400 of them before this run · ")
	assert.Contains(t, page, ">committed 450 (45 %)</span> · about 10s left")
	assert.Contains(t, page, `data-committed="0.45"`)
	var d struct {
		Pipelines []struct{ Progress progressJSON }
	}
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
	require.Len(t, d.Pipelines, 1)
	eta, committed, fraction := 10.0, int64(450), 0.45
	want := progressJSON{Read: 500, Resumed: 400, Total: 1000, Fraction: 0.5, ETA: &eta, Committed: &committed, CommittedFraction: &fraction}
	assert.Equal(t, want, d.Pipelines[0].Progress)

	plain := rep // not a checkpointed run: nothing committed to show
	plain.Checkpoint = -1
	h = newHandler(t)
	h.add("plain", func() pipeline.Report { return plain })
	page = body(t, get(t, h, "GET", "/"))
	assert.Contains(t, page, "read 500 of 1,000 (50 %)")
	assert.False(t, strings.Contains(page, "data-committed") || strings.Contains(page, ">committed "), "a run without a checkpoint shows nothing committed")
}
