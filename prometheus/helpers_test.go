package pipelineprom_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	pipelineprom "github.com/gopipeline/pipeline/prometheus"
)

// registry returns a pedantic registry with p's collector.
func registry(p *pipeline.Pipeline) *prometheus.Registry {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(pipelineprom.NewCollector(p))
	return reg
}

// serve serves reg's metrics as promhttp does in production, on a test server closed
// at the end of the test, and returns the URL of its /metrics.
func serve(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// scrape GETs url as Prometheus does (text format) and returns the exposition text.
func scrape(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	return string(body)
}

// gather encodes what reg gathers in the text format, as a scrape would return it.
func gather(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	var b strings.Builder
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		require.NoError(t, enc.Encode(f))
	}
	return b.String()
}

// samples parses exposition text into its samples, keyed by name and sorted labels:
// `pipeline_stage_items_total{outcome="succeeded",stage="enrich"}`. It also returns
// the type of each metric family.
func samples(t *testing.T, text string) (map[string]float64, map[string]dto.MetricType) {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err, "%s", text)
	values, types := map[string]float64{}, map[string]dto.MetricType{}
	for name, f := range fams {
		types[name] = f.GetType()
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			add := func(name string, v float64, extra ...string) {
				ls := slices.Sorted(slices.Values(append(slices.Clone(labels), extra...)))
				key := name
				if len(ls) > 0 {
					key += "{" + strings.Join(ls, ",") + "}"
				}
				_, dup := values[key]
				require.False(t, dup, "duplicate sample %s", key)
				values[key] = v
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(name, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, m.GetGauge().GetValue())
			case dto.MetricType_SUMMARY:
				for _, q := range m.GetSummary().GetQuantile() {
					add(name, q.GetValue(), fmt.Sprintf("quantile=%q", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)))
				}
				add(name+"_count", float64(m.GetSummary().GetSampleCount()))
				add(name+"_sum", m.GetSummary().GetSampleSum())
			default:
				t.Fatalf("unexpected metric type %v of %s", f.GetType(), name)
			}
		}
	}
	return values, types
}
