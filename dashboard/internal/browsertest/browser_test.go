package browsertest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/dashboard"
)

const chromium = "/usr/bin/chromium"

var (
	errMalformed = errors.New("malformed record")
	errUnknown   = errors.New("unknown customer")
)

// statusError is an error type of the test's own, as a service client would have:
// the page names it in words ("status error"), not as a Go type.
type statusError struct{ code int }

func (e *statusError) Error() string { return fmt.Sprintf("status %d", e.code) }

// etl is a pipeline that runs until ctx is done: a source of ids, a fast parse stage
// that dead-letters some items (three causes, one after a retry), an enrich stage paced by gate (the
// bottleneck: each item waits for a token), a batch and a sink.
func etl(gate <-chan struct{}) *pipeline.Pipeline {
	p := pipeline.New(pipeline.WithBuffer(32))
	ids := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
		for id := 1; ; id++ {
			if err := emit(id); err != nil {
				return err
			}
		}
	})
	parsed := pipeline.Then(ids, pipeline.NewStage("parse", 4, func(_ context.Context, id int) (int, error) {
		switch {
		case id%11 == 0:
			return 0, pipeline.Permanent(fmt.Errorf("record %d: %w", id, errMalformed))
		case id%17 == 0:
			return 0, pipeline.Permanent(fmt.Errorf("record %d: %w", id, errUnknown))
		case id%19 == 0:
			return 0, pipeline.RetryAfter(&statusError{429}, 0)
		}
		return id, nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]), pipeline.WithRetry(2, nil)))
	enriched := pipeline.Then(parsed, pipeline.NewStage("enrich", 4, func(ctx context.Context, id int) (int, error) {
		select {
		case <-gate:
			return id, nil
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	}, pipeline.WithTimeout(time.Second)))
	pipeline.ToBatches(enriched, 50, pipeline.NewSink("save", 2, func(context.Context, []int) error { return nil }),
		pipeline.WithLinger(200*time.Millisecond))
	return p
}

// browser starts headless Chromium for the test, or skips (fails with CI=true) when
// it is not installed.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no browser at %s (scripts/test.sh installs Debian's chromium package): %v", chromium, err)
		}
		t.Skipf("skipped: no browser at %s (apt-get install chromium, or run scripts/test.sh)", chromium)
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(t.Context(),
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox, // as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		// The network is closed: without these, Chromium keeps dialling out.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1290, 400), // the full screenshot grows to the page's height,
	)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel() // closes the tab and the browser, and waits for it to exit
		cancelAlloc()
	})
	return ctx
}

// runLive runs p until the test ends, and then checks that the run ended by that
// cancellation; it returns the run's context.
func runLive(t *testing.T, p *pipeline.Pipeline) context.Context {
	t.Helper()
	runCtx, stop := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		assert.ErrorIs(t, <-ran, context.Canceled)
	})
	return runCtx
}

// serve serves the page of p, under name and with the given interval, until the test
// ends, and returns the page's URL and its handler.
func serve(t *testing.T, name string, p *pipeline.Pipeline, interval time.Duration) (string, *dashboard.Handler) {
	t.Helper()
	h := dashboard.New(dashboard.WithInterval(interval))
	h.Add(name, p)
	mux := http.NewServeMux()
	mux.Handle("/debug/pipeline/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(h.Close) // before srv.Close: it ends the events stream
	return srv.URL + "/debug/pipeline/", h
}

// TestBrowser loads the page while a pipeline runs and checks the rendered DOM: every
// stage drawn, the bottleneck highlighted, dead letters by cause, figures that change
// between two reads as the page updates itself from the events stream, and recent
// percentiles that part from the whole run's after a latency shift.
func TestBrowser(t *testing.T) {
	ctx := browser(t)

	gate := make(chan struct{})
	p := etl(gate)
	runCtx := runLive(t, p)
	slow := make(chan struct{}) // closed: the service slows down twentyfold
	go func() {                 // the workload's pace: about 2,000 items per second through enrich
		tick := time.NewTicker(500 * time.Microsecond)
		defer tick.Stop()
		slowed := slow
		for {
			select {
			case <-runCtx.Done():
				return
			case <-slowed:
				tick.Reset(10 * time.Millisecond)
				slowed = nil
			case <-tick.C:
				select {
				case gate <- struct{}{}:
				case <-runCtx.Done():
					return
				}
			}
		}
	}()

	url, h := serve(t, "etl", p, 200*time.Millisecond)

	const section = `section[data-pipeline="etl"]`
	start := time.Now()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(section+" svg.graph g.stage")),
		chromedp.WaitVisible(chromedp.CSS("#status.live")), // an event has arrived
	))

	drawn, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('`+section+` svg.graph g.stage'), g => g.dataset.stage)`))
	require.NoError(t, err)
	var want []string
	for _, s := range p.Snapshot().Stages {
		want = append(want, s.Name)
	}
	assert.Equal(t, want, drawn, "every stage drawn, in the report's order")
	assert.Equal(t, []string{"Generate", "parse", "enrich", "Batch", "save"}, want)

	edges, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('`+section+` svg.graph path.edge').length`))
	require.NoError(t, err)
	assert.Equal(t, len(want)-1, edges, "a chain")

	// The figures move: read the sink's input count twice, the second time once the page
	// shows another value (the stream replaces the view every refresh).
	const savedIn = `document.querySelector('` + section + ` tr[data-stage="save"] td[data-field="in"]').textContent`
	first, err := chromedp.Run(ctx, chromedp.Evaluate[string](savedIn))
	require.NoError(t, err)
	second, err := chromedp.Run(ctx, chromedp.Poll[string](
		`(() => { const v = `+savedIn+`; return v !== `+jsString(first)+` && v; })()`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "the page's figures did not change")
	assert.NotEqual(t, first, second)

	// The bottleneck is the paced stage; the page marks it, and both causes show.
	bottleneck, err := chromedp.Run(ctx, chromedp.Poll[string](
		`(() => { const g = document.querySelector('`+section+` g.stage.bottleneck'); return g && g.dataset.stage; })()`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "no stage highlighted as the bottleneck")
	assert.Equal(t, "enrich", bottleneck)
	causes, err := chromedp.Run(ctx, chromedp.Poll[[]string](
		`(() => { const c = Array.from(document.querySelectorAll('`+section+` table.causes td:nth-child(3)'), td => td.textContent); return c.length == 3 && c; })()`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"malformed record", "unknown customer", "status #"}, causes)
	// Causes in words: the error column names types as a person would, never as Go does.
	names, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('`+section+` table.errors td:nth-child(2), `+section+` table.causes td:nth-child(2)'), td => td.textContent)`))
	require.NoError(t, err)
	assert.Contains(t, names, "status error")
	assert.Contains(t, names, "error")
	for _, n := range names {
		assert.NotContains(t, n, "*", "a Go type on the page: %q", n)
	}
	retried, err := chromedp.Run(ctx, chromedp.Poll[string](
		`(() => { const r = Array.from(document.querySelectorAll('`+section+` table.errors tr')).find(tr => tr.children[1].textContent == "status error"); return r && r.children[2].textContent != "0" && r.children[2].textContent; })()`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "no retries by cause")
	t.Logf("retries of status errors: %s", retried)

	// The history: charts for every stage, with more points at each refresh.
	points := func() int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Poll[int](
			`(() => { const h = document.querySelector('`+section+` table.history'); return h && +h.dataset.points; })()`,
			chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
		require.NoError(t, err, "no history drawn")
		return n
	}
	before := points()
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](
		`+document.querySelector('`+section+` table.history').dataset.points >= `+fmt.Sprint(before+3),
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "the history did not grow from %d points", before)
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('`+section+` table.history tbody tr'), tr => tr.dataset.stage)`))
	require.NoError(t, err)
	assert.Equal(t, want, rows, "a row of charts per stage")
	line, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`document.querySelector('`+section+` table.history tr[data-stage="enrich"] td:nth-child(2) polyline').getAttribute("points")`))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(strings.Fields(line)), 3, "the enrich stage's rate over time: %q", line)

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	saveScreenshot(t, "browser.png", png)

	// data.json, by the page's relative URL, as a script in the browser would read it.
	version, err := chromedp.Run(ctx, chromedp.Evaluate[int](
		`fetch("data.json").then(r => r.json()).then(d => d.pipelines[0].name == "etl" && d.version)`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, 1, version)

	// A latency shift: the service slows down, from about 2 ms an item to about 40 ms.
	// Once most items of the last 10 s are slow ones, the page's recent p50 is the new
	// latency, while the whole run's, most of whose items came before, stays near the
	// old one. (The whole run's turns too once the slow items outnumber the fast ones:
	// 5,000 fast ones first keep that far off.)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`(async () => {
			const d = await (await fetch("data.json")).json();
			return d.pipelines[0].stages.find(s => s.name == "enrich").latency.count >= 5000;
		})()`, chromedp.WithPollingInterval(250*time.Millisecond), chromedp.WithPollingTimeout(time.Minute)))
	require.NoError(t, err, "enrich did not reach 5,000 items")
	close(slow)
	shift := time.Now()
	const enrich = `document.querySelector('` + section + ` tr[data-stage="enrich"] td[data-field="%s"]').textContent`
	wholeBefore, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(enrich, "p50")))
	require.NoError(t, err)
	lat, err := chromedp.Run(ctx, chromedp.Poll[[]float64](`(async () => {
			const d = await (await fetch("data.json")).json();
			const s = d.pipelines[0].stages.find(s => s.name == "enrich");
			return s.recent_latency.p50_seconds >= 4 * s.latency.p50_seconds && [s.recent_latency.p50_seconds, s.latency.p50_seconds];
		})()`, chromedp.WithPollingInterval(250*time.Millisecond), chromedp.WithPollingTimeout(45*time.Second)))
	require.NoError(t, err, "the recent p50 did not rise above the whole run's after the shift")
	t.Logf("%v after the shift: recent p50 %.1f ms, whole run's %.1f ms (before the shift %s)",
		time.Since(shift).Round(time.Second), lat[0]*1e3, lat[1]*1e3, wholeBefore)
	cells, err := chromedp.Run(ctx, chromedp.Poll[[]string](fmt.Sprintf(`(() => { const r = `+enrich+`, w = `+enrich+`; return r != w && [r, w]; })()`, "recent-p50", "p50"),
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(5*time.Second)))
	require.NoError(t, err, "the page shows the same recent and whole-run p50")
	t.Logf("the page: p50 10 s %s, p50 %s", cells[0], cells[1])

	// Close (the server shutting down) ends the stream; the page says so.
	h.Close()
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("status").textContent == "reconnecting…"`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "the page did not notice the end of the stream")
	t.Logf("page checked in %v", time.Since(start).Round(time.Millisecond))
}

func jsString(s string) string {
	b := []byte{'"'}
	for _, r := range s {
		if r == '"' || r == '\\' {
			b = append(b, '\\')
		}
		b = append(b, string(r)...)
	}
	return string(append(b, '"'))
}

// saveScreenshot saves png as name in the test's artifact folder, and in
// $DASHBOARD_SCREENSHOTS when that is set (the README's pictures: docs/).
func saveScreenshot(t *testing.T, name string, png []byte) {
	t.Helper()
	require.True(t, slices.Equal(png[:8], []byte("\x89PNG\r\n\x1a\n")), "a PNG")
	dirs := []string{t.ArtifactDir()}
	if d := os.Getenv("DASHBOARD_SCREENSHOTS"); d != "" {
		dirs = append(dirs, d)
	}
	for _, dir := range dirs {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, png, 0o644))
		t.Logf("screenshot: %s", path)
	}
}

// TestBrowserSourceLag loads the page of a pipeline whose acknowledged source reports
// its lag (pipeline.WithLag) and checks the rendered DOM: the source's node says its
// lag, the stages table has a lag column with the total (by partition in its
// tooltip), the table by partition has a row per partition, and all follow the lag as
// it changes.
func TestBrowserSourceLag(t *testing.T) {
	ctx := browser(t)

	var behind atomic.Int64 // of partition orders/1; orders/0 stays at 5
	behind.Store(100)
	p := pipeline.New()
	msgs := pipeline.FromAcked(p, func(ctx context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		if err := emit(1, nil); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}, pipeline.WithName("orders"), pipeline.WithLag(func() []pipeline.PartitionLag {
		return []pipeline.PartitionLag{{Partition: "orders/0", Lag: 5}, {Partition: "orders/1", Lag: behind.Load()}}
	}))
	pipeline.To(msgs, pipeline.NewSink("store", 1, func(ctx context.Context, _ int) error {
		<-ctx.Done() // held: the run stays live
		return context.Cause(ctx)
	}))
	runLive(t, p)
	url, _ := serve(t, "orders", p, 100*time.Millisecond)

	const section = `section[data-pipeline="orders"]`
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(section+` tr[data-stage="orders"] td[data-field="lag"]`)),
		chromedp.WaitVisible(chromedp.CSS("#status.live")),
	))
	type shown struct {
		Cell, Title, Node string
		Parts             []string
	}
	read := `(() => {
		const s = document.querySelector('` + section + `');
		const cell = s.querySelector('table.stages tr[data-stage="orders"] td[data-field="lag"]');
		const node = Array.from(s.querySelectorAll('g.stage[data-stage="orders"] text'), e => e.textContent).find(t => t.startsWith("lag "));
		const parts = Array.from(s.querySelectorAll('table.lag tbody tr'), tr => tr.children[1].textContent + " " + tr.children[2].textContent);
		return {cell: cell.textContent, title: cell.title, node: node, parts: parts, want: %s};
	})()`
	poll := func(want string) shown {
		t.Helper()
		got, err := chromedp.Run(ctx, chromedp.Poll[shown](fmt.Sprintf(`(() => { const r = `+read+`; return r.cell == r.want && r; })()`, jsString(want)),
			chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
		require.NoError(t, err, "the page did not show a lag of %s", want)
		return got
	}
	assert.Equal(t, shown{
		Cell: "105", Title: "orders/0 5 · orders/1 100", Node: "lag 105 · 2 partitions",
		Parts: []string{"orders/0 5", "orders/1 100"},
	}, poll("105"))
	header, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('`+section+` table.stages thead th'), th => th.textContent)`))
	require.NoError(t, err)
	assert.Equal(t, "lag", header[len(header)-1], "the stages table's last column")
	empty, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`document.querySelector('`+section+` table.stages tr[data-stage="store"]').lastElementChild.textContent`))
	require.NoError(t, err)
	assert.Empty(t, empty, "a sink has no lag")

	behind.Store(1995) // the page follows
	assert.Equal(t, shown{
		Cell: "2,000", Title: "orders/0 5 · orders/1 1,995", Node: "lag 2,000 · 2 partitions",
		Parts: []string{"orders/0 5", "orders/1 1,995"},
	}, poll("2,000"))
}
