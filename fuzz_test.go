package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gopipeline/pipeline"
)

// Outcomes of an item in FuzzNothingLost, chosen by the low bits of its byte; bit 3
// chooses the stage (s1 or s2) where a failure happens.
const (
	outOK = iota
	outPermanent
	outFatal
	outPanic
	outFiltered
	numOutcomes
)

// FuzzNothingLost runs source → s1 → Filter → s2 → sink with fuzzed workers and
// queue sizes, where each item succeeds, is dead-lettered, fails the run, panics or is
// filtered out, as its fuzz byte says. Whatever happens, every stage's identity holds
// (In = Succeeded + DeadLettered + Failed + NotStarted), each stage receives what the
// one before sent, and every source item has exactly one outcome: source items =
// delivered + dead-lettered + failed + not started + filtered, over the chain.
func FuzzNothingLost(f *testing.F) {
	f.Add(uint8(1), uint8(1), uint8(0), uint8(0), []byte{0, 0, 0})
	f.Add(uint8(4), uint8(2), uint8(1), uint8(3), []byte{0, 1, 4, 0, 9, 12, 0, 0})
	f.Add(uint8(2), uint8(3), uint8(8), uint8(0), []byte{0, 0, 2, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(3), uint8(1), uint8(0), uint8(2), []byte{0, 0, 0, 0, 11, 0, 0, 0})
	f.Add(uint8(1), uint8(4), uint8(2), uint8(2), []byte{4, 4, 1, 9, 0, 0, 3})
	f.Add(uint8(4), uint8(4), uint8(64), uint8(64), []byte("\x00\x01\x04\x00\x09\x0c\x00\x01\x04\x00\x09\x0c\x00\x01\x04\x00\x09\x0c"))
	f.Fuzz(func(t *testing.T, w1, w2, b1, b2 uint8, data []byte) {
		if len(data) > 64 {
			data = data[:64]
		}
		outcome := func(i int) (int, string) {
			where := "s1"
			if data[i]&8 != 0 {
				where = "s2"
			}
			return int(data[i]&7) % numOutcomes, where
		}
		step := func(name string) func(context.Context, int) (int, error) {
			return func(_ context.Context, i int) (int, error) {
				o, where := outcome(i)
				if where != name {
					return i, nil
				}
				switch o {
				case outPermanent:
					return 0, pipeline.Permanent(fmt.Errorf("item %d: %w", i, errBoom))
				case outFatal:
					return 0, fmt.Errorf("item %d: %w", i, errBoom)
				case outPanic:
					panic(fmt.Errorf("item %d: %w", i, errBoom))
				}
				return i, nil
			}
		}
		var want struct{ ok, dead, filtered int64 }
		stops := false
		for i := range data {
			switch o, _ := outcome(i); o {
			case outOK:
				want.ok++
			case outPermanent:
				want.dead++
			case outFiltered:
				want.filtered++
			default:
				stops = true
			}
		}

		p := pipeline.New()
		s := pipeline.Then(pipeline.FromSlice(p, ints(len(data))),
			pipeline.NewStage("s1", 1+int(w1)%4, step("s1"), pipeline.WithBuffer(int(b1)%9), discardDead[int]()))
		s = pipeline.Filter(s, func(i int) bool { o, _ := outcome(i); return o != outFiltered })
		s = pipeline.Then(s, pipeline.NewStage("s2", 1+int(w2)%4, step("s2"), pipeline.WithBuffer(int(b2)%9), discardDead[int]()))
		var c collector[int]
		pipeline.To(s, pipeline.NewSink("sink", 2, c.add))

		err := p.Run(t.Context())

		rep := p.Report()
		checkReport(t, rep)
		if t.Failed() {
			t.FailNow()
		}
		sink := row(t, rep, "sink")
		if int64(len(c.got())) != sink.Succeeded {
			t.Fatalf("the sink got %d items, the report says %d", len(c.got()), sink.Succeeded)
		}
		if !stops {
			if err != nil {
				t.Fatalf("no item fails the run, yet Run returned %v", err)
			}
			if sink.Succeeded != want.ok || rep.DeadLettered() != want.dead {
				t.Fatalf("delivered %d, dead-lettered %d; want %d, %d\n%v", sink.Succeeded, rep.DeadLettered(), want.ok, want.dead, rep)
			}
			return
		}
		if !errors.Is(err, errBoom) {
			t.Fatalf("an item fails the run, yet Run returned %v", err)
		}
		if _, ok := errors.AsType[*pipeline.StageError](err); !ok {
			t.Fatalf("want a *StageError, got %T", err)
		}
	})
}
