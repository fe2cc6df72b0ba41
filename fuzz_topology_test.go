package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gopipeline/pipeline"
)

// topology builds a random pipeline from fuzz bytes: a source (plain or checkpointed)
// then up to six operators, each one of: a plain, ordered, keyed (WithKey or
// WithPartition) or flat stage with a dead-letter destination (the first three maybe
// with a timeout and retries), a Filter, a Map that may panic, a Tee whose first
// branch ends at once, or a Batch (maybe with a byte limit) undone by Flatten. The
// chain ends too; each end is a sink stage or a ForEach, and may cancel the run after
// some items. The shapes come from the defects an outside soak
// found: Tee with inline panics, batches with byte limits under cancellation,
// checkpoints with batches, filters and dead letters, keyed and ordered bounds read
// from Snapshots taken while the run goes on.
type topology struct {
	data []byte
	i    int
}

func (b *topology) next() int {
	if b.i >= len(b.data) {
		return 0
	}
	v := b.data[b.i]
	b.i++
	return int(v)
}

// bounds are what a Snapshot may never exceed, per row.
type bounds struct {
	window map[string]int64 // ordered stages: their window
}

func FuzzTopology(f *testing.F) {
	f.Add([]byte{20, 1, 0, 3, 5, 6, 7, 2, 1})
	f.Add([]byte{40, 3, 5, 4, 1, 6, 2, 0, 3, 9, 1, 7})
	f.Add([]byte{60, 7, 6, 6, 3, 3, 0, 1, 4, 2, 9, 4, 2})
	f.Add([]byte{33, 2, 4, 0, 6, 5, 1, 3, 2, 8, 1, 5, 0, 7, 3})
	f.Add([]byte{12, 5, 2, 2, 4, 4, 6, 6, 0, 0, 1, 1, 7, 7})
	f.Add([]byte{50, 6, 1, 5, 6, 7, 3, 1, 2, 4, 5, 6, 0})
	f.Add([]byte{30, 0, 1, 2, 0, 97, 1, 98, 2, 99, 1})            // timeouts and retries: plain, ordered, keyed
	f.Add([]byte{40, 3, 7, 2, 2, 0, 224, 6, 1, 1, 97, 0, 226, 1}) // a batch, then ordered and plain stages, both timed and retried; checkpointed, canceled
	f.Add([]byte{30, 1, 3, 2, 1, 1, 5, 0, 129, 1, 5, 128})        // ForEach ends: a Tee's branch and an ordered stage's output; checkpointed
	fuzzShape(f, runTopology)
}

// fuzzShape fuzzes run, which builds a pipeline from the bytes of data and checks its
// run, in a synctest bubble; data beyond its first 40 bytes is ignored (it would only
// make the corpus grow).
func fuzzShape(f *testing.F, run func(t *testing.T, data []byte)) {
	f.Helper()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 40 {
			data = data[:40]
		}
		synctest.Test(t, func(t *testing.T) { run(t, data) })
	})
}

// flatEmitting is the fuzzed topologies' flat stage: it sets the items fails picks
// aside (a permanent error), and emits every other one outs times.
func flatEmitting(s *pipeline.Stream[int], name string, workers, outs int, fails func(int) bool, opts ...pipeline.StageOption) *pipeline.Stream[int] {
	return pipeline.Then(s, pipeline.NewFlatStage(name, workers, func(_ context.Context, i int, emit func(int)) error {
		if fails(i) {
			return pipeline.Permanent(errBoom)
		}
		for range outs {
			emit(i)
		}
		return nil
	}, opts...))
}

// mapPanicking is the fuzzed topologies' Map: it panics at item arg%n when arg%3 is 0,
// else passes every item.
func mapPanicking(s *pipeline.Stream[int], arg, n int) *pipeline.Stream[int] {
	panicAt := -1
	if arg%3 == 0 {
		panicAt = arg % n
	}
	return pipeline.Map(s, func(i int) int {
		if i == panicAt {
			panic("map")
		}
		return i
	})
}

func runTopology(t *testing.T, data []byte) {
	t.Helper()
	b := &topology{data: data}
	n := 1 + b.next()%64
	flags := b.next()
	checkpointed, cancelAt := flags&1 != 0, -1
	if flags&2 != 0 {
		cancelAt = 1 + b.next()%n
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)

	p := pipeline.New(pipeline.WithBuffer(b.next() % 4))
	store := &memStore{}
	var s *pipeline.Stream[int]
	if checkpointed {
		every := 1 + b.next()%4
		s = pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(every), pipeline.WithMaxRedo(every+1+b.next()%8))
	} else {
		s = pipeline.FromSlice(p, ints(n))
	}
	bd := bounds{window: map[string]int64{}}
	crossesFlatten := map[string]bool{} // rows whose input passed a Flatten: In counts items, the feeder's Out batches
	var (
		mu        sync.Mutex
		sinkCalls int
		snapErr   error
		lastIn    = map[string]int64{}
	)
	pendingFlatten := false
	// observe takes a Snapshot inside a sink call: In never goes down, queues and
	// windows stay within their bounds.
	observe := func() {
		mu.Lock() // before the Snapshot: two sink workers' snapshots are compared in order
		defer mu.Unlock()
		rep := p.Snapshot()
		sinkCalls++
		if cancelAt > 0 && sinkCalls == cancelAt {
			cancel(errOrderStop)
		}
		for _, r := range rep.Stages {
			switch {
			case r.In < lastIn[r.Name]:
				snapErr = fmt.Errorf("row %q: In went down from %d to %d", r.Name, lastIn[r.Name], r.In)
			case r.Kind != pipeline.KindSource && r.Kind != pipeline.KindFilter && r.QueueLen > r.QueueCap:
				snapErr = fmt.Errorf("row %q: %d queued, capacity %d", r.Name, r.QueueLen, r.QueueCap)
			case bd.window[r.Name] > 0 && r.Window > bd.window[r.Name]:
				snapErr = fmt.Errorf("row %q: window holds %d, size %d", r.Name, r.Window, bd.window[r.Name])
			}
			lastIn[r.Name] = r.In
		}
	}
	sinks := 0
	endIn := func(in *pipeline.Stream[int]) {
		sinks++
		name := fmt.Sprintf("sink%d", sinks)
		if pendingFlatten {
			crossesFlatten[name] = true
			pendingFlatten = false
		}
		v := b.next()
		if v&0x80 != 0 { // an inline end: fn runs in the goroutines that feed it
			pipeline.ForEach(in, func(int) error {
				observe()
				return nil
			}, pipeline.WithName(name))
			return
		}
		pipeline.To(in, pipeline.NewSink(name, 1+v%2, func(context.Context, int) error {
			observe()
			return nil
		}))
	}
	stageNo := 0
	for range 1 + b.next()%6 {
		op, arg := b.next()%8, b.next()
		stageNo++
		name := fmt.Sprintf("op%d", stageNo)
		dead := func(i int) bool { return arg != 0 && i%(2+arg%5) == 0 }
		// A stage's attempts may be timed (an item waits for its context: a timeout,
		// dead-lettered) and retried (an item fails once, transiently).
		timed, retried := arg&32 != 0, arg&64 != 0
		var failedOnce sync.Map // items whose first attempt failed
		fn := func(ctx context.Context, i int) (int, error) {
			if dead(i) {
				return 0, pipeline.Permanent(errBoom)
			}
			if timed && i%7 == 3 {
				<-ctx.Done()
				return 0, ctx.Err()
			}
			if retried && i%3 == 1 {
				if _, again := failedOnce.LoadOrStore(i, true); !again {
					return 0, pipeline.Transient(errBoom)
				}
			}
			return i, nil
		}
		opts := []pipeline.StageOption{pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]), pipeline.WithBuffer(arg % 3)}
		timing := slices.Clip(opts) // the stages of fn (not the flat one): fn meets the timeout and the retries
		if timed {
			timing = append(timing, pipeline.WithTimeout(time.Millisecond))
		}
		if retried {
			timing = append(timing, pipeline.WithRetry(2, pipeline.ConstantBackoff(time.Microsecond)))
		}
		mark := func() {
			if pendingFlatten {
				crossesFlatten[name] = true
				pendingFlatten = false
			}
		}
		switch op {
		case 0:
			mark()
			s = pipeline.Then(s, pipeline.NewStage(name, 1+arg%3, fn, timing...))
		case 1:
			mark()
			window := 1 + arg%4
			bd.window[name] = int64(window)
			s = pipeline.Then(s, pipeline.NewStage(name, 1+arg%3, fn, append(timing, pipeline.WithOrdered(window))...))
		case 2:
			mark()
			route := pipeline.WithKey(func(i int) int { return i % 3 })
			if arg/4%2 == 1 {
				route = pipeline.WithPartition(func(i int) int { return i % 3 })
			}
			s = pipeline.Then(s, pipeline.NewStage(name, 1+arg%4, fn, append(timing, route)...))
		case 3:
			s = pipeline.Filter(s, func(i int) bool { return i%(2+arg%4) != 1 })
		case 4:
			s = mapPanicking(s, arg, n)
		case 5:
			br := pipeline.Tee(s, 2)
			crossing := pendingFlatten // both branches' first rows
			endIn(br[0])
			s, pendingFlatten = br[1], crossing
		case 6:
			mark()
			bopts := []pipeline.BatchOption{pipeline.WithName(name)}
			if arg%2 == 0 {
				bopts = append(bopts, pipeline.WithMaxBytes(1+arg%3, func(int) int { return 1 }))
			}
			s = pipeline.Flatten(pipeline.Batch(s, 1+arg%4, bopts...))
			pendingFlatten = true
		case 7:
			mark()
			outs := arg % 3 // 0: a filter, 1: one-to-one, 2: a flat-map
			s = flatEmitting(s, name, 1+arg%2, outs, dead, opts...)
			if outs != 1 { // In and Out differ in count: no edge check after it
				pendingFlatten = true
			}
		}
	}
	endIn(s)

	err := p.Run(ctx)
	rep := p.Report()
	checkAccounting(t, rep)
	if snapErr != nil {
		t.Fatalf("%v\n%v", snapErr, rep)
	}
	// Every edge carries what its feeder sent, unless a Flatten or a flat stage changed
	// the unit on the way.
	byName := map[string]pipeline.StageReport{}
	for _, r := range rep.Stages {
		byName[r.Name] = r
	}
	fed := map[string]int64{}
	for i, r := range rep.Stages {
		for _, nx := range r.Next {
			fed[nx] += r.Out
			if !slices.ContainsFunc(rep.Stages[i+1:], func(d pipeline.StageReport) bool { return d.Name == nx }) {
				t.Fatalf("row %q feeds %q, which is not after it in the report\n%v", r.Name, nx, rep)
			}
		}
	}
	for _, r := range rep.Stages {
		if (r.Kind == pipeline.KindStage || r.Kind == pipeline.KindSink || r.Kind == pipeline.KindBatch) && !crossesFlatten[r.Name] && r.In != fed[r.Name] {
			t.Fatalf("row %q: In %d, its feeders sent %d\n%v", r.Name, r.In, fed[r.Name], rep)
		}
	}
	switch {
	case err == nil && cancelAt > 0:
		// The run may have ended before the cancel: nothing to check.
	case err == nil && checkpointed:
		if store.pos != int64(n) {
			t.Fatalf("the run succeeded, yet the checkpoint is %d of %d\n%v", store.pos, n, rep)
		}
	case err != nil:
		var pe *pipeline.PanicError
		if !errors.Is(err, errOrderStop) && !errors.As(err, &pe) {
			t.Fatalf("unexpected error %v\n%v", err, rep)
		}
	}
	if checkpointed && store.pos > int64(n) {
		t.Fatalf("checkpoint %d past the input's %d items", store.pos, n)
	}
}
