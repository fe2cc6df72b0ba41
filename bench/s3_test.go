package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopipeline/pipeline"
)

// S3: a staged pipeline (seed 002). 2,000 items; fetch: 16 workers waiting 20 ms each;
// write: 4 workers taking 2 ms each. The fetch stage is the bottleneck, so throughput
// is bounded by 16 / 20 ms; the benchmark measures that ceiling on this machine in the
// same run, with 16 goroutines doing nothing but the same waits.

const (
	s3Items        = 2_000
	s3FetchWorkers = 16
	s3FetchLatency = 20 * time.Millisecond
	s3WriteWorkers = 4
	s3WriteLatency = 2 * time.Millisecond
)

// page is what fetch returns for an id: a small record, as in the seed.
type page struct {
	ID     int
	Status int
	Title  string
}

// s3Ceiling returns the items per second that s3FetchWorkers goroutines doing nothing
// but the fetch stage's waits reach: s3Items/s3FetchWorkers waits each.
func s3Ceiling(ctx context.Context) float64 {
	start := time.Now()
	var wg sync.WaitGroup
	for range s3FetchWorkers {
		wg.Go(func() {
			for range s3Items / s3FetchWorkers {
				_ = pause(ctx, s3FetchLatency)
			}
		})
	}
	wg.Wait()
	return s3Items / time.Since(start).Seconds()
}

func BenchmarkS3Staged(b *testing.B) {
	ids := make([]int, s3Items)
	for i := range ids {
		ids[i] = i
	}
	for _, c := range []struct {
		name string
		buf  int
	}{
		{"100", 100},
		{"unbounded", s3Items}, // channels cannot grow: a buffer that holds every item
	} {
		b.Run("buf="+c.name, func(b *testing.B) {
			var f figures
			for b.Loop() {
				b.StopTimer()
				ceiling := s3Ceiling(b.Context())

				var written atomic.Int64
				p := pipeline.New(pipeline.WithBuffer(c.buf))
				pages := pipeline.Then(pipeline.FromSlice(p, ids), pipeline.NewStage("fetch", s3FetchWorkers,
					func(ctx context.Context, id int) (page, error) {
						if err := pause(ctx, s3FetchLatency); err != nil {
							return page{}, err
						}
						return page{ID: id, Status: 200, Title: "page"}, nil
					}))
				pipeline.To(pages, pipeline.NewSink("write", s3WriteWorkers, func(ctx context.Context, pg page) error {
					if err := pause(ctx, s3WriteLatency); err != nil {
						return err
					}
					written.Add(1)
					return nil
				}))

				base := heapBaseline()
				b.StartTimer()
				stop := sampleHeap()
				start := time.Now()
				err := p.Run(b.Context())
				wall := time.Since(start)
				peak := stop()
				b.StopTimer()

				rep := p.Report()
				o, serr := settle(rep)
				switch {
				case err != nil:
					b.Fatalf("Run = %v\n%v", err, rep)
				case serr != nil:
					b.Fatal(serr)
				case written.Load() != s3Items || o.given != s3Items || o.deadLettered+o.failed+o.notStarted != 0:
					b.Fatalf("written %d of %d\n%v", written.Load(), s3Items, rep)
				}
				fetch, _ := rep.Stage("fetch")
				write, _ := rep.Stage("write")
				f.add("items/s", s3Items/wall.Seconds())
				f.add("ceiling-items/s", ceiling)
				f.add("peak-q1", float64(fetch.PeakQueue))
				f.add("peak-q2", float64(write.PeakQueue))
				f.add("peak-heap-KiB", kib(peak, base))
				b.StartTimer()
			}
			f.report(b)
		})
	}
}
