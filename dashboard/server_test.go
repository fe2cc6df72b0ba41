package dashboard

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readEvents reads n events from an events stream and returns their data.
func readEvents(t *testing.T, r *bufio.Reader, n int) []string {
	t.Helper()
	var out []string
	var data []string
	for len(out) < n {
		line, err := r.ReadString('\n')
		require.NoError(t, err, "after %d events", len(out))
		line = strings.TrimSuffix(line, "\n")
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, d)
		} else if line == "" && data != nil {
			out = append(out, strings.Join(data, "\n"))
			data = nil
		}
	}
	return out
}

// TestStreamOverHTTP: through a real server whose WriteTimeout is shorter than the
// stream, events keep coming (each write has its own deadline), and the handler ends
// when the client hangs up (the server's Close would wait for it otherwise; goleak
// checks that nothing is left).
func TestStreamOverHTTP(t *testing.T) {
	t.Parallel()
	c := newCounter()
	h := newHandler(t, WithInterval(minInterval))
	h.add("p", c.snapshot)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.WriteTimeout = 2 * minInterval
	srv.Start()
	defer srv.Close()

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/events", nil)
	require.NoError(t, err)
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	assert.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
	events := readEvents(t, bufio.NewReader(res.Body), 6) // 5 intervals: past the WriteTimeout
	assert.NotEqual(t, events[0], events[5])
	require.NoError(t, res.Body.Close())
}

// TestConcurrentRequests: requests that arrive together share one Snapshot, also while
// pipelines are added.
func TestConcurrentRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCounter()
		h := newHandler(t)
		h.add("p", c.snapshot)
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				res := get(t, h, "GET", []string{"/data.json", "/"}[i%2])
				assert.Equal(t, http.StatusOK, res.StatusCode)
			})
		}
		wg.Wait()
		assert.Equal(t, 1, c.count())
		wg.Go(func() { h.add("q", newCounter().snapshot) })
		for range 10 {
			wg.Go(func() { get(t, h, "GET", "/data.json") })
		}
		wg.Wait()
		time.Sleep(time.Second)
		assert.Contains(t, body(t, get(t, h, "GET", "/data.json")), `"name":"q"`)
		assert.LessOrEqual(t, c.count(), 3)
	})
}
