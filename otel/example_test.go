package pipelineotel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/gopipeline/pipeline"
	pipelineotel "github.com/gopipeline/pipeline/otel"
)

// This example shows a pipeline observed through the OpenTelemetry SDK. A manual reader
// stands in for an exporter's: the pipeline is read when the reader collects.
func ExampleRegister() {
	reader := sdkmetric.NewManualReader() // in production: a periodic reader with an OTLP exporter
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()

	p := pipeline.New()
	lines := pipeline.FromSlice(p, []string{"1", "2", "x", "4"})
	numbers := pipeline.Then(lines, pipeline.NewStage("parse", 2, func(_ context.Context, s string) (int, error) {
		if s == "x" {
			return 0, pipeline.Permanent(errors.New("not a number"))
		}
		return len(s), nil
	}, pipeline.WithDeadLetter(pipeline.NewDeadLetterBuffer[string](10).Add)))
	pipeline.To(numbers, pipeline.NewSink("store", 1, func(context.Context, int) error { return nil }))

	reg, err := pipelineotel.Register(p, provider.Meter("example.com/ingest"),
		pipelineotel.WithAttributes(attribute.String("pipeline.name", "ingest")))
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	defer func() { _ = reg.Unregister() }()

	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		fmt.Println("error:", err)
		return
	}
	var out []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "pipeline.stage.items" {
				for _, dp := range sum.DataPoints {
					if stage, _ := dp.Attributes.Value("pipeline.stage"); stage.AsString() == "parse" {
						outcome, _ := dp.Attributes.Value("pipeline.outcome")
						out = append(out, fmt.Sprintf("%s %s %s=%d", m.Name, m.Unit, outcome.AsString(), dp.Value))
					}
				}
			}
		}
	}
	slices.Sort(out)
	for _, l := range out {
		fmt.Println(l)
	}
	// Output:
	// pipeline.stage.items {item} dead_lettered=1
	// pipeline.stage.items {item} failed=0
	// pipeline.stage.items {item} not_started=0
	// pipeline.stage.items {item} succeeded=3
}
