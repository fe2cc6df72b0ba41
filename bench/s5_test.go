package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/sourcegraph/conc/pool"
	"golang.org/x/sync/errgroup"

	"github.com/gopipeline/pipeline"
)

// S5: framework overhead. No-op stages (the identity on ints), so that only the cost of
// moving items between goroutines is measured, for the library and two baselines:
//
//   - handwritten: what a Go engineer writes without a library: a source goroutine,
//     bounded channels between stages, n goroutines per stage ranging over their input,
//     a WaitGroup per stage to close its output, all under one errgroup.
//   - conc: the same graph with github.com/sourcegraph/conc v0.3.0.
//
// Every implementation calls the same stage function, with the same signature as a
// pipeline stage function, and counts the items that reach its sink.

const s5Buffer = 100

type s5Shape struct {
	name    string
	items   int
	stages  int
	workers int
}

// identity is the no-op stage function of every implementation.
func identity(_ context.Context, v int) (int, error) { return v, nil }

// s5Pipeline runs the shape through the library: a slice source, the stages, and a sink
// with one worker that counts.
func s5Pipeline(ctx context.Context, sh s5Shape, items []int) (int, error) {
	p := pipeline.New(pipeline.WithBuffer(s5Buffer))
	s := pipeline.FromSlice(p, items)
	for i := range sh.stages {
		s = pipeline.Then(s, pipeline.NewStage(fmt.Sprintf("stage%d", i+1), sh.workers, identity))
	}
	n := 0 // one sink worker: no synchronisation needed; Run's return orders the read
	pipeline.To(s, pipeline.NewSink("count", 1, func(context.Context, int) error {
		n++
		return nil
	}))
	err := p.Run(ctx)
	return n, err
}

// s5Handwritten is the baseline: goroutines, bounded channels and an errgroup.
func s5Handwritten(ctx context.Context, sh s5Shape, items []int) (int, error) {
	g, ctx := errgroup.WithContext(ctx)
	src := make(chan int, s5Buffer)
	g.Go(func() error {
		defer close(src)
		for _, v := range items {
			select {
			case src <- v:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	var in <-chan int = src
	for range sh.stages {
		in = handwrittenStage(ctx, g, sh.workers, in)
	}
	n := 0
	g.Go(func() error {
		for range in {
			n++
		}
		return nil
	})
	err := g.Wait()
	return n, err
}

// handwrittenStage starts the workers of one stage in g and returns the stage's output,
// which it closes once every worker is done.
func handwrittenStage(ctx context.Context, g *errgroup.Group, workers int, in <-chan int) <-chan int {
	out := make(chan int, s5Buffer)
	var wg sync.WaitGroup
	wg.Add(workers)
	for range workers {
		g.Go(func() error {
			defer wg.Done()
			for v := range in {
				w, err := identity(ctx, v)
				if err != nil {
					return err
				}
				select {
				case out <- w:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		wg.Wait()
		close(out)
		return nil
	})
	return out
}

// s5Conc is the same graph written with conc v0.3.0, the way its README uses it: conc's
// unit of work is a task submitted to a pool, not a long-lived worker, so each stage is
// a goroutine that ranges over its input channel and submits one task per item to a
// ContextPool limited to the stage's worker count (pool.Go blocks while all the workers
// are busy, which gives the backpressure); the task calls the stage function and sends
// the result on. Stages are joined by bounded channels, and the source, the stages and
// the sink run in one outer ContextPool that cancels everything on the first error
// (conc's errgroup.WithContext), and that, unlike errgroup, turns a panic in any of them
// into a panic in the caller.
func s5Conc(ctx context.Context, sh s5Shape, items []int) (int, error) {
	g := pool.New().WithContext(ctx).WithCancelOnError().WithFirstError()
	src := make(chan int, s5Buffer)
	g.Go(func(ctx context.Context) error {
		defer close(src)
		for _, v := range items {
			select {
			case src <- v:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	var in <-chan int = src
	for range sh.stages {
		in = concStage(g, sh.workers, in)
	}
	n := 0
	g.Go(func(context.Context) error {
		for range in {
			n++
		}
		return nil
	})
	err := g.Wait()
	return n, err
}

// concStage starts one stage in g: a goroutine that submits a task per item to a pool
// of the stage's size, and closes the stage's output once the pool is done.
func concStage(g *pool.ContextPool, workers int, in <-chan int) <-chan int {
	out := make(chan int, s5Buffer)
	g.Go(func(ctx context.Context) error {
		defer close(out)
		p := pool.New().WithContext(ctx).WithCancelOnError().WithFirstError().WithMaxGoroutines(workers)
		for v := range in {
			p.Go(func(ctx context.Context) error {
				w, err := identity(ctx, v)
				if err != nil {
					return err
				}
				select {
				case out <- w:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
		}
		return p.Wait()
	})
	return out
}

func BenchmarkS5Overhead(b *testing.B) {
	shapes := []s5Shape{
		{name: "3x4", items: 200_000, stages: 3, workers: 4},
		{name: "1xP", items: 1_000_000, stages: 1, workers: runtime.GOMAXPROCS(0)},
	}
	impls := []struct {
		name string
		run  func(context.Context, s5Shape, []int) (int, error)
	}{
		{"pipeline", s5Pipeline},
		{"handwritten", s5Handwritten},
		{"conc", s5Conc},
	}
	for _, sh := range shapes {
		items := make([]int, sh.items)
		for i := range items {
			items[i] = i
		}
		for _, impl := range impls {
			b.Run(fmt.Sprintf("shape=%s/impl=%s", sh.name, impl.name), func(b *testing.B) {
				b.ReportAllocs()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for b.Loop() {
					n, err := impl.run(b.Context(), sh, items)
					if err != nil || n != sh.items {
						b.Fatalf("run = %d items, %v; want %d, nil", n, err, sh.items)
					}
				}
				runtime.ReadMemStats(&after)
				total := float64(b.N) * float64(sh.items)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/item")
				b.ReportMetric(float64(after.Mallocs-before.Mallocs)/total, "allocs/item")
			})
		}
	}
}
