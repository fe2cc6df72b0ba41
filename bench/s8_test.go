package bench

import (
	"context"
	"encoding/binary"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
)

// S8: a Kafka consumer group, on a cluster in the process (franz-go's kfake, loopback).
// One topic of 12 partitions holds s8Items records of 100 bytes (record i starts with
// i), filled once; each iteration reads all of it as a new consumer group, so every
// iteration sees the same work:
//
//   - impl=plain: a franz-go PollFetches loop that marks each record once processed
//     (kgo.AutoCommitMarks) and commits the marks, as a skilled user writes it: the
//     floor;
//   - impl=pipeline: kafka.Source → a no-op sink; each partition's offset follows the
//     items' outcomes (a watermark), committed every second and at the end.
//
// Both end with a commit of every record's offset, checked. Metrics: records/s; lost,
// the records of an iteration never processed (must be 0); duplicated, records
// processed more than once (must be 0: nothing crashes here); cpu-ns/record, the CPU
// time (user and system) the whole process spent per record while timed: the
// cluster's share, the same for both, with the implementation's. It depends far less
// than records/s on what else the machine runs. The PostgreSQL variants,
// sink=postgres/impl=..., are in s8_postgres_test.go.
const (
	s8Items      = 2_000_000
	s8Partitions = 12
	s8Topic      = "s8"
)

// s8Groups counts the groups made, so that no iteration reuses one.
var s8Groups atomic.Int64

func BenchmarkS8Kafka(b *testing.B) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(s8Partitions, s8Topic))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := b.Context()
	s8Fill(ctx, b, c)
	b.Run("impl=plain", func(b *testing.B) {
		s8Measure(b, c, "plain", func(ctx context.Context, group string, seen *s8Seen) {
			s8Plain(ctx, b, c, group, seen)
		})
	})
	b.Run("impl=pipeline", func(b *testing.B) {
		s8Measure(b, c, "pipeline", func(ctx context.Context, group string, seen *s8Seen) {
			s8Pipeline(ctx, b, c, group, seen)
		})
	})
	b.Run("sink=postgres", func(b *testing.B) { // s8_postgres_test.go
		db := newS8PG(b)
		part := newS8PGPart(b, s8Ends(ctx, b, c))
		b.Run("impl=plain", func(b *testing.B) {
			s8PGMeasure(b, db, "plain", part, func(ctx context.Context, group string) {
				s8PGPlain(ctx, b, c, db, group, part)
			}, func(ctx context.Context, group string) (map[int32]int64, error) {
				return s8PGStored(ctx, db, group, nil)
			})
		})
		b.Run("impl=pipeline", func(b *testing.B) {
			s8PGMeasure(b, db, "pipeline", part, func(ctx context.Context, group string) {
				s8PGPipeline(ctx, b, c, db, group, part)
			}, func(ctx context.Context, group string) (map[int32]int64, error) {
				return s8PGPipelineStored(ctx, db, group)
			})
		})
	})
}

// s8Opts are the client options of both implementations.
func s8Opts(c *kfake.Cluster) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}
}

// s8Measure runs one iteration per b.Loop: a new group (named impl and a count) reading
// the whole topic through run, then a check that the group committed every
// partition's end.
func s8Measure(b *testing.B, c *kfake.Cluster, impl string, run func(context.Context, string, *s8Seen)) {
	b.Helper()
	ctx := b.Context()
	var lost, dup int64
	var cpu time.Duration
	for b.Loop() {
		group := impl + "-" + strconv.FormatInt(s8Groups.Add(1), 10) // a new group each time, whatever ran before
		seen := newS8Seen(s8Items)
		before := cpuTime(b)
		run(ctx, group, seen)
		cpu += cpuTime(b) - before
		lost += int64(s8Items) - seen.unique.Load()
		dup += seen.dup.Load()
		b.StopTimer()
		s8CheckCommitted(ctx, b, c, group)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(s8Items)*n/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(lost)/n, "lost")
	b.ReportMetric(float64(dup)/n, "duplicated")
	b.ReportMetric(float64(cpu.Nanoseconds())/(float64(s8Items)*n), "cpu-ns/record")
}

// s8Seen tells which records were processed in an iteration; done is closed when all were.
type s8Seen struct {
	ids         []atomic.Bool
	unique, dup atomic.Int64
	done        chan struct{}
}

func newS8Seen(n int) *s8Seen { return &s8Seen{ids: make([]atomic.Bool, n), done: make(chan struct{})} }

func (s *s8Seen) process(value []byte) {
	id := binary.BigEndian.Uint64(value)
	if id >= uint64(len(s.ids)) {
		return
	}
	if s.ids[id].Swap(true) {
		s.dup.Add(1)
		return
	}
	if s.unique.Add(1) == int64(len(s.ids)) {
		close(s.done)
	}
}

// s8Plain is the floor: poll, process each record, mark it, commit the marks (every
// 5 s, kgo's default, and at the end).
func s8Plain(ctx context.Context, b *testing.B, c *kfake.Cluster, group string, seen *s8Seen) {
	b.Helper()
	cl, err := kgo.NewClient(append(s8Opts(c), kgo.ConsumerGroup(group), kgo.ConsumeTopics(s8Topic), kgo.AutoCommitMarks())...)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	for {
		select {
		case <-seen.done:
			if err := cl.CommitMarkedOffsets(ctx); err != nil {
				b.Fatal(err)
			}
			return
		default:
		}
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			b.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			seen.process(r.Value)
			cl.MarkCommitRecords(r)
		})
	}
}

// s8Pipeline is the library: the group source into a no-op sink, stopped once every
// record was processed (the stop commits every settled record).
func s8Pipeline(ctx context.Context, b *testing.B, c *kfake.Cluster, group string, seen *s8Seen) {
	b.Helper()
	src := kafka.NewSource(s8Opts(c), group, []string{s8Topic}, kafka.Bytes{})
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("process", 1, func(_ context.Context, m kafka.Message[[]byte]) error {
		seen.process(m.Value)
		return nil
	}))
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	select {
	case <-seen.done:
	case err := <-errc:
		b.Fatalf("the run ended early: %v", err)
	}
	src.Stop()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

// s8Fill writes s8Items records of 100 bytes, record i on partition i % 12.
func s8Fill(ctx context.Context, b *testing.B, c *kfake.Cluster) {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.MaxBufferedRecords(100_000))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var failed atomic.Pointer[error]
	for i := range s8Items {
		v := make([]byte, 100)
		binary.BigEndian.PutUint64(v, uint64(i))
		cl.Produce(ctx, &kgo.Record{Topic: s8Topic, Partition: int32(i % s8Partitions), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
}

// s8CheckCommitted fails b unless group committed every partition's end.
func s8CheckCommitted(ctx context.Context, b *testing.B, c *kfake.Cluster, group string) {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, s8Topic)
	if err != nil {
		b.Fatal(err)
	}
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		b.Fatal(err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		if o, ok := offs.Lookup(s8Topic, e.Partition); !ok || o.At != e.Offset {
			b.Fatalf("group %s: partition %d committed at %d, its end is %d", group, e.Partition, o.At, e.Offset)
		}
	})
}
