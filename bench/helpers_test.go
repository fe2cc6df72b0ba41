package bench

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gopipeline/pipeline"
)

// figures accumulates a benchmark's custom metrics over its iterations; report divides
// each by b.N, so that a figure is the mean of one run.
type figures struct {
	units []string
	sums  map[string]float64
}

func (f *figures) add(unit string, v float64) {
	if f.sums == nil {
		f.sums = make(map[string]float64)
	}
	if _, ok := f.sums[unit]; !ok {
		f.units = append(f.units, unit)
	}
	f.sums[unit] += v
}

func (f *figures) report(b *testing.B) {
	b.Helper()
	for _, u := range f.units {
		b.ReportMetric(f.sums[u]/float64(b.N), u)
	}
}

// outcome is where the items of one run went, summed from its Report.
type outcome struct {
	given        int64 // items the sources held
	deadLettered int64 // set aside by a stage's policy
	failed       int64 // failed: a fatal error, or in flight when the run stopped
	notStarted   int64 // queued, unsent or skipped when the run stopped
}

// settle sums rep, which must be the report of a linear pipeline (one source, then each
// stage feeding the next), and checks the library's own accounting: every stage's In is
// Succeeded + DeadLettered + Failed + NotStarted, and every stage's In is what the stage
// before it sent (its Out). A mismatch is an item the library lost or invented, so it
// is returned as an error quoting the report.
func settle(rep pipeline.Report) (outcome, error) {
	var o outcome
	var problems []string
	for i, s := range rep.Stages {
		switch s.Kind {
		case pipeline.KindSource:
			o.given += s.In
			o.notStarted += s.NotStarted
			if s.In != s.Out+s.NotStarted {
				problems = append(problems, fmt.Sprintf("source %s: in %d != out %d + not started %d", s.Name, s.In, s.Out, s.NotStarted))
			}
		default:
			o.deadLettered += s.DeadLettered
			o.failed += s.Failed
			o.notStarted += s.NotStarted
			if sum := s.Succeeded + s.DeadLettered + s.Failed + s.NotStarted; s.In != sum {
				problems = append(problems, fmt.Sprintf("stage %s: in %d != succeeded + dead-lettered + failed + not started = %d", s.Name, s.In, sum))
			}
		}
		if i > 0 {
			if up := rep.Stages[i-1]; up.Out != s.In {
				problems = append(problems, fmt.Sprintf("%s sent %d items, %s received %d", up.Name, up.Out, s.Name, s.In))
			}
		}
	}
	if len(problems) > 0 {
		return o, fmt.Errorf("inconsistent report (%s):\n%v", strings.Join(problems, "; "), rep)
	}
	return o, nil
}

// heapLive is the metric the heap sampler reads: the bytes of heap objects that the
// last garbage collection found live.
const heapLive = "/gc/heap/live:bytes"

// heapBaseline collects garbage and returns the live heap left: the baseline that a
// run's peak is measured against.
func heapBaseline() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: heapLive}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// sampleHeap starts a goroutine that, every 5 ms, collects garbage and reads the live
// heap; the returned stop function ends it and returns the largest value seen. Live
// bytes, not allocated ones, are what a bound on queues bounds: without the collections
// a small heap holds up to Go's 4 MiB minimum heap goal of garbage, whatever the queues
// hold (the seeds measured Python's traced memory, which frees at once). The
// collections cost the run well under 1 % of its time.
func sampleHeap() (stop func() uint64) {
	quit, done := make(chan struct{}), make(chan struct{})
	var peak uint64
	go func() {
		defer close(done)
		s := []metrics.Sample{{Name: heapLive}}
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-quit:
				return
			}
			runtime.GC()
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
		}
	}()
	return func() uint64 {
		close(quit)
		<-done
		return peak
	}
}

// watchHeap runs run with the heap watched (heapBaseline, then sampleHeap), and returns
// its peak heap over the baseline in KiB, and run's error.
func watchHeap(run func() error) (float64, error) {
	base := heapBaseline()
	stop := sampleHeap()
	err := run()
	return kib(stop(), base), err
}

// kib returns the growth from base to peak in KiB (0 when the heap shrank).
func kib(peak, base uint64) float64 {
	if peak < base {
		return 0
	}
	return float64(peak-base) / 1024
}

// checkAll fails the benchmark unless a run that should deliver every one of n items
// did: no error, a consistent report, n items counted by the sink into done, none
// dead-lettered, failed or not started. It resets done for the next run.
func checkAll(b *testing.B, p *pipeline.Pipeline, err error, done *atomic.Int64, n int) pipeline.Report {
	b.Helper()
	rep := p.Report()
	o, serr := settle(rep)
	switch {
	case err != nil:
		b.Fatalf("Run = %v\n%v", err, rep)
	case serr != nil:
		b.Fatal(serr)
	case done.Load() != int64(n) || o.given != int64(n) || o.deadLettered+o.failed+o.notStarted != 0:
		b.Fatalf("%d of %d items reached the sink\n%v", done.Load(), n, rep)
	}
	done.Store(0)
	return rep
}

// send sends v on ch, or returns ctx's error once ctx is done: the select every
// hand-written stage makes for each item.
func send[T any](ctx context.Context, ch chan<- T, v T) error {
	select {
	case ch <- v:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cpuTime returns the CPU time (user and system) the process has spent so far.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
