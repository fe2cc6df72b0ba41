package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopipeline/pipeline"
)

// ackFate is what a source item of FuzzAck must settle as when the run succeeds.
type ackFate struct {
	outcome pipeline.Outcome
	stage   string // the stage that set it aside or handed it back
}

// FuzzAck builds a random topology behind an acknowledged source (FromAcked) from the
// fuzz bytes: plain, ordered, keyed and flat stages that dead-letter some items, a
// stage that hands some back (WithHandBack), Filters, Maps that may panic, Tees whose
// first branch ends in a sink at once, Batch+Flatten, a small WithMaxPending bound, and
// a sink that may cancel the run. Every item offered to emit must be settled exactly
// once, before Run returns; when the run succeeds, with the outcome the bytes say
// (committed, dead-lettered with its stage, handed back with its delay); when it fails
// or is canceled, with that outcome or NotProcessed.
func FuzzAck(f *testing.F) {
	f.Add([]byte{20, 0, 1, 0, 3, 5, 6, 7, 2, 1})
	f.Add([]byte{40, 1, 3, 5, 4, 1, 6, 2, 0, 3, 9, 1, 7})
	f.Add([]byte{60, 2, 7, 6, 6, 3, 3, 0, 1, 8, 2, 9, 4, 2})
	f.Add([]byte{33, 3, 2, 4, 0, 6, 5, 1, 3, 2, 8, 1, 5, 0, 7, 3})
	f.Add([]byte{12, 4, 5, 2, 2, 4, 4, 6, 6, 8, 0, 1, 1, 7, 7})
	f.Add([]byte{50, 6, 1, 5, 6, 7, 3, 1, 2, 4, 5, 6, 0})
	f.Add([]byte{64, 9, 6, 2, 6, 4, 8, 3, 5, 0, 6, 1})
	f.Add([]byte{30, 1, 8, 5, 1, 7, 6, 0, 6, 3, 4, 3})
	fuzzShape(f, runAckTopology)
}

func runAckTopology(t *testing.T, data []byte) {
	t.Helper()
	b := &topology{data: data}
	n := 1 + b.next()%64
	flags := b.next()
	cancelAt := -1
	if flags&1 != 0 {
		cancelAt = 1 + b.next()%n
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)

	p := pipeline.New(pipeline.WithBuffer(b.next() % 4))
	var aopts []pipeline.AckOption
	bound := int64(-1)
	if flags&2 != 0 {
		bound = int64(1 + b.next()%6)
		aopts = append(aopts, pipeline.WithMaxPending(int(bound)))
	}
	fates := make([]ackFate, n) // the zero fate: committed (or filtered out)
	for i := range fates {
		fates[i].outcome = pipeline.Committed
	}
	settled := make([]atomic.Int32, n)
	got := make([]pipeline.Settlement, n)
	var (
		offered  atomic.Int64 // items offered to emit
		unsolved atomic.Int64 // offered, not settled
		maxOpen  atomic.Int64
	)
	s := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		for i := range n {
			offered.Add(1)
			if open := unsolved.Add(1); open > maxOpen.Load() {
				maxOpen.Store(open) // only the source raises it: no lost update
			}
			err := emit(i, func(st pipeline.Settlement) {
				got[i] = st
				settled[i].Add(1)
				unsolved.Add(-1)
			})
			if err != nil {
				return err
			}
		}
		return nil
	}, aopts...)

	var mu sync.Mutex
	sinkCalls := 0
	sinks := 0
	endIn := func(in *pipeline.Stream[int]) {
		sinks++
		pipeline.To(in, pipeline.NewSink(fmt.Sprintf("sink%d", sinks), 1+b.next()%2, func(context.Context, int) error {
			mu.Lock()
			defer mu.Unlock()
			sinkCalls++
			if cancelAt > 0 && sinkCalls == cancelAt {
				cancel(errOrderStop)
			}
			return nil
		}))
	}
	// alive reports whether item i still travels the main chain at this point; fates
	// say what happened to those that do not.
	alive := make([]bool, n)
	for i := range alive {
		alive[i] = true
	}
	for stageNo := 1; stageNo <= 1+b.next()%6; stageNo++ {
		op, arg := b.next()%9, b.next()
		name := fmt.Sprintf("op%d", stageNo)
		hit := func(i int) bool { return arg != 0 && i%(2+arg%5) == 0 }
		setAside := func(o pipeline.Outcome) {
			for i := range n {
				if alive[i] && hit(i) {
					alive[i], fates[i] = false, ackFate{o, name}
				}
			}
		}
		fn := func(_ context.Context, i int) (int, error) {
			if hit(i) {
				return 0, pipeline.Permanent(errBoom)
			}
			return i, nil
		}
		opts := []pipeline.StageOption{pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]), pipeline.WithBuffer(arg % 3)}
		switch op {
		case 0:
			setAside(pipeline.DeadLettered)
			s = pipeline.Then(s, pipeline.NewStage(name, 1+arg%3, fn, opts...))
		case 1:
			setAside(pipeline.DeadLettered)
			s = pipeline.Then(s, pipeline.NewStage(name, 1+arg%3, fn, append(opts, pipeline.WithOrdered(1+arg%4))...))
		case 2:
			setAside(pipeline.DeadLettered)
			s = pipeline.Then(s, pipeline.NewStage(name, 1+arg%4, fn, append(opts, pipeline.WithKey(func(i int) int { return i % 3 }))...))
		case 3:
			keep := func(i int) bool { return i%(2+arg%4) != 1 }
			for i := range n {
				if alive[i] && !keep(i) {
					alive[i] = false // filtered: committed
				}
			}
			s = pipeline.Filter(s, keep)
		case 4:
			s = mapPanicking(s, arg, n)
		case 5:
			br := pipeline.Tee(s, 2)
			endIn(br[0])
			s = br[1]
		case 6:
			s = pipeline.Flatten(pipeline.Batch(s, 1+arg%4, pipeline.WithName(name)))
		case 7:
			outs := arg % 3 // 0: drops every item, 1: one-to-one, 2: a flat-map
			if outs == 0 {
				for i := range n {
					if alive[i] && !hit(i) {
						alive[i] = false
					}
				}
			}
			setAside(pipeline.DeadLettered)
			s = flatEmitting(s, name, 1+arg%2, outs, hit, opts...)
		case 8:
			setAside(pipeline.HandedBack)
			// No wait between attempts (a mutex-blocked goroutine, as an ordered queue's
			// producer can be, would stop the bubble's clock), 1ms after the last.
			attempts := 1 + arg%2
			backoff := func(a int) time.Duration {
				if a < attempts {
					return 0
				}
				return time.Millisecond
			}
			s = pipeline.Then(s, pipeline.NewStage(name, 1+arg%3, func(_ context.Context, i int) (int, error) {
				if hit(i) {
					return 0, pipeline.Transient(errBoom)
				}
				return i, nil
			}, pipeline.WithHandBack(), pipeline.WithRetry(attempts, backoff), pipeline.WithBuffer(arg%3)))
		}
	}
	endIn(s)

	err := p.Run(ctx)
	rep := p.Report()
	checkAccounting(t, rep)
	k := int(offered.Load())
	if err == nil && k != n {
		t.Fatalf("the run succeeded, yet the source offered %d of %d items\n%v", k, n, rep)
	}
	if err != nil {
		var pe *pipeline.PanicError
		if !errors.Is(err, errOrderStop) && !errors.As(err, &pe) {
			t.Fatalf("unexpected error %v\n%v", err, rep)
		}
	}
	if bound > 0 && maxOpen.Load() > bound+1 { // +1: the item being offered
		t.Fatalf("%d items unsettled at once, bound %d", maxOpen.Load(), bound)
	}
	for i := range n {
		c := settled[i].Load()
		switch {
		case i >= k && c != 0:
			t.Fatalf("item %d was never offered, yet settled %d times", i, c)
		case i >= k:
			continue
		case c != 1:
			t.Fatalf("item %d settled %d times (run error %v)\n%v", i, c, err, rep)
		}
		st, want := got[i], fates[i]
		if err != nil && st.Outcome == pipeline.NotProcessed {
			continue
		}
		if st.Outcome != want.outcome {
			t.Fatalf("item %d settled as %v, want %v (run error %v)\n%v", i, st.Outcome, want.outcome, err, rep)
		}
		switch want.outcome {
		case pipeline.DeadLettered:
			if st.DeadLetter.Stage != want.stage || st.DeadLetter.Class != pipeline.ClassItem || st.DeadLetter.LastError != errBoom.Error() {
				t.Fatalf("item %d: dead letter %+v, want one of stage %s", i, st.DeadLetter, want.stage)
			}
		case pipeline.HandedBack:
			if st.DeadLetter.Stage != want.stage || st.Delay != time.Millisecond || st.DeadLetter.Class != pipeline.ClassTransient {
				t.Fatalf("item %d: handed back as %+v, want stage %s and a delay of 1ms", i, st, want.stage)
			}
		}
	}
}
