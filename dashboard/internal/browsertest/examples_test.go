package browsertest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// build builds the command in dir (a folder of the repository, relative to this one)
// with its own module (GOWORK=off, as a user builds it) and returns the binary's path.
func build(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(dir))
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join("..", "..", "..", dir)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build in %s: %s", dir, out)
	return bin
}

var liveView = regexp.MustCompile(`live view at (http://\S+/debug/pipeline/)`)

// start runs bin with args and returns the address of the web view it prints on its
// standard error; stop interrupts it (SIGINT, as Ctrl-C) and returns its standard error.
func start(t *testing.T, bin string, args ...string) (url string, stop func() string) {
	t.Helper()
	cmd := exec.Command(bin, args...) //nolint:noctx // stopped by SIGINT, then waited for
	cmd.Dir = t.TempDir()
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	found := make(chan string, 1)
	var log strings.Builder
	read := make(chan struct{})
	go func() { // reads stderr to its end: the command never blocks on it
		defer close(read)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if m := liveView.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	var stopped bool
	stop = func() string {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(syscall.SIGINT)
			<-read
			_ = cmd.Wait() // 1: interrupted
		}
		return log.String()
	}
	t.Cleanup(func() { stop() })
	select {
	case url = <-found:
	case <-read:
		t.Fatalf("%s exited without serving its web view:\n%s", bin, stop())
	case <-time.After(time.Minute):
		t.Fatalf("%s printed no web view address in a minute:\n%s", bin, stop())
	}
	return url, stop
}

// poll evaluates a JavaScript expression every 50 ms until it is truthy, and returns
// its value; it fails the test after timeout.
func poll[T any](t *testing.T, ctx context.Context, timeout time.Duration, expr, what string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Poll[T](expr,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	require.NoError(t, err, what)
	return v
}

// TestBrowserOutage drives the web view of examples/outage: the circuit breaker opens
// while the service is down and closes after, the adaptive limit changes, the history
// has a chart of the limit, and the progress of its FromSlice source reaches 100 %.
func TestBrowserOutage(t *testing.T) {
	ctx := browser(t)
	bin := build(t, "examples/outage")
	url, stop := start(t, bin, "-n", "6000", "-down", "1s", "-wait", "-web", "127.0.0.1:0")

	const section = `section[data-pipeline="outage"]`
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(section+" svg.graph g.stage")),
	))
	const breaker = `document.querySelector('` + section + ` table.controls td[data-field="breaker"]')`
	const limit = `document.querySelector('` + section + ` table.controls td[data-field="limit"]')`
	// Read the breaker's state and the limit at each refresh until the breaker has
	// opened and closed again, or the run has finished.
	var states, limits []string
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
			`(() => { const b = `+breaker+`, l = `+limit+`, m = document.querySelector('`+section+` .meta');
				return [b ? b.textContent : "", l ? l.textContent : "", m && m.textContent.includes("finished") ? "finished" : ""]; })()`))
		require.NoError(t, err)
		if got[0] != "" && (len(states) == 0 || states[len(states)-1] != got[0]) {
			states = append(states, got[0])
		}
		if got[1] != "" && !slices.Contains(limits, got[1]) {
			limits = append(limits, got[1])
		}
		if slices.Contains(states, "open") && states[len(states)-1] == "closed" && len(limits) >= 2 || got[2] != "" {
			break
		}
		time.Sleep(50 * time.Millisecond) // the page's own pace: it refreshes every 250 ms
	}
	t.Logf("the page showed the breaker %v and the limit %v", states, limits)
	if assert.NotEmpty(t, states, "the page shows the breaker's state") {
		assert.Equal(t, "closed", states[len(states)-1], "closed at the end")
	}
	assert.NotEmpty(t, limits, "the page shows the adaptive limit")

	progress := poll[string](t, ctx, time.Minute,
		`(() => { const p = document.querySelector('`+section+` [data-field="progress"]'); return p && p.dataset.fraction == "1" && p.textContent; })()`,
		"the progress did not reach 100 %")
	assert.Contains(t, progress, "read 6,000 of 6,000 (100 %)")
	poll[bool](t, ctx, 20*time.Second, `document.querySelector('`+section+` .meta').textContent.includes("finished")`, "the run did not finish")
	// What the page showed live depends on when the browser came up (on a loaded
	// machine, after the one-second outage): the breaker's transitions and the limit's
	// changes since the run began are in data.json, whenever it is read.
	var call struct {
		Breaker *struct {
			Opened      int64 `json:"opened"`
			Transitions []struct {
				To string `json:"to"`
			} `json:"transitions"`
		} `json:"breaker"`
		LimitHistory []struct {
			Limit int `json:"limit"`
		} `json:"limit_history"`
	}
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(async () => {
		const d = await (await fetch("data.json")).json();
		const p = d.pipelines.find(p => p.name == "outage");
		return JSON.stringify(p && p.stages.find(s => s.name == "call"));
	})()`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(raw), &call), raw)
	require.NotNil(t, call.Breaker, "data.json has the call stage's breaker")
	var tos []string
	for _, tr := range call.Breaker.Transitions {
		tos = append(tos, tr.To)
	}
	assert.Contains(t, tos, "open", "the breaker opened while the service was down")
	if assert.NotEmpty(t, tos) {
		assert.Equal(t, "closed", tos[len(tos)-1], "and closed after")
	}
	assert.Positive(t, call.Breaker.Opened)
	seen := map[int]bool{}
	for _, c := range call.LimitHistory {
		seen[c.Limit] = true
	}
	assert.GreaterOrEqual(t, len(seen), 2, "the adaptive limit changed: %v", call.LimitHistory)
	dead, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`document.querySelector('`+section+` table.stages tr[data-stage="call"] td[data-field="dead_lettered"]').textContent`))
	require.NoError(t, err)
	assert.Equal(t, "0", dead, "the breaker holds the outage's items: none is dead-lettered (with fewer attempts than the breaker's Failures, the first ones were)")
	heads, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('`+section+` table.history th'), th => th.textContent)`))
	require.NoError(t, err)
	assert.Contains(t, heads, "adaptive limit")
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](
		`document.querySelectorAll('`+section+` table.history tr[data-stage="call"] polyline').length`))
	require.NoError(t, err)
	assert.Equal(t, 6, n, "rate, queue, p99, retries, dead letters and the limit of the call stage")

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	saveScreenshot(t, "outage.png", png)
	out := stop()
	assert.Contains(t, out, "the web view stays up until interrupted")
}

// TestBrowserETL drives the web view of the main job, examples/etl, over more records
// than the test waits for: its charts draw and grow, its errors and dead letters are
// named in words (the service's 429 and 503 as "status error"), the progress of its
// declared total (WithTotal) shows with the time left, and the page's screenshot is
// the README's.
func TestBrowserETL(t *testing.T) {
	ctx := browser(t)
	bin := build(t, "examples/etl")
	url, stop := start(t, bin, "-n", "1000000", "-dir", t.TempDir(), "-progress", "1h", "-web", "127.0.0.1:0")

	const section = `section[data-pipeline="etl"]`
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(section+" svg.graph g.stage")),
		chromedp.WaitVisible(chromedp.CSS("#status.live")),
	))
	const points = `+document.querySelector('` + section + ` table.history').dataset.points`
	first := poll[int](t, ctx, 30*time.Second, `document.querySelector('`+section+` table.history') && `+points, "no history drawn")
	poll[bool](t, ctx, 30*time.Second, points+` >= `+fmt.Sprint(first+4), "the history did not grow")
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('`+section+` table.history tbody tr'), tr => tr.dataset.stage)`))
	require.NoError(t, err)
	assert.Equal(t, []string{"read", "enrich", "Batch", "load"}, rows)
	progress := poll[string](t, ctx, 30*time.Second,
		`(() => { const p = document.querySelector('`+section+` [data-field="progress"]'); return p && +p.dataset.fraction > 0 && p.textContent.includes("left") && p.textContent; })()`,
		"no progress of the job's declared total")
	assert.Regexp(t, `read [\d,]+ of 1,000,000 \([\d.]+ %\) · committed [\d,]+ \([\d.]+ %\) · about .+ left`, progress,
		"what the checkpoint holds, beside what is read")

	names := poll[[]string](t, ctx, 30*time.Second,
		`(() => { const n = Array.from(document.querySelectorAll('`+section+` table.errors td:nth-child(2)'), td => td.textContent); return n.includes("status error") && n; })()`,
		"the service's 429 and 503 are not named")
	for _, n := range names {
		assert.NotContains(t, n, "*", "a Go type on the page: %q", n)
	}
	causes, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('`+section+` table.causes td:nth-child(2)'), td => td.textContent)`))
	require.NoError(t, err)
	assert.NotEmpty(t, causes)
	for _, n := range causes {
		assert.NotContains(t, n, "*", "a Go type on the page: %q", n)
	}

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	saveScreenshot(t, "dashboard.png", png)
	stop()
}
