package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sourcegraph/conc/pool"
	"github.com/sourcegraph/conc/stream"
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
// pipeline stage function, and counts the items that reach its sink. The four shapes:
//
//   - 3x4 and 1xP: linear pipelines of unordered stages (s5Shape).
//   - ordered8: one order-preserving stage of 8 workers; the sink checks the order. The
//     unordered stage over the same items runs beside it as impl=unordered, so that the
//     cost of ordering is measured in the same run.
//   - batch1000: no stage; the items are grouped into batches of 1,000 for a sink that
//     counts items and batches.

const s5Buffer = 100

type s5Shape struct {
	name    string
	items   int
	stages  int
	workers int
}

// identity is the no-op stage function of every implementation.
func identity(_ context.Context, v int) (int, error) { return v, nil }

// s5Build builds the shape with the library: a slice source, the stages (each with
// opts), and a sink with one worker that counts into *n (no synchronisation needed: Run's
// return orders the read).
func s5Build(sh s5Shape, items []int, n *int, opts ...pipeline.StageOption) *pipeline.Pipeline {
	p := pipeline.New(pipeline.WithBuffer(s5Buffer))
	s := pipeline.FromSlice(p, items)
	for i := range sh.stages {
		s = pipeline.Then(s, pipeline.NewStage(fmt.Sprintf("stage%d", i+1), sh.workers, identity, opts...))
	}
	pipeline.To(s, pipeline.NewSink("count", 1, func(context.Context, int) error {
		*n++
		return nil
	}))
	return p
}

// s5Pipeline runs the shape through the library.
func s5Pipeline(ctx context.Context, sh s5Shape, items []int) (int, error) {
	n := 0
	err := s5Build(sh, items, &n).Run(ctx)
	return n, err
}

// s5Middleware is s5Pipeline with every stage wrapped in the per-item policies a real
// job configures (a timeout per attempt, retries, a dead-letter destination), none of
// which fires: it measures what the middleware costs an item that succeeds.
func s5Middleware(ctx context.Context, sh s5Shape, items []int) (int, error) {
	n := 0
	err := s5Build(sh, items, &n,
		pipeline.WithTimeout(time.Second),
		pipeline.WithRetry(3, pipeline.ExponentialBackoff(10*time.Millisecond, time.Second)),
		pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int])).Run(ctx)
	return n, err
}

// s5Observed is s5Pipeline watched the way a metrics adapter watches it, only far more
// often: a goroutine takes a Snapshot every millisecond during the run (a Prometheus
// scrape or an OpenTelemetry collection reads one Snapshot, typically every 15 s). It
// measures what observation costs the stages, which write their counters either way.
func s5Observed(ctx context.Context, sh s5Shape, items []int) (int, error) {
	n := 0
	p := s5Build(sh, items, &n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = p.Snapshot()
			}
		}
	})
	err := p.Run(ctx)
	close(stop)
	wg.Wait()
	return n, err
}

// s5Handwritten is the baseline: goroutines, bounded channels and an errgroup.
func s5Handwritten(ctx context.Context, sh s5Shape, items []int) (int, error) {
	g, ctx := errgroup.WithContext(ctx)
	src := make(chan int, s5Buffer)
	g.Go(func() error { return batchSource(ctx, items, src) })
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
	goWorkers(g, workers, out, func() error {
		for v := range in {
			w, err := identity(ctx, v)
			if err != nil {
				return err
			}
			if err := send(ctx, out, w); err != nil {
				return err
			}
		}
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
	g.Go(func(ctx context.Context) error { return batchSource(ctx, items, src) })
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

// s5Count is what the sink of one run counted.
type s5Count struct {
	items   int
	batches int // batch1000 only
}

// s5Impl is one implementation of a shape: run makes one whole run over items.
type s5Impl struct {
	name string
	run  func(ctx context.Context, items []int) (s5Count, error)
}

// linear adapts an implementation of the linear shapes to s5Impl.
func linear(name string, sh s5Shape, run func(context.Context, s5Shape, []int) (int, error)) s5Impl {
	return s5Impl{name, func(ctx context.Context, items []int) (s5Count, error) {
		n, err := run(ctx, sh, items)
		return s5Count{items: n}, err
	}}
}

// ordered8: 100,000 ints through one order-preserving stage of 8 workers.

const s5OrderedWorkers = 8

// orderCheck is the sink of the ordered shape: items are their own positions
// (items[i] == i), so the n-th item to arrive must be n. It runs in one goroutine.
type orderCheck struct{ n int }

// see counts v, or returns an error if v is out of order. The error stops the run, and
// the benchmark fails with it: b.Fatalf may only be called from the benchmark's own
// goroutine, not from a sink's.
func (c *orderCheck) see(v int) error {
	if v != c.n {
		return fmt.Errorf("out of order: item %d arrived at position %d", v, c.n)
	}
	c.n++
	return nil
}

// s5OrderedPipeline runs the ordered shape through the library, with the default
// window (the buffer plus 64 × workers = 612 items finished, in flight or queued from
// the oldest unfinished one): the window the library picks for a user who does not
// choose one.
func s5OrderedPipeline(ctx context.Context, items []int) (s5Count, error) {
	p := pipeline.New(pipeline.WithBuffer(s5Buffer))
	s := pipeline.FromSlice(p, items)
	s = pipeline.Then(s, pipeline.NewStage("stage1", s5OrderedWorkers, identity, pipeline.WithOrdered(0)))
	var check orderCheck // one sink worker: no synchronisation needed
	pipeline.To(s, pipeline.NewSink("check", 1, func(_ context.Context, v int) error {
		return check.see(v)
	}))
	err := p.Run(ctx)
	return s5Count{items: check.n}, err
}

// s5Window is the library's default reorder window for a stage of workers with a
// queue of s5Buffer (WithOrdered): the hand-written re-sequencers use the same.
func s5Window(workers int) int { return s5Buffer + 64*workers }

// seqItem is an item with its sequence number, for the hand-written re-sequencer.
type seqItem[T any] struct {
	seq int
	v   T
}

// s5OrderedHandwritten is the baseline for ordering: the source numbers the items,
// 8 workers process them over bounded channels, and a single re-sequencing goroutine
// puts them back in order (orderedHandwritten). The window is the stage's queue plus
// the library's default reorder window (s5Window): the same number of items the
// library may hold between its source and the stage's output, so both bound memory
// alike.
func s5OrderedHandwritten(ctx context.Context, items []int) (s5Count, error) {
	var check orderCheck
	err := orderedHandwritten(ctx, items, s5OrderedWorkers, s5Window(s5OrderedWorkers), identity, check.see)
	return s5Count{items: check.n}, err
}

// orderedHandwritten runs fn over items on workers goroutines and passes the results to
// sink in input order, as a Go engineer writes it by hand: the source numbers the
// items, the workers send them over bounded channels, and a single re-sequencing
// goroutine puts them back in order in a ring of window slots keyed by sequence number.
// A semaphore of window tokens bounds how far ahead items may run: the source takes one
// before it sends an item, the re-sequencer gives it back when it emits the item in
// order. So at most window items are between the source and the stage's output, their
// sequence numbers all lie in [next, next+window), and a ring of window slots never
// overwrites one.
func orderedHandwritten[In, Out any](ctx context.Context, items []In, workers, window int, fn func(context.Context, In) (Out, error), sink func(Out) error) error {
	g, ctx := errgroup.WithContext(ctx)
	sem := make(chan struct{}, window) // a token per item sent and not yet emitted in order
	src := make(chan seqItem[In], s5Buffer)
	g.Go(func() error {
		defer close(src)
		for i, v := range items {
			if err := send(ctx, sem, struct{}{}); err != nil {
				return err
			}
			if err := send(ctx, src, seqItem[In]{i, v}); err != nil {
				return err
			}
		}
		return nil
	})
	done := make(chan seqItem[Out], s5Buffer)
	goWorkers(g, workers, done, func() error {
		for it := range src {
			w, err := fn(ctx, it.v)
			if err != nil {
				return err
			}
			if err := send(ctx, done, seqItem[Out]{it.seq, w}); err != nil {
				return err
			}
		}
		return nil
	})
	out := make(chan Out, s5Buffer)
	g.Go(func() error {
		defer close(out)
		type slot struct {
			v    Out
			full bool
		}
		ring := make([]slot, window)
		next := 0 // sequence number of the next item to emit
		for it := range done {
			ring[it.seq%window] = slot{it.v, true}
			for ring[next%window].full {
				s := &ring[next%window]
				if err := send(ctx, out, s.v); err != nil {
					return err
				}
				*s = slot{}
				next++
				<-sem // never blocks: the source took a token for this item
			}
		}
		return nil
	})
	g.Go(func() error {
		for v := range out {
			if err := sink(v); err != nil {
				return err
			}
		}
		return nil
	})
	return g.Wait()
}

// s5OrderedConc is the ordered shape written with conc v0.3.0's stream.Stream, the way
// its README uses it: each item is a task on a stream of 8 goroutines, and the task's
// callback, which the stream calls in submission order on a single goroutine, is the
// sink. conc has no channels between stages, no buffer size (a stream queues at most
// workers + 1 tasks ahead of its callbacks) and no context or error: the caller's
// goroutine is the source, and a sink error cancels a context that stops the submission.
func s5OrderedConc(ctx context.Context, items []int) (s5Count, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s := stream.New().WithMaxGoroutines(s5OrderedWorkers)
	var check orderCheck // only callbacks touch it, one at a time
	for _, v := range items {
		if ctx.Err() != nil {
			break
		}
		s.Go(func() stream.Callback {
			w, err := identity(ctx, v)
			return func() {
				if err == nil {
					err = check.see(w)
				}
				if err != nil {
					cancel(err)
				}
			}
		})
	}
	s.Wait()
	return s5Count{items: check.n}, context.Cause(ctx)
}

// batch1000: 1,000,000 ints into batches of 1,000, then a sink that counts.

const s5BatchSize = 1000

// s5BatchPipeline runs the batch shape through the library: the source, Batch (with its
// input queue of s5Buffer items) and a sink of one worker, joined by ToBatches.
func s5BatchPipeline(ctx context.Context, items []int) (s5Count, error) {
	p := pipeline.New(pipeline.WithBuffer(s5Buffer))
	var c s5Count // one sink worker: no synchronisation needed
	pipeline.ToBatches(pipeline.FromSlice(p, items), s5BatchSize, pipeline.NewSink("count", 1, func(_ context.Context, b []int) error {
		c.items += len(b)
		c.batches++
		return nil
	}))
	err := p.Run(ctx)
	return c, err
}

// The three goroutines of the hand-written batch shape, shared by the errgroup and the
// conc versions so that they differ only in the group that runs them.

// goWorkers runs work in workers goroutines of g, and closes out, the channel they send
// on, once the last of them has returned.
func goWorkers[T any](g *errgroup.Group, workers int, out chan T, work func() error) {
	var wg sync.WaitGroup
	wg.Add(workers)
	for range workers {
		g.Go(func() error {
			defer wg.Done()
			return work()
		})
	}
	g.Go(func() error {
		wg.Wait()
		close(out)
		return nil
	})
}

// batchSource sends items on out, then closes it: the source goroutine of every
// hand-written shape.
func batchSource(ctx context.Context, items []int, out chan<- int) error {
	defer close(out)
	for _, v := range items {
		if err := send(ctx, out, v); err != nil {
			return err
		}
	}
	return nil
}

// batchItems groups the items of in into fresh slices of size items (the last one
// possibly shorter), sends them on out, then closes it. Each batch is a new slice that
// the sink owns, as with the library's Batch.
func batchItems(ctx context.Context, in <-chan int, size int, out chan<- []int) error {
	defer close(out)
	var batch []int
	send := func() error {
		select {
		case out <- batch:
			batch = nil
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for v := range in {
		if batch == nil {
			batch = make([]int, 0, size)
		}
		batch = append(batch, v)
		if len(batch) == size {
			if err := send(); err != nil {
				return err
			}
		}
	}
	if len(batch) > 0 {
		return send()
	}
	return nil
}

// batchCount is the sink: it counts the items and batches of in.
func batchCount(in <-chan []int, c *s5Count) {
	for b := range in {
		c.items += len(b)
		c.batches++
	}
}

// s5BatchHandwritten is the baseline: a source goroutine, a bounded channel, a
// batching goroutine, a bounded channel of batches and a sink goroutine, in an errgroup.
func s5BatchHandwritten(ctx context.Context, items []int) (s5Count, error) {
	g, ctx := errgroup.WithContext(ctx)
	src, batches := make(chan int, s5Buffer), make(chan []int, s5Buffer)
	var c s5Count
	g.Go(func() error { return batchSource(ctx, items, src) })
	g.Go(func() error { return batchItems(ctx, src, s5BatchSize, batches) })
	g.Go(func() error { batchCount(batches, &c); return nil })
	err := g.Wait()
	return c, err
}

// s5BatchConc is the batch shape as a conc v0.3.0 user writes it. conc has no batching
// (its pools and streams take tasks, one call per task), so the user writes the same
// channel code as the baseline and runs the goroutines in the ContextPool that s5Conc
// uses as its errgroup (first error cancels the rest, a panic is re-raised in the
// caller). It measures what conc's group costs over errgroup, not a batching primitive.
func s5BatchConc(ctx context.Context, items []int) (s5Count, error) {
	g := pool.New().WithContext(ctx).WithCancelOnError().WithFirstError()
	src, batches := make(chan int, s5Buffer), make(chan []int, s5Buffer)
	var c s5Count
	g.Go(func(ctx context.Context) error { return batchSource(ctx, items, src) })
	g.Go(func(ctx context.Context) error { return batchItems(ctx, src, s5BatchSize, batches) })
	g.Go(func(context.Context) error { batchCount(batches, &c); return nil })
	err := g.Wait()
	return c, err
}

// s5Measure runs one sub-benchmark: run makes one whole run over items items, and must
// count want; it reports the time and the allocations per item.
func s5Measure(b *testing.B, items int, want s5Count, run func(context.Context) (s5Count, error)) {
	b.Helper()
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for b.Loop() {
		got, err := run(b.Context())
		if err != nil || got != want {
			b.Fatalf("run = %+v, %v; want %+v, nil", got, err, want)
		}
	}
	runtime.ReadMemStats(&after)
	total := float64(b.N) * float64(items)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/item")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/total, "allocs/item")
}

func BenchmarkS5Overhead(b *testing.B) {
	sh3x4 := s5Shape{name: "3x4", items: 200_000, stages: 3, workers: 4}
	sh1xP := s5Shape{name: "1xP", items: 1_000_000, stages: 1, workers: runtime.GOMAXPROCS(0)}
	// The unordered stage of the ordered8 shape, for impl=unordered.
	sh1x8 := s5Shape{name: "ordered8", items: 100_000, stages: 1, workers: s5OrderedWorkers}
	cases := []struct {
		shape string
		items int
		want  s5Count // what the sink of every implementation must count
		impls []s5Impl
	}{
		{sh3x4.name, sh3x4.items, s5Count{items: sh3x4.items}, []s5Impl{
			linear("pipeline", sh3x4, s5Pipeline),
			linear("pipeline+snapshots", sh3x4, s5Observed),
			linear("pipeline+middleware", sh3x4, s5Middleware),
			linear("handwritten", sh3x4, s5Handwritten),
			linear("conc", sh3x4, s5Conc),
		}},
		{sh1xP.name, sh1xP.items, s5Count{items: sh1xP.items}, []s5Impl{
			linear("pipeline", sh1xP, s5Pipeline),
			linear("handwritten", sh1xP, s5Handwritten),
			linear("chunked", sh1xP, s5Chunked),
			linear("conc", sh1xP, s5Conc),
		}},
		{sh1x8.name, sh1x8.items, s5Count{items: sh1x8.items}, []s5Impl{
			{"pipeline", s5OrderedPipeline},
			{"handwritten", s5OrderedHandwritten},
			{"conc", s5OrderedConc},
			linear("unordered", sh1x8, s5Pipeline),
		}},
		{"batch1000", 1_000_000, s5Count{items: 1_000_000, batches: 1_000_000 / s5BatchSize}, []s5Impl{
			{"pipeline", s5BatchPipeline},
			{"handwritten", s5BatchHandwritten},
			{"conc", s5BatchConc},
		}},
	}
	for _, c := range cases {
		items := make([]int, c.items)
		for i := range items {
			items[i] = i
		}
		for _, impl := range c.impls {
			b.Run(fmt.Sprintf("shape=%s/impl=%s", c.shape, impl.name), func(b *testing.B) {
				s5Measure(b, c.items, c.want, func(ctx context.Context) (s5Count, error) { return impl.run(ctx, items) })
			})
		}
	}
	s5CPUShape(b)     // s5_cpu_test.go
	s5LatencyShape(b) // s5_cpu_test.go
}
