package bench

import (
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/gopipeline/pipeline"
)

// BenchmarkClientOverhead is S5's 3x4 shape (200,000 ints through 3 no-op stages of 4
// workers) with the options of a stage that calls a service, none of which fires: what
// a closed circuit breaker, an adaptive limit (settled at its maximum: a no-op stage
// never saturates) and a rate limiter that always has a token cost an item that
// succeeds, beside the plain stage measured in the same run.
func BenchmarkClientOverhead(b *testing.B) {
	sh := s5Shape{name: "3x4", items: 200_000, stages: 3, workers: 4}
	items := make([]int, sh.items)
	for i := range items {
		items[i] = i
	}
	for _, c := range []struct {
		name string
		opts func() []pipeline.StageOption
	}{
		{"plain", func() []pipeline.StageOption { return nil }},
		{"breaker", func() []pipeline.StageOption {
			return []pipeline.StageOption{pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 5, OpenFor: time.Second})}
		}},
		{"breakerperkey", func() []pipeline.StageOption {
			return []pipeline.StageOption{pipeline.WithBreakerPerKey(func(v int) int { return v % 16 }, pipeline.Breaker{Failures: 5, OpenFor: time.Second}, pipeline.KeyBounds{})}
		}},
		{"adaptive", func() []pipeline.StageOption { return []pipeline.StageOption{pipeline.WithAdaptiveWorkers(4)} }},
		{"ratelimit", func() []pipeline.StageOption {
			return []pipeline.StageOption{pipeline.WithRateLimit(rate.NewLimiter(rate.Limit(math.Inf(1)), 1))}
		}},
	} {
		b.Run(fmt.Sprintf("shape=%s/impl=%s", sh.name, c.name), func(b *testing.B) {
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for b.Loop() {
				n := 0
				if err := s5Build(sh, items, &n, c.opts()...).Run(b.Context()); err != nil || n != sh.items {
					b.Fatalf("run: %d items, %v; want %d, nil", n, err, sh.items)
				}
			}
			runtime.ReadMemStats(&after)
			total := float64(b.N) * float64(sh.items)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/item")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/total, "allocs/item")
		})
	}
}
