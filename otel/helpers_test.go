package pipelineotel_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/gopipeline/pipeline"
	pipelineotel "github.com/gopipeline/pipeline/otel"
)

// newReader returns a manual reader and a meter of a provider that uses it, shut down at
// the end of the test.
func newReader(t *testing.T) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { require.NoError(t, provider.Shutdown(t.Context())) })
	return reader, provider
}

// register registers p's instruments with a meter of a new provider (newReader), to be
// unregistered when the test ends, and returns the provider's reader.
func register(t *testing.T, p *pipeline.Pipeline) *sdkmetric.ManualReader {
	t.Helper()
	reader, provider := newReader(t)
	reg, err := pipelineotel.Register(p, provider.Meter("test"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Unregister()) })
	return reader
}

// collectRun registers p (register), runs it, which must succeed, and collects its
// data points once it has ended.
func collectRun(t *testing.T, p *pipeline.Pipeline) map[string]point {
	t.Helper()
	reader := register(t, p)
	require.NoError(t, p.Run(t.Context()))
	return collect(t, reader)
}

// point is one collected data point.
type point struct {
	value       float64
	kind        string // "sum" (non-monotonic), "monotonic sum" or "gauge"
	unit        string
	temporality metricdata.Temporality
}

// collect collects reader and returns its data points keyed by instrument name and
// sorted attributes: `pipeline.stage.items{pipeline.outcome=succeeded,pipeline.stage=enrich}`.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	points := map[string]point{}
	add := func(m metricdata.Metrics, attrs attribute.Set, p point) {
		var kvs []string
		for _, kv := range attrs.ToSlice() {
			kvs = append(kvs, fmt.Sprintf("%s=%s", kv.Key, kv.Value.String()))
		}
		slices.Sort(kvs)
		key := m.Name
		if len(kvs) > 0 {
			key += "{" + strings.Join(kvs, ",") + "}"
		}
		_, dup := points[key]
		require.False(t, dup, "duplicate data point %s", key)
		p.unit = m.Unit
		points[key] = p
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				kind := "sum"
				if d.IsMonotonic {
					kind = "monotonic sum"
				}
				for _, dp := range d.DataPoints {
					add(m, dp.Attributes, point{value: float64(dp.Value), kind: kind, temporality: d.Temporality})
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					add(m, dp.Attributes, point{value: float64(dp.Value), kind: "gauge"})
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					add(m, dp.Attributes, point{value: dp.Value, kind: "gauge"})
				}
			default:
				t.Fatalf("unexpected data %T of %s", m.Data, m.Name)
			}
		}
	}
	return points
}

// checkValues asserts that got holds each data point of want with its value.
func checkValues(t *testing.T, got map[string]point, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		p, ok := got[k]
		if !ok {
			t.Errorf("no data point %s; have:\n%s", k, strings.Join(slices.Sorted(maps.Keys(got)), "\n"))
			continue
		}
		if p.value != v {
			t.Errorf("%s = %v, want %v", k, p.value, v)
		}
	}
}
