package pipelineprom_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gopipeline/pipeline"
	pipelineprom "github.com/gopipeline/pipeline/prometheus"
)

// This example shows a pipeline's metrics served on /metrics, as Prometheus scrapes
// them. A stage sets aside the items it cannot parse; the scrape counts them.
func ExampleNewCollector() {
	p := pipeline.New()
	lines := pipeline.FromSlice(p, []string{"1", "2", "x", "4"})
	numbers := pipeline.Then(lines, pipeline.NewStage("parse", 2, func(_ context.Context, s string) (int, error) {
		if s == "x" {
			return 0, pipeline.Permanent(errors.New("not a number"))
		}
		return len(s), nil
	}, pipeline.WithDeadLetter(pipeline.NewDeadLetterBuffer[string](10).Add)))
	pipeline.To(numbers, pipeline.NewSink("store", 1, func(context.Context, int) error { return nil }))

	reg := prometheus.NewRegistry()
	reg.MustRegister(pipelineprom.NewCollector(p))
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{}) // in a server: http.Handle("/metrics", metrics)

	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	rec := httptest.NewRecorder()
	metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "pipeline_stage_items_total") && strings.Contains(line, `stage="parse"`) ||
			strings.HasPrefix(line, "pipeline_running") {
			fmt.Println(line)
		}
	}
	// Output:
	// pipeline_running 0
	// pipeline_stage_items_total{outcome="dead_lettered",stage="parse"} 1
	// pipeline_stage_items_total{outcome="failed",stage="parse"} 0
	// pipeline_stage_items_total{outcome="succeeded",stage="parse"} 3
}

// This example shows two pipelines of one process in one registry, told apart by a
// constant label, under the application's namespace.
func ExampleWithConstLabels() {
	reg := prometheus.NewRegistry()
	for _, name := range []string{"orders", "refunds"} {
		p := pipeline.New()
		items := pipeline.FromSlice(p, make([]int, len(name)))
		pipeline.To(items, pipeline.NewSink("store", 1, func(context.Context, int) error { return nil }))
		if err := p.Run(context.Background()); err != nil {
			fmt.Println("error:", err)
			return
		}
		reg.MustRegister(pipelineprom.NewCollector(p,
			pipelineprom.WithNamespace("shop"),
			pipelineprom.WithConstLabels(prometheus.Labels{"pipeline": name})))
	}

	families, err := reg.Gather()
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	for _, f := range families {
		if f.GetName() != "shop_pipeline_stage_out_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[1].GetValue() != "store" { // labels are sorted: pipeline, stage
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			fmt.Println(f.GetName(), labels, m.GetCounter().GetValue())
		}
	}
	// Output:
	// shop_pipeline_stage_out_total [pipeline=orders stage=store] 6
	// shop_pipeline_stage_out_total [pipeline=refunds stage=store] 7
}

// This example shows the lag of a source with WithLag (the Kafka source gives its
// consumer lag so): a gauge per partition, scraped here while the first item is in
// the sink.
func ExampleCollector_sourceLag() {
	p := pipeline.New()
	msgs := pipeline.FromAcked(p, func(_ context.Context, emit func(string, func(pipeline.Settlement)) error) error {
		return emit("a", nil)
	}, pipeline.WithName("kafka"), pipeline.WithLag(func() []pipeline.PartitionLag {
		return []pipeline.PartitionLag{{Partition: "orders/0", Lag: 600}, {Partition: "orders/1", Lag: 634}}
	}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(pipelineprom.NewCollector(p))
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	pipeline.To(msgs, pipeline.NewSink("store", 1, func(context.Context, string) error {
		rec := httptest.NewRecorder()
		metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		for line := range strings.Lines(rec.Body.String()) {
			if strings.Contains(line, "pipeline_source_lag_items") {
				fmt.Print(line)
			}
		}
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
	}
	// Output:
	// # HELP pipeline_source_lag_items Items a source with WithLag has behind on a partition (for Kafka: the high watermark minus the committed offset), when it was scraped.
	// # TYPE pipeline_source_lag_items gauge
	// pipeline_source_lag_items{partition="orders/0",stage="kafka"} 600
	// pipeline_source_lag_items{partition="orders/1",stage="kafka"} 634
}
