package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

func TestRoutes(t *testing.T) {
	t.Parallel()
	_, h := ranDemo(t, 100)
	mux := http.NewServeMux()
	mux.Handle("/debug/pipeline/", h)
	mux.Handle("/stripped/", http.StripPrefix("/stripped", h))
	for _, tc := range []struct {
		method, target string
		code           int
		ctype          string
	}{
		{"GET", "/debug/pipeline/", 200, "text/html; charset=utf-8"},
		{"GET", "/debug/pipeline/index.html", 200, "text/html; charset=utf-8"},
		{"HEAD", "/debug/pipeline/", 200, "text/html; charset=utf-8"},
		{"GET", "/debug/pipeline/data.json", 200, "application/json"},
		{"GET", "/stripped/", 200, "text/html; charset=utf-8"},
		{"GET", "/stripped/data.json", 200, "application/json"},
		{"HEAD", "/stripped/events", 200, "text/event-stream"},
		{"GET", "/debug/pipeline", 307, ""}, // the mux adds the slash the page's relative links need
		{"GET", "/debug/pipeline/nope", 404, ""},
		{"POST", "/debug/pipeline/data.json", 405, ""},
	} {
		t.Run(tc.method+" "+tc.target, func(t *testing.T) {
			t.Parallel()
			res := get(t, mux, tc.method, tc.target)
			b := body(t, res)
			assert.Equal(t, tc.code, res.StatusCode)
			if tc.ctype != "" {
				assert.Equal(t, tc.ctype, res.Header.Get("Content-Type"))
				assert.Equal(t, "no-store", res.Header.Get("Cache-Control"))
			}
			if tc.method == "HEAD" {
				assert.Empty(t, b)
			}
		})
	}
}

func TestPage(t *testing.T) {
	t.Parallel()
	p, h := ranDemo(t, 200)
	page := body(t, get(t, h, "GET", "/"))
	for _, s := range p.Report().Stages {
		assert.Regexp(t, `<g class="stage( bottleneck)?" data-stage="`+s.Name+`"`, page, "a node for %s", s.Name)
		assert.Contains(t, page, `<tr data-stage="`+s.Name+`"`, "a row for %s", s.Name)
	}
	assert.Contains(t, page, "malformed record")
	assert.Contains(t, page, "record too large")
	assert.Contains(t, page, `new EventSource("events")`)
	assert.Contains(t, page, "run 1 · finished")
	if bn := p.Report().Bottleneck(0).Stage; assert.NotEmpty(t, bn) {
		assert.Contains(t, page, `<g class="stage bottleneck" data-stage="`+bn+`"`)
		assert.Equal(t, 1, strings.Count(page, `class="stage bottleneck"`))
	}
}

func TestPageEscapes(t *testing.T) {
	t.Parallel()
	c := &counter{rep: reportOf(pipeline.NewStage(`<script>alert(1)</script>`, 1, func(_ context.Context, n int) (int, error) {
		return 0, pipeline.Permanent(errors.New(`<img src=x onerror=alert(2)>`))
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int])))}
	require.Len(t, c.rep.Stages[1].Causes, 1)
	h := newHandler(t)
	h.add(`"><b>x`, c.snapshot)
	page := body(t, get(t, h, "GET", "/"))
	assert.NotContains(t, page, "<script>alert")
	assert.NotContains(t, page, "<img")
	assert.NotContains(t, page, `"><b>`)
	assert.Contains(t, page, "&lt;script&gt;alert(1)&lt;/script&gt;")
}

func TestPageEmpty(t *testing.T) {
	t.Parallel()
	h := newHandler(t)
	assert.Contains(t, body(t, get(t, h, "GET", "/")), "No pipeline has been added.")
	h.Add("later", pipeline.New())
	assert.Contains(t, body(t, get(t, h, "GET", "/")), "not run yet")
	var d map[string]any
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
	pl := d["pipelines"].([]any)[0].(map[string]any)
	assert.Equal(t, []any{}, pl["stages"])
	assert.Equal(t, []any{}, pl["edges"])
}

// TestJSONSchema pins the field names of data.json, and checks the figures against the
// report they come from.
func TestJSONSchema(t *testing.T) {
	t.Parallel()
	p, h := ranDemo(t, 300, WithInterval(2*time.Second))
	rep := p.Report()
	res := get(t, h, "GET", "/data.json")
	var d map[string]any
	require.NoError(t, json.Unmarshal([]byte(body(t, res)), &d))

	keys := func(v any) []string {
		t.Helper()
		m, ok := v.(map[string]any)
		require.True(t, ok, "an object: %v", v)
		return slices.Sorted(maps.Keys(m))
	}
	obj := func(v any) map[string]any { return v.(map[string]any) }
	assert.Equal(t, []string{"interval_seconds", "pipelines", "time", "version"}, keys(d))
	assert.Equal(t, 1.0, d["version"])
	assert.Equal(t, 2.0, d["interval_seconds"])
	_, err := time.Parse(time.RFC3339Nano, d["time"].(string))
	require.NoError(t, err)

	pipes := d["pipelines"].([]any)
	require.Len(t, pipes, 1)
	pl := obj(pipes[0])
	assert.Equal(t, []string{"bottleneck", "edges", "elapsed_seconds", "history", "name", "progress", "run", "running", "stages", "started"}, keys(pl),
		"error and checkpoint appear only when there is one")
	assert.Equal(t, map[string]any{"read": 300.0, "total": 300.0, "fraction": 1.0}, pl["progress"], "no ETA once finished")
	assert.Equal(t, map[string]any{"seconds": []any{}, "stages": []any{}}, pl["history"], "a finished run seen only after it ended")
	assert.Equal(t, "etl", pl["name"])
	assert.Equal(t, 1.0, pl["run"])
	assert.Equal(t, false, pl["running"])
	assert.Equal(t, []string{"stage", "warnings", "why", "workers"}, keys(pl["bottleneck"]))
	edges := pl["edges"].([]any)
	require.NotEmpty(t, edges)
	assert.Equal(t, []string{"from", "inferred", "to"}, keys(edges[0]))

	stages := pl["stages"].([]any)
	require.Len(t, stages, len(rep.Stages))
	stageKeys := []string{
		"bottleneck", "busy", "causes", "dead_lettered", "errors", "failed", "filtered", "handed_back", "in", "in_flight",
		"kind", "latency", "limit", "name", "next", "not_started", "out", "queue", "rate_per_second",
		"recent_latency", "retried", "set_aside", "succeeded", "throttled_seconds", "timeout_seconds", "window", "workers",
	}
	for i, v := range stages {
		s, want := obj(v), rep.Stages[i]
		if want.Kind == pipeline.KindBatch {
			assert.ElementsMatch(t, append(slices.Clone(stageKeys), "flushes"), keys(s))
			assert.Equal(t, []string{"bytes", "checkpoint", "end", "linger", "size"}, keys(s["flushes"]))
			assert.Equal(t, float64(want.Flushes.Size), obj(s["flushes"])["size"])
		} else {
			assert.Equal(t, stageKeys, keys(s), want.Name)
		}
		assert.Equal(t, []string{"cap", "fill", "len", "peak"}, keys(s["queue"]))
		assert.Equal(t, []string{"count", "max_seconds", "p50_seconds", "p90_seconds", "p99_seconds"}, keys(s["latency"]))
		assert.Equal(t, want.Name, s["name"])
		assert.Equal(t, string(want.Kind), s["kind"])
		assert.Equal(t, float64(want.In), s["in"], want.Name)
		assert.Equal(t, float64(want.DeadLettered), s["dead_lettered"], want.Name)
		assert.Equal(t, float64(want.PeakQueue), obj(s["queue"])["peak"], want.Name)
		assert.Equal(t, float64(want.Latency.Count), obj(s["latency"])["count"], want.Name)
		assert.Len(t, s["causes"], len(want.Causes))
		assert.Len(t, s["errors"], len(want.Errors))
	}
	parse := obj(stages[slices.IndexFunc(rep.Stages, func(s pipeline.StageReport) bool { return s.Name == "parse" })])
	assert.Equal(t, 1.0, parse["timeout_seconds"])
	causes := parse["causes"].([]any)
	require.Len(t, causes, 2)
	assert.Equal(t, []string{"count", "message", "name", "type"}, keys(causes[0]))
	assert.Equal(t, "malformed record", obj(causes[0])["message"])
	assert.Equal(t, []string{"dead_lettered", "failed", "name", "retried", "type"}, keys(parse["errors"].([]any)[0]))
}

func TestJSONErrorAndCheckpoint(t *testing.T) {
	t.Parallel()
	c := newCounter()
	c.rep.Err = errMalformed
	c.rep.Checkpoint = 0
	h := newHandler(t)
	h.add("x", c.snapshot)
	var d struct {
		Pipelines []struct {
			Error      string `json:"error"`
			Checkpoint *int64 `json:"checkpoint"`
		} `json:"pipelines"`
	}
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
	assert.Equal(t, "malformed record", d.Pipelines[0].Error)
	require.NotNil(t, d.Pipelines[0].Checkpoint)
	assert.Zero(t, *d.Pipelines[0].Checkpoint)
}

// TestEdges checks the graph drawn for a pipeline whose report knows only some edges:
// the known ones are solid, the rest inferred from the report's order, and no edge
// goes into a source or out of a sink.
func TestEdges(t *testing.T) {
	t.Parallel()
	id := pipeline.NewStage("id", 1, func(_ context.Context, n int) (int, error) { return n, nil })
	p := pipeline.New()
	a := pipeline.Then(pipeline.Filter(pipeline.FromSlice(p, []int{1, 2}), func(int) bool { return true }), id)
	b := pipeline.Then(pipeline.FromSlice(p, []int{3}), pipeline.NewStage("b", 1, func(_ context.Context, n int) (int, error) { return n, nil }))
	ts := pipeline.Tee(pipeline.Merge(a, b), 2)
	pipeline.To(ts[0], pipeline.NewSink("s0", 1, func(context.Context, int) error { return nil }))
	pipeline.ToBatches(ts[1], 2, pipeline.NewSink("s1", 1, func(context.Context, []int) error { return nil }))
	require.NoError(t, p.Run(t.Context()))
	rep := p.Report()
	v := newPipelineView("x", rep, historyJSON{}, nil)
	var got []string
	for _, e := range v.Data.Edges {
		s := e.From + "->" + e.To
		if e.Inferred {
			s += " (inferred)"
		}
		got = append(got, s)
	}
	t.Log(rep.Stages)
	kind := map[string]pipeline.Kind{}
	for _, s := range rep.Stages {
		kind[s.Name] = s.Kind
	}
	for _, e := range v.Data.Edges {
		assert.NotEqual(t, pipeline.KindSource, kind[e.To], e)
		assert.NotEqual(t, pipeline.KindSink, kind[e.From], e)
		from := slices.IndexFunc(v.Graph.Nodes, func(n node) bool { return n.Stage.Name == e.From })
		to := slices.IndexFunc(v.Graph.Nodes, func(n node) bool { return n.Stage.Name == e.To })
		assert.Less(t, v.Graph.Nodes[from].X, v.Graph.Nodes[to].X, "%v goes right", e)
	}
	// The edges the report gives are solid; FromSlice's (v0.1 leaves a filter's input
	// out) is solid or inferred.
	assert.Subset(t, got, []string{"Filter->id", "FromSlice#2->b", "Batch->s1"})
	assert.True(t, slices.Contains(got, "FromSlice->Filter") || slices.Contains(got, "FromSlice->Filter (inferred)"), got)
}

func TestOptionsAndMisuse(t *testing.T) {
	t.Parallel()
	assert.Equal(t, time.Second, New().interval)
	assert.Equal(t, minInterval, New(WithInterval(time.Millisecond)).interval)
	assert.Equal(t, 5*time.Second, New(WithInterval(5*time.Second)).interval)
	assert.PanicsWithValue(t, "dashboard: WithInterval(0s): the interval must be positive", func() { WithInterval(0) })
	assert.PanicsWithValue(t, `dashboard: Add("x", nil)`, func() { New().Add("x", nil) })
	assert.PanicsWithValue(t, "dashboard: Add with an empty name", func() { New().Add("", pipeline.New()) })
}

func TestAddReplaces(t *testing.T) {
	t.Parallel()
	h := newHandler(t)
	first, second := newCounter(), newCounter()
	second.rep.Stages[1].Name = "other"
	h.add("job", first.snapshot)
	h.add("b", newCounter().snapshot)
	assert.Contains(t, body(t, get(t, h, "GET", "/")), `data-stage="work"`)
	h.add("job", second.snapshot)
	var d struct {
		Pipelines []struct {
			Name   string
			Stages []struct{ Name string }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
	require.Len(t, d.Pipelines, 2)
	assert.Equal(t, "job", d.Pipelines[0].Name, "in place")
	assert.Equal(t, "other", d.Pipelines[0].Stages[1].Name, "a fresh frame after Add, however young the last one")
}

// TestOneSnapshotPerInterval: however many viewers and data.json requests, the handler
// takes one Snapshot of each pipeline per interval, and every viewer gets each frame.
func TestOneSnapshotPerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 200 * time.Millisecond
		c := newCounter()
		h := newHandler(t, WithInterval(interval), WithHistory(0)) // no history: refreshes only while watched
		h.add("p", c.snapshot)
		var streams []*stream
		var stops []func()
		for range 5 {
			s := newStream()
			streams = append(streams, s)
			stops = append(stops, serve(t, h, s, "/events"))
		}
		synctest.Wait()
		assert.Equal(t, 1, c.count(), "the first viewer takes a frame, the others share it")
		time.Sleep(10 * interval) // virtual time
		synctest.Wait()
		assert.Equal(t, 11, c.count())
		for range 20 {
			get(t, h, "GET", "/data.json")
			get(t, h, "GET", "/")
		}
		assert.Equal(t, 11, c.count(), "requests within the interval reuse the latest frame")
		for _, s := range streams {
			ev := s.events()
			require.Len(t, ev, 11)
			assert.Contains(t, ev[0], `data-stage="work"`)
			assert.NotEqual(t, ev[0], ev[10], "the figures move")
		}
		for _, stop := range stops {
			stop()
		}
		synctest.Wait()
		time.Sleep(10 * interval)
		assert.Equal(t, 11, c.count(), "no viewer, no refresh")
		h.mu.Lock()
		assert.Nil(t, h.stop, "the refresher has stopped")
		h.mu.Unlock()
	})
}

func TestJSONWithoutViewers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCounter()
		h := newHandler(t, WithHistory(0)) // 1 s, no background refresh
		h.add("p", c.snapshot)
		get(t, h, "GET", "/data.json")
		time.Sleep(999 * time.Millisecond)
		get(t, h, "GET", "/data.json")
		assert.Equal(t, 1, c.count())
		time.Sleep(time.Millisecond)
		get(t, h, "GET", "/data.json")
		assert.Equal(t, 2, c.count(), "a frame as old as the interval is taken anew")
	})
}

func TestEventFormat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHandler(t)
		h.add("p", newCounter().snapshot)
		s := newStream()
		stop := serve(t, h, s, "/events")
		synctest.Wait()
		stop()
		assert.Equal(t, "text/event-stream", s.header.Get("Content-Type"))
		raw := s.buf.String()
		assert.True(t, strings.HasPrefix(raw, "retry: 2000\ndata: "), raw[:40])
		assert.True(t, strings.HasSuffix(raw, "\n\n"))
		for line := range strings.Lines(strings.TrimSuffix(raw, "\n\n")) {
			assert.Regexp(t, `^(retry|data): `, line)
		}
	})
}

// TestEventsEnd: a stream ends when its client goes away and when Close is called;
// after Close, a new stream is refused. synctest.Test fails if any goroutine is left.
func TestEventsEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHandler(t)
		h.add("p", newCounter().snapshot)
		gone := serve(t, h, newStream(), "/events")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.ServeHTTP(newStream(), httptest.NewRequestWithContext(ctx, "GET", "/events", nil))
		}()
		time.Sleep(3 * time.Second)
		gone() // returns once that ServeHTTP has
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("the other stream ended with the first")
		default:
		}
		h.Close()
		<-done
		h.Close() // idempotent
		res := get(t, h, "GET", "/events")
		assert.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
		assert.Equal(t, http.StatusOK, get(t, h, "GET", "/data.json").StatusCode, "data.json still works")
	})
}

// TestStalledViewer: a viewer whose writes block delays neither the pipeline (no lock
// a stage waits on is held while writing), nor the refreshes, nor other requests. In
// the bubble, a pipeline blocked by the handler would be a deadlock, which fails the
// test.
func TestStalledViewer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := demo(500)
		h := newHandler(t, WithInterval(minInterval))
		h.Add("etl", p)
		stalled := newStream()
		stalled.block = make(chan struct{})
		stopStalled := serve(t, h, stalled, "/events")
		healthy := newStream()
		stopHealthy := serve(t, h, healthy, "/events")
		synctest.Wait()
		require.NoError(t, p.Run(t.Context()))
		time.Sleep(2 * minInterval)
		synctest.Wait()
		assert.NotEmpty(t, healthy.events())
		var d struct {
			Pipelines []struct {
				Running bool
				Stages  []struct{ In int64 }
			}
		}
		require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
		assert.False(t, d.Pipelines[0].Running)
		assert.Equal(t, int64(500), d.Pipelines[0].Stages[0].In)
		close(stalled.block)
		stopStalled()
		stopHealthy()
	})
}

// TestSchemaDocumented: the schema in the package doc names every field of data.json,
// and no other.
func TestSchemaDocumented(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	doc := string(src)
	doc = doc[strings.Index(doc, "# The JSON schema"):]
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile(`"([a-z0-9_]+)":`).FindAllStringSubmatch(doc, -1) {
		documented[m[1]] = true
	}

	c := newCounter()
	c.rep.Err, c.rep.Checkpoint, c.rep.Started = errMalformed, 7, time.Now()
	c.rep.Stages = append(c.rep.Stages, pipeline.StageReport{Name: "b", Kind: pipeline.KindBatch, Workers: 1, QueueCap: 4})
	c.rep.Stages[1].Errors = []pipeline.ErrorCount{{Type: "error", DeadLettered: 1}}
	c.rep.Stages[1].Causes = []pipeline.Cause{{Type: "error", Message: "bad", Count: 1}}
	c.rep.Stages[1].LimitHistory = []pipeline.LimitChange{{At: time.Second, Limit: 1, Reason: "latency"}}
	c.rep.Stages[1].OldestAttempt = time.Second
	c.rep.Stages[1].Breaker = &pipeline.BreakerReport{State: pipeline.BreakerOpen, Transitions: []pipeline.BreakerTransition{{To: pipeline.BreakerOpen}}, PerKey: true, Holding: 1, KeysOpen: 1}
	c.rep.Stages[0].Resumed = 2 // a resumed checkpointed run
	c.rep.Stages[0].Lag = []pipeline.PartitionLag{{Partition: "orders/0", Lag: 3}}
	c.rep.Stages = append(c.rep.Stages, pipeline.StageReport{
		Name: "w", Kind: pipeline.KindWindow, Workers: 1, QueueCap: 4,
		Windows: &pipeline.WindowReport{Open: 1, Watermark: time.Now(), Lag: time.Second},
	})
	h := newHandler(t)
	h.add("p", c.snapshot, WithRowStats(c.rep.Stages[0].Name, func() map[string]int64 { return map[string]int64{"acked": 1, "redelivered": 0} }))
	var d any
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
	served := map[string]bool{}
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				served[k] = true
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(d)
	assert.Equal(t, slices.Sorted(maps.Keys(documented)), slices.Sorted(maps.Keys(served)))
}

// TestRowStats: the counters of WithRowStats show on their row's node, in the table of
// connector counters and in data.json, merged when a row has two; a row the report
// does not have shows nothing, and Add under the same name drops the old counters.
func TestRowStats(t *testing.T) {
	t.Parallel()
	c := newCounter()
	calls := 0
	h := newHandler(t, WithHistory(0))
	h.add("p", c.snapshot,
		WithRowStats("FromSlice", func() map[string]int64 { calls++; return map[string]int64{"redelivered": 3, "acked": 1200} }),
		WithRowStats("FromSlice", func() map[string]int64 { return map[string]int64{"naks": 2} }),
		WithRowStats("work", func() map[string]int64 { return map[string]int64{"rows written": 9} }),
		WithRowStats("nowhere", func() map[string]int64 { return map[string]int64{"lost": 1} }))
	page := body(t, get(t, h, "GET", "/"))
	assert.Contains(t, page, ">acked 1,200 · naks 2 · redelivered 3</text>", "the source's node")
	assert.Contains(t, page, ">rows written 9</text>", "a stage's node, with no control to show")
	assert.Contains(t, page, `<tr data-stage="FromSlice"><td class="l">FromSlice</td><td class="l" data-field="counters">acked 1,200 · naks 2 · redelivered 3</td></tr>`)
	assert.NotContains(t, page, "lost")
	var d struct {
		Pipelines []struct {
			Stages []struct {
				Name     string
				Counters map[string]int64
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
	got := map[string]map[string]int64{}
	for _, s := range d.Pipelines[0].Stages {
		if s.Counters != nil {
			got[s.Name] = s.Counters
		}
	}
	assert.Equal(t, map[string]map[string]int64{
		"FromSlice": {"acked": 1200, "naks": 2, "redelivered": 3},
		"work":      {"rows written": 9},
	}, got)
	assert.Positive(t, calls)

	h.add("p", c.snapshot) // replaced: without counters
	assert.NotContains(t, body(t, get(t, h, "GET", "/")), "connector counters")
}

// TestSourceLag: a source's lag (pipeline.WithLag) shows on its node, in a lag column
// of the stages table (its total, by partition in the tooltip), in a table by
// partition and in data.json; a pipeline whose sources report none has neither the
// column nor the table, and a source that holds no partition shows a lag of 0.
func TestSourceLag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		lag      []pipeline.PartitionLag
		node     string   // the source node's line
		cell     string   // the source's cell in the stages table
		rows     []string // the rows of the table by partition
		json     string   // the source's "lag" in data.json, "" when absent
		noColumn bool
	}{
		{
			name: "three partitions",
			lag:  []pipeline.PartitionLag{{Partition: "orders/0", Lag: 600}, {Partition: "orders/1", Lag: 634}, {Partition: "orders/10", Lag: 1000}},
			node: ">lag 2,234 · 3 partitions</text>",
			cell: `<td data-field="lag" title="orders/0 600 · orders/1 634 · orders/10 1,000">2,234</td></tr>`,
			rows: []string{
				`<tr data-stage="FromSlice"><td class="l">FromSlice</td><td class="l">orders/0</td><td data-field="lag">600</td></tr>`,
				`<tr data-stage="FromSlice"><td class="l">FromSlice</td><td class="l">orders/1</td><td data-field="lag">634</td></tr>`,
				`<tr data-stage="FromSlice"><td class="l">FromSlice</td><td class="l">orders/10</td><td data-field="lag">1,000</td></tr>`,
			},
			json: `{"total":2234,"partitions":[{"partition":"orders/0","lag":600},{"partition":"orders/1","lag":634},{"partition":"orders/10","lag":1000}]}`,
		},
		{
			name: "one partition",
			lag:  []pipeline.PartitionLag{{Partition: "file", Lag: 7}},
			node: ">lag 7 · 1 partition</text>",
			cell: `<td data-field="lag" title="file 7">7</td></tr>`,
			rows: []string{`<tr data-stage="FromSlice"><td class="l">FromSlice</td><td class="l">file</td><td data-field="lag">7</td></tr>`},
			json: `{"total":7,"partitions":[{"partition":"file","lag":7}]}`,
		},
		{
			name: "none held",
			lag:  []pipeline.PartitionLag{},
			node: ">lag 0 · 0 partitions</text>",
			cell: `<td data-field="lag" title="">0</td></tr>`,
			json: `{"total":0,"partitions":[]}`,
		},
		{name: "not reported", noColumn: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newCounter()
			c.rep.Stages[0].Lag = tt.lag
			h := newHandler(t, WithHistory(0))
			h.add("p", c.snapshot)
			page := body(t, get(t, h, "GET", "/"))
			var d struct {
				Pipelines []struct {
					Stages []struct {
						Name string
						Lag  json.RawMessage
					}
				}
			}
			require.NoError(t, json.Unmarshal([]byte(body(t, get(t, h, "GET", "/data.json"))), &d))
			assert.Equal(t, tt.json, string(d.Pipelines[0].Stages[0].Lag))
			for _, s := range d.Pipelines[0].Stages[1:] {
				assert.Empty(t, s.Lag, s.Name)
			}
			if tt.noColumn {
				assert.NotContains(t, page, "lag")
				return
			}
			assert.Contains(t, page, tt.node)
			assert.Contains(t, page, tt.cell)
			assert.Contains(t, page, `<th title="sources: items behind, over their partitions">lag</th></tr></thead>`)
			assert.Contains(t, page, "<h3>lag by partition</h3>")
			for _, r := range tt.rows {
				assert.Contains(t, page, r)
			}
			assert.Equal(t, len(tt.rows), strings.Count(page, `<td data-field="lag">`), "one row per partition")
			// Every row of the stages table has the column: an empty cell for the others.
			stages := page[strings.Index(page, `<table class="stages">`):]
			stages = stages[:strings.Index(stages, "</table>")]
			for _, row := range strings.Split(stages, "<tr data-stage=")[1:] {
				assert.Equal(t, 20, strings.Count(row, "<td"), "cells of %s", row)
			}
		})
	}
}

func TestRowStatsMisuse(t *testing.T) {
	t.Parallel()
	assert.Panics(t, func() { WithRowStats("", func() map[string]int64 { return nil }) })
	assert.Panics(t, func() { WithRowStats("read", nil) })
	h := newHandler(t, WithHistory(0))
	assert.PanicsWithValue(t, `dashboard: Add("p"): option 1 of 1 is nil`, func() { h.Add("p", pipeline.New(), nil) })
}

// TestWindowNodeLine: a window stage's node shows its open windows, the watermark's
// lag and its late items in place of the latency.
func TestWindowNodeLine(t *testing.T) {
	t.Parallel()
	s := &stageJSON{Kind: pipeline.KindWindow, Workers: 1, Windows: &windowsJSON{Open: 3, Lag: 10, Late: 2}}
	assert.Equal(t, "3 open · lag 10s · late 2", nodeLines(s)[1])
}
