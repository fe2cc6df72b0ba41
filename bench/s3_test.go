package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/pause"
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
				_ = pause.For(ctx, s3FetchLatency)
			}
		})
	}
	wg.Wait()
	return s3Items / time.Since(start).Seconds()
}

// s3Handwritten runs the same two stages without the library, the way a Go engineer
// writes them by hand (bounded channels, an errgroup, a WaitGroup to close the middle
// channel), and returns its items per second: the second stage's timers and wake-ups
// cost any two-stage pipeline a little against the one-stage ceiling.
func s3Handwritten(ctx context.Context, ids []int, buf int) float64 {
	start := time.Now()
	g, ctx := errgroup.WithContext(ctx)
	in, mid := make(chan int, buf), make(chan page, buf)
	g.Go(func() error { return batchSource(ctx, ids, in) })
	var fetchers sync.WaitGroup
	for range s3FetchWorkers {
		fetchers.Add(1)
		g.Go(func() error {
			defer fetchers.Done()
			for id := range in {
				if err := pause.For(ctx, s3FetchLatency); err != nil {
					return err
				}
				select {
				case mid <- page{ID: id, Status: 200, Title: "page"}:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		fetchers.Wait()
		close(mid)
		return nil
	})
	for range s3WriteWorkers {
		g.Go(func() error {
			for range mid {
				if err := pause.For(ctx, s3WriteLatency); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if g.Wait() != nil {
		return 0
	}
	return float64(len(ids)) / time.Since(start).Seconds()
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
				handwritten := s3Handwritten(b.Context(), ids, c.buf)

				var written atomic.Int64
				p := pipeline.New(pipeline.WithBuffer(c.buf))
				pages := pipeline.Then(pipeline.FromSlice(p, ids), pipeline.NewStage("fetch", s3FetchWorkers,
					func(ctx context.Context, id int) (page, error) {
						if err := pause.For(ctx, s3FetchLatency); err != nil {
							return page{}, err
						}
						return page{ID: id, Status: 200, Title: "page"}, nil
					}))
				pipeline.To(pages, pipeline.NewSink("write", s3WriteWorkers, func(ctx context.Context, pg page) error {
					if err := pause.For(ctx, s3WriteLatency); err != nil {
						return err
					}
					written.Add(1)
					return nil
				}))

				check := func(err error) pipeline.Report { return checkAll(b, p, err, &written, s3Items) }
				// Two runs of the same pipeline: one timed, one watched for memory (the
				// watcher's garbage collections would slow the timed one).
				b.StartTimer()
				start := time.Now()
				err := p.Run(b.Context())
				wall := time.Since(start)
				b.StopTimer()
				rep := check(err)
				heapKiB, err := watchHeap(func() error { return p.Run(b.Context()) })
				check(err)
				fetch, _ := rep.Stage("fetch")
				write, _ := rep.Stage("write")
				f.add("items/s", s3Items/wall.Seconds())
				f.add("ceiling-items/s", ceiling)
				f.add("handwritten-items/s", handwritten)
				f.add("peak-q1", float64(fetch.PeakQueue))
				f.add("peak-q2", float64(write.PeakQueue))
				f.add("peak-heap-KiB", heapKiB)
				b.StartTimer()
			}
			f.report(b)
		})
	}
}
