package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gopipeline/pipeline"
)

// S5 shape=cpu: real per-item work (parsing a CSV-like line, ~100–150 ns) through one
// order-preserving stage of GOMAXPROCS workers, against impl=loop, one goroutine doing
// the same work: the floor that concurrency must beat. shape=latency: items sent one at
// a time through an idle 3-stage pipeline, each waited for at the sink before the next
// is sent.

const s5CPUItems = 1_000_000

// csvRecord is what a line parses into.
type csvRecord struct {
	id    int
	name  string
	price float64
	qty   int
}

// s5Lines generates n CSV-like lines: id, name, price, quantity.
func s5Lines(n int) []string {
	names := []string{"alice", "bob", "carol", "dave", "erin", "frank"}
	lines := make([]string, n)
	for i := range lines {
		lines[i] = fmt.Sprintf("%d,%s,%d.%02d,%d", i, names[i%len(names)], i%1000, i%100, i%17)
	}
	return lines
}

// parse is the per-item work of shape=cpu.
func parse(_ context.Context, line string) (csvRecord, error) {
	var r csvRecord
	f := strings.SplitN(line, ",", 4)
	if len(f) != 4 {
		return r, fmt.Errorf("line %q: want 4 fields", line)
	}
	var err error
	if r.id, err = strconv.Atoi(f[0]); err != nil {
		return r, err
	}
	r.name = f[1]
	if r.price, err = strconv.ParseFloat(f[2], 64); err != nil {
		return r, err
	}
	if r.qty, err = strconv.Atoi(f[3]); err != nil {
		return r, err
	}
	return r, nil
}

// aggregate is the sink of shape=cpu: it checks the order and sums.
type aggregate struct {
	n     int
	total float64
}

func (a *aggregate) add(r csvRecord) error {
	if r.id != a.n {
		return fmt.Errorf("out of order: csvRecord %d at position %d", r.id, a.n)
	}
	a.n++
	a.total += r.price * float64(r.qty)
	return nil
}

func s5CPUPipeline(ctx context.Context, lines []string) (s5Count, error) {
	p := pipeline.New(pipeline.WithBuffer(s5Buffer))
	s := pipeline.Then(pipeline.FromSlice(p, lines), pipeline.NewStage("parse", runtime.GOMAXPROCS(0), parse, pipeline.WithOrdered(0)))
	var agg aggregate
	pipeline.To(s, pipeline.NewSink("sum", 1, func(_ context.Context, r csvRecord) error { return agg.add(r) }))
	err := p.Run(ctx)
	return s5Count{items: agg.n}, err
}

// s5CPUForEach is s5CPUPipeline ending in pipeline.ForEach instead of a sink stage:
// the sum runs where the window restores the order, as impl=chunked's runs in its
// re-sequencer, with no queue and no goroutine of its own.
func s5CPUForEach(ctx context.Context, lines []string) (s5Count, error) {
	p := pipeline.New(pipeline.WithBuffer(s5Buffer))
	s := pipeline.Then(pipeline.FromSlice(p, lines), pipeline.NewStage("parse", runtime.GOMAXPROCS(0), parse, pipeline.WithOrdered(0)))
	var agg aggregate
	pipeline.ForEach(s, agg.add, pipeline.WithName("sum"))
	err := p.Run(ctx)
	return s5Count{items: agg.n}, err
}

// s5CPUUnordered is s5CPUPipeline without the order: the sink sums what arrives.
func s5CPUUnordered(ctx context.Context, lines []string) (s5Count, error) {
	p := pipeline.New(pipeline.WithBuffer(s5Buffer))
	s := pipeline.Then(pipeline.FromSlice(p, lines), pipeline.NewStage("parse", runtime.GOMAXPROCS(0), parse))
	var agg aggregate
	pipeline.To(s, pipeline.NewSink("sum", 1, func(_ context.Context, r csvRecord) error {
		agg.n++
		agg.total += r.price * float64(r.qty)
		return nil
	}))
	err := p.Run(ctx)
	return s5Count{items: agg.n}, err
}

func s5CPULoop(ctx context.Context, lines []string) (s5Count, error) {
	var agg aggregate
	for _, l := range lines {
		r, err := parse(ctx, l)
		if err != nil {
			return s5Count{items: agg.n}, err
		}
		if err := agg.add(r); err != nil {
			return s5Count{items: agg.n}, err
		}
	}
	return s5Count{items: agg.n}, nil
}

// s5CPUHandwritten is the per-item baseline: the source numbers the lines, GOMAXPROCS
// workers parse them over bounded channels, and a re-sequencer puts them back in order
// (orderedHandwritten, with the window the library picks by default).
func s5CPUHandwritten(ctx context.Context, lines []string) (s5Count, error) {
	workers := runtime.GOMAXPROCS(0)
	var agg aggregate
	err := orderedHandwritten(ctx, lines, workers, s5Window(workers), parse, agg.add)
	return s5Count{items: agg.n}, err
}

// s5CPUBarrier is the floor of any concurrent version, for information: no streaming
// at all. GOMAXPROCS goroutines parse chunks of 64 lines (an atomic counter hands them
// out) into one slice of records, then one loop aggregates them in order. It costs one
// atomic add per 64 lines and the slice of every record at once, which a streaming
// pipeline does not keep.
func s5CPUBarrier(ctx context.Context, lines []string) (s5Count, error) {
	recs := make([]csvRecord, len(lines))
	var next atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for range runtime.GOMAXPROCS(0) {
		g.Go(func() error {
			for {
				i := int(next.Add(64)) - 64
				if i >= len(lines) {
					return nil
				}
				for j := i; j < min(i+64, len(lines)); j++ {
					r, err := parse(gctx, lines[j])
					if err != nil {
						return err
					}
					recs[j] = r
				}
			}
		})
	}
	var agg aggregate
	if err := g.Wait(); err != nil {
		return s5Count{}, err
	}
	for _, r := range recs {
		if err := agg.add(r); err != nil {
			return s5Count{items: agg.n}, err
		}
	}
	return s5Count{items: agg.n}, nil
}

// s5CPUShape runs shape=cpu as sub-benchmarks of BenchmarkS5Overhead.
func s5CPUShape(b *testing.B) {
	b.Helper()
	lines := s5Lines(s5CPUItems)
	for _, impl := range []struct {
		name string
		run  func(context.Context, []string) (s5Count, error)
	}{
		{"pipeline", s5CPUPipeline},
		{"pipeline+foreach", s5CPUForEach},
		{"unordered", s5CPUUnordered},
		{"handwritten", s5CPUHandwritten},
		{"chunked", s5CPUChunked},
		{"loop", s5CPULoop},
		{"barrier", s5CPUBarrier},
	} {
		b.Run("shape=cpu/impl="+impl.name, func(b *testing.B) {
			s5Measure(b, len(lines), s5Count{items: len(lines)}, func(ctx context.Context) (s5Count, error) { return impl.run(ctx, lines) })
		})
	}
}

// shape=latency: s5LatencyItems items, one at a time, through 3 identity stages.

const s5LatencyItems = 2000

// latencyRun sends each item on in and waits for it on out, timing each round trip.
func latencyRun(in chan<- int, out <-chan int, lat []time.Duration) error {
	for i := range lat {
		t0 := time.Now()
		in <- i
		if v := <-out; v != i {
			return fmt.Errorf("got %d, want %d", v, i)
		}
		lat[i] = time.Since(t0)
	}
	return nil
}

func s5LatencyPipeline(ctx context.Context, lat []time.Duration) error {
	in, out := make(chan int), make(chan int)
	p := pipeline.New(pipeline.WithBuffer(s5Buffer))
	s := pipeline.FromChan(p, in)
	for i := range 3 {
		s = pipeline.Then(s, pipeline.NewStage(fmt.Sprintf("stage%d", i+1), 1, identity))
	}
	pipeline.To(s, pipeline.NewSink("sink", 1, func(_ context.Context, v int) error { out <- v; return nil }))
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	err := latencyRun(in, out, lat)
	close(in)
	if rerr := <-errc; err == nil {
		err = rerr
	}
	return err
}

// s5LatencyHandwritten is the hand-written pipeline. Its source waits on in with a
// plain receive: a stage's failure leaves it there until the caller closes in.
func s5LatencyHandwritten(ctx context.Context, lat []time.Duration) error {
	return s5LatencyHand(ctx, lat, false)
}

// s5LatencyHandwrittenCancel is the hand-written pipeline whose source, like the
// library's FromChan, also stops when the run's context is done while it waits on in:
// a select on both, which parks on two channels per item.
func s5LatencyHandwrittenCancel(ctx context.Context, lat []time.Duration) error {
	return s5LatencyHand(ctx, lat, true)
}

func s5LatencyHand(ctx context.Context, lat []time.Duration, cancel bool) error {
	in, out := make(chan int), make(chan int)
	g, ctx := errgroup.WithContext(ctx)
	src := make(chan int, s5Buffer)
	g.Go(func() error {
		defer close(src)
		for {
			var v int
			var ok bool
			if cancel {
				select {
				case v, ok = <-in:
				case <-ctx.Done():
					return ctx.Err()
				}
			} else {
				v, ok = <-in
			}
			if !ok {
				return nil
			}
			if err := send(ctx, src, v); err != nil {
				return err
			}
		}
	})
	var c <-chan int = src
	for range 3 {
		c = handwrittenStage(ctx, g, 1, c)
	}
	g.Go(func() error {
		for v := range c {
			out <- v
		}
		return nil
	})
	err := latencyRun(in, out, lat)
	close(in)
	if gerr := g.Wait(); err == nil {
		err = gerr
	}
	return err
}

// s5LatencyShape runs shape=latency as sub-benchmarks of BenchmarkS5Overhead.
func s5LatencyShape(b *testing.B) {
	b.Helper()
	for _, impl := range []struct {
		name string
		run  func(context.Context, []time.Duration) error
	}{
		{"pipeline", s5LatencyPipeline},
		{"handwritten", s5LatencyHandwritten},
		{"handwritten+cancel", s5LatencyHandwrittenCancel},
	} {
		b.Run("shape=latency/impl="+impl.name, func(b *testing.B) {
			b.ReportAllocs()
			var all []time.Duration
			lat := make([]time.Duration, s5LatencyItems)
			for b.Loop() {
				if err := impl.run(b.Context(), lat); err != nil {
					b.Fatal(err)
				}
				all = append(all, lat...)
			}
			slices.Sort(all)
			total := float64(b.N) * s5LatencyItems
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/item")
			b.ReportMetric(float64(all[len(all)/2].Nanoseconds())/1e3, "p50-us")
			b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds())/1e3, "p99-us")
		})
	}
}
