package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gopipeline/pipeline"
)

// broker is a toy message broker for the examples: it records how each message was
// settled, as a real broker's acknowledgements would.
type broker struct {
	mu    sync.Mutex
	fates []string
}

func (b *broker) settle(msg string) func(pipeline.Settlement) {
	return func(s pipeline.Settlement) {
		b.mu.Lock()
		defer b.mu.Unlock()
		fate := msg + ": " + s.Outcome.String()
		if s.Outcome == pipeline.DeadLettered || s.Outcome == pipeline.HandedBack {
			fate += fmt.Sprintf(" by %s (%s)", s.DeadLetter.Stage, s.DeadLetter.LastError)
		}
		if s.Delay > 0 {
			fate += fmt.Sprintf(", again in %v", s.Delay)
		}
		b.fates = append(b.fates, fate)
	}
}

func (b *broker) print() {
	slices.Sort(b.fates)
	fmt.Println(strings.Join(b.fates, "\n"))
}

// This example shows an acknowledged source: each message is settled once, when its
// fate is known — committed after the sink returned nil for it, dead-lettered after the
// destination took it — never when it is merely handed on.
func ExampleFromAcked() {
	b := &broker{}
	p := pipeline.New()
	msgs := pipeline.FromAcked(p, func(_ context.Context, emit func(string, func(pipeline.Settlement)) error) error {
		for _, m := range []string{"a", "bad", "c"} {
			if err := emit(m, b.settle(m)); err != nil {
				return err
			}
		}
		return nil
	})
	checked := pipeline.Then(msgs, pipeline.NewStage("check", 2, func(_ context.Context, m string) (string, error) {
		if m == "bad" {
			return "", pipeline.Permanent(errors.New("malformed"))
		}
		return m, nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[string])))
	pipeline.To(checked, pipeline.NewSink("store", 2, func(context.Context, string) error { return nil }))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	b.print()
	// Output:
	// a: committed
	// bad: dead-lettered by check (malformed)
	// c: committed
}

// This example shows an acknowledged source that receives its messages in batches, as
// a broker's consumer fetches them: each fetch is handed over in one call of emit, and
// each message is still settled once, on its own.
func ExampleFromAckedBatches() {
	b := &broker{}
	fetches := [][]string{{"a", "b", "bad"}, {"d"}}
	p := pipeline.New()
	msgs := pipeline.FromAckedBatches(p, func(_ context.Context, emit func([]string, []func(pipeline.Settlement)) error) error {
		for _, fetch := range fetches {
			settles := make([]func(pipeline.Settlement), len(fetch))
			for i, m := range fetch {
				settles[i] = b.settle(m)
			}
			if err := emit(fetch, settles); err != nil {
				return err
			}
		}
		return nil
	})
	checked := pipeline.Then(msgs, pipeline.NewStage("check", 2, func(_ context.Context, m string) (string, error) {
		if m == "bad" {
			return "", pipeline.Permanent(errors.New("malformed"))
		}
		return m, nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[string])))
	pipeline.To(checked, pipeline.NewSink("store", 2, func(context.Context, string) error { return nil }))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	b.print()
	// Output:
	// a: committed
	// b: committed
	// bad: dead-lettered by check (malformed)
	// d: committed
}

// This example shows the settlement of items still in flight when a run stops: each
// is told NotProcessed before Run returns, so a broker can hand it to another consumer.
func ExampleOutcome() {
	b := &broker{}
	p := pipeline.New()
	ctx, cancel := context.WithCancel(context.Background())
	msgs := pipeline.FromAcked(p, func(ctx context.Context, emit func(string, func(pipeline.Settlement)) error) error {
		for _, m := range []string{"first", "second"} {
			if err := emit(m, b.settle(m)); err != nil {
				return err
			}
		}
		<-ctx.Done() // a broker would wait for more messages
		return nil
	})
	pipeline.To(msgs, pipeline.NewSink("store", 1, func(ctx context.Context, m string) error {
		if m == "second" {
			cancel() // the process is asked to stop while "second" is in the sink
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}))
	err := p.Run(ctx)
	fmt.Println(errors.Is(err, context.Canceled))
	b.print()
	// Output:
	// true
	// first: committed
	// second: not processed
}

// This example shows WithHandBack: a transient error gives the item back to its
// source with the stage's backoff as the delay, instead of retrying it in the worker.
func ExampleWithHandBack() {
	b := &broker{}
	p := pipeline.New()
	msgs := pipeline.FromAcked(p, func(_ context.Context, emit func(string, func(pipeline.Settlement)) error) error {
		for _, m := range []string{"ok", "busy"} {
			if err := emit(m, b.settle(m)); err != nil {
				return err
			}
		}
		return nil
	})
	pipeline.To(msgs, pipeline.NewSink("call", 1, func(_ context.Context, m string) error {
		if m == "busy" {
			return pipeline.Transient(errors.New("503"))
		}
		return nil
	}, pipeline.WithHandBack(), pipeline.WithRetry(1, pipeline.ConstantBackoff(time.Second))))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	b.print()
	fmt.Println("set aside:", p.Report().Stages[1].DeadLettered)
	// Output:
	// busy: handed back by call (503), again in 1s
	// ok: committed
	// set aside: 1
}

// This example shows WithMaxPending: the source waits while two of its items are
// unsettled, so a batch downstream flushes what it holds rather than wait for more.
func ExampleWithMaxPending() {
	b := &broker{}
	p := pipeline.New()
	msgs := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		for i := range 5 {
			if err := emit(i, b.settle(fmt.Sprint(i))); err != nil {
				return err
			}
		}
		return nil
	}, pipeline.WithMaxPending(2))
	largest := 0
	pipeline.ToBatches(msgs, 100, pipeline.NewSink("store", 1, func(_ context.Context, batch []int) error {
		largest = max(largest, len(batch))
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	fmt.Println(len(b.fates), "settled, batches of at most", largest)
	// Output:
	// 5 settled, batches of at most 2
}

// This example shows the text of each outcome.
func ExampleOutcome_String() {
	for _, o := range []pipeline.Outcome{pipeline.NotProcessed, pipeline.Committed, pipeline.DeadLettered, pipeline.HandedBack} {
		fmt.Println(o)
	}
	// Output:
	// not processed
	// committed
	// dead-lettered
	// handed back
}

// This example shows what a Settlement of a dead-lettered item carries: the record of
// the derived item set aside, without the item, which the source still has.
func ExampleSettlement() {
	p := pipeline.New()
	var got pipeline.Settlement
	msgs := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		return emit(7, func(s pipeline.Settlement) { got = s })
	}, pipeline.WithName("queue"))
	pipeline.To(msgs, pipeline.NewSink("store", 1, func(context.Context, int) error {
		return pipeline.Permanent(errors.New("rejected"))
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int])))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	fmt.Println(got.Outcome, got.DeadLetter.Stage, got.DeadLetter.Class, got.DeadLetter.Attempts, got.DeadLetter.LastError)
	// Output:
	// dead-lettered store item 1 rejected
}

// This example shows an acknowledged source that reports its backlog per partition
// with WithLag: here the messages of each partition not committed yet. A Snapshot
// taken while the first message is in the sink shows every message behind; the final
// report, none.
func ExampleWithLag() {
	var mu sync.Mutex
	partitions := []string{"orders/0", "orders/1"}
	behind := map[string]int64{"orders/0": 2, "orders/1": 1} // not committed yet
	lag := func() []pipeline.PartitionLag {
		mu.Lock()
		defer mu.Unlock()
		out := make([]pipeline.PartitionLag, 0, len(partitions))
		for _, part := range partitions {
			out = append(out, pipeline.PartitionLag{Partition: part, Lag: behind[part]})
		}
		return out
	}
	p := pipeline.New()
	msgs := pipeline.FromAcked(p, func(_ context.Context, emit func(string, func(pipeline.Settlement)) error) error {
		for _, part := range []string{"orders/0", "orders/1", "orders/0"} {
			err := emit(part, func(s pipeline.Settlement) {
				if s.Outcome == pipeline.Committed {
					mu.Lock()
					behind[part]--
					mu.Unlock()
				}
			})
			if err != nil {
				return err
			}
		}
		return nil
	}, pipeline.WithName("orders"), pipeline.WithLag(lag))
	first := true
	pipeline.To(msgs, pipeline.NewSink("store", 1, func(context.Context, string) error {
		if first { // one worker: no other call runs meanwhile
			first = false
			src, _ := p.Snapshot().Stage("orders")
			fmt.Println("while running:", src.Lag, "total", src.TotalLag())
		}
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	for line := range strings.Lines(p.Report().String()) {
		if strings.HasPrefix(line, "source ") {
			fmt.Print(line)
		}
	}
	// Output:
	// while running: [{orders/0 2} {orders/1 1}] total 3
	// source orders: lag 0 on 2 partitions: orders/0 0, orders/1 0
}
