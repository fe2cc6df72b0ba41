package bench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/pause"
)

// S4: a slow consumer (seed 004). The source makes 1,000 records of 10,000 bytes as
// fast as it can; one consumer takes 2 ms each. The buffer in between decides how many
// records wait in memory; the consumer alone decides the run's duration.

const (
	s4Records    = 1_000
	s4RecordSize = 10_000
	s4Latency    = 2 * time.Millisecond
)

type record struct {
	ID   int
	Data []byte
}

func BenchmarkS4SlowConsumer(b *testing.B) {
	for _, c := range []struct {
		name string
		buf  int
	}{
		{"50", 50},
		{"unbounded", s4Records},
	} {
		b.Run("buf="+c.name, func(b *testing.B) {
			var f figures
			for b.Loop() {
				var consumed atomic.Int64
				p := pipeline.New(pipeline.WithBuffer(c.buf))
				records := pipeline.Generate(p, func(ctx context.Context, emit func(record) error) error {
					for i := range s4Records {
						data := make([]byte, s4RecordSize)
						data[0], data[len(data)-1] = byte(i), byte(i)
						if err := emit(record{ID: i, Data: data}); err != nil {
							return err
						}
					}
					return nil
				})
				pipeline.To(records, pipeline.NewSink("consume", 1, func(ctx context.Context, r record) error {
					if err := pause.For(ctx, s4Latency); err != nil {
						return err
					}
					consumed.Add(1)
					return nil
				}))

				// Two runs of the same pipeline: one timed, one watched for memory (the
				// watcher's garbage collections would slow the timed one).
				start := time.Now()
				err := p.Run(b.Context())
				wall := time.Since(start)
				b.StopTimer()
				check := func(err error) pipeline.Report { return checkAll(b, p, err, &consumed, s4Records) }
				rep := check(err)
				heapKiB, err := watchHeap(func() error { return p.Run(b.Context()) })
				check(err)
				b.StartTimer()
				consume, _ := rep.Stage("consume")
				f.add("peak-queued", float64(consume.PeakQueue))
				f.add("peak-heap-KiB", heapKiB)
				f.add("wall-s", wall.Seconds())
			}
			f.report(b)
		})
	}
}
