package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/jetstream"
)

// S7: scale-out on NATS JetStream. One stream of messages of 100 bytes (message i
// starts with i), filled once; each iteration reads all of it through a new durable
// pull consumer, so every iteration sees the same work:
//
//   - work=none/impl=plain: a nats.go loop over the consumer's Messages that acks each
//     message, the floor;
//   - work=none/impl=pipeline/procs=1: a pipeline jetstream.Source → no-op stage →
//     sink; the source acks each message once the sink committed it;
//   - work=io/impl=pipeline/procs=P: P such pipelines on P connections sharing the
//     consumer, the stage waiting 2 ms per message (I/O) with 8 workers.
//
// Metrics: msgs/s; lost, the messages of an iteration never committed (must be 0);
// redelivered, deliveries after the first (must be 0: nothing crashes here).
const (
	s7Items    = 100_000
	s7IOItems  = 20_000
	s7IOWait   = 2 * time.Millisecond
	s7IOWorker = 8
	s7MaxAck   = 1024
)

func BenchmarkS7JetStream(b *testing.B) {
	srv, url := s7Server(b)
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}()
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	s7Fill(ctx, b, js, "NONE", s7Items)
	s7Fill(ctx, b, js, "IO", s7IOItems)
	b.Run("work=none/impl=plain", func(b *testing.B) {
		s7Measure(b, js, "NONE", s7Items, func(ctx context.Context, cons natsjs.Consumer, _ string, seen *s7Seen) int64 {
			return s7Plain(ctx, b, cons, seen)
		})
	})
	b.Run("work=none/impl=pipeline/procs=1", func(b *testing.B) {
		conns := s7Conns(b, url, 1)
		s7Measure(b, js, "NONE", s7Items, func(ctx context.Context, _ natsjs.Consumer, name string, seen *s7Seen) int64 {
			return s7Pipelines(ctx, b, conns, "NONE", name, seen, 0, 1)
		})
	})
	for _, procs := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("work=io/impl=pipeline/procs=%d", procs), func(b *testing.B) {
			conns := s7Conns(b, url, procs)
			s7Measure(b, js, "IO", s7IOItems, func(ctx context.Context, _ natsjs.Consumer, name string, seen *s7Seen) int64 {
				return s7Pipelines(ctx, b, conns, "IO", name, seen, s7IOWait, s7IOWorker)
			})
		})
	}
}

// s7Measure runs one iteration per b.Loop: a fresh durable consumer on stream, read
// by run (given the consumer and its name), which returns the redeliveries it saw.
func s7Measure(b *testing.B, js natsjs.JetStream, stream string, items int, run func(context.Context, natsjs.Consumer, string, *s7Seen) int64) {
	b.Helper()
	ctx := b.Context()
	var lost, redelivered int64
	iter := 0
	for b.Loop() {
		iter++
		name := "c" + strconv.Itoa(iter)
		cons, err := js.CreateConsumer(ctx, stream, natsjs.ConsumerConfig{
			Durable: name, AckPolicy: natsjs.AckExplicitPolicy, MaxAckPending: s7MaxAck, AckWait: time.Minute,
		})
		if err != nil {
			b.Fatal(err)
		}
		seen := newS7Seen(items)
		redelivered += run(ctx, cons, name, seen)
		lost += int64(items) - seen.unique.Load()
		if err := js.DeleteConsumer(ctx, stream, name); err != nil {
			b.Fatal(err)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(items)*n/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(lost)/n, "lost")
	b.ReportMetric(float64(redelivered)/n, "redelivered")
}

// s7Seen tells which items were committed in an iteration; done is closed when all were.
type s7Seen struct {
	ids    []atomic.Bool
	unique atomic.Int64
	done   chan struct{}
}

func newS7Seen(n int) *s7Seen { return &s7Seen{ids: make([]atomic.Bool, n), done: make(chan struct{})} }

func (s *s7Seen) commit(data []byte) {
	id := binary.BigEndian.Uint64(data)
	if id < uint64(len(s.ids)) && !s.ids[id].Swap(true) && s.unique.Add(1) == int64(len(s.ids)) {
		close(s.done)
	}
}

// s7Plain is the floor: a loop over the consumer's messages that acks each one.
func s7Plain(ctx context.Context, b *testing.B, cons natsjs.Consumer, seen *s7Seen) int64 {
	b.Helper()
	it, err := cons.Messages(natsjs.PullMaxMessages(256))
	if err != nil {
		b.Fatal(err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	var redelivered int64
	for {
		select {
		case <-seen.done:
			it.Stop()
			return redelivered
		default:
		}
		msg, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		if meta, err := msg.Metadata(); err == nil && meta.NumDelivered > 1 {
			redelivered++
		}
		seen.commit(msg.Data())
		if err := msg.Ack(); err != nil {
			b.Fatal(err)
		}
	}
}

// s7Pipelines runs one pipeline per connection over the consumer of stream, each
// stage waiting wait per message with workers workers, until every item is committed.
func s7Pipelines(ctx context.Context, b *testing.B, conns []natsjs.JetStream, stream, name string, seen *s7Seen, wait time.Duration, workers int) int64 {
	b.Helper()
	srcs := make([]*jetstream.Source[[]byte], len(conns))
	ps := make([]*pipeline.Pipeline, len(conns))
	for i, js := range conns {
		cons, err := js.Consumer(ctx, stream, name)
		if err != nil {
			b.Fatal(err)
		}
		p := pipeline.New()
		src := jetstream.NewSource(cons, jetstream.Bytes{})
		s := pipeline.Then(src.Stream(p), pipeline.NewStage("work", workers, func(_ context.Context, v []byte) ([]byte, error) {
			if wait > 0 {
				time.Sleep(wait) // the I/O
			}
			return v, nil
		}))
		pipeline.To(s, pipeline.NewSink("commit", 1, func(_ context.Context, v []byte) error {
			seen.commit(v)
			return nil
		}))
		srcs[i], ps[i] = src, p
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ps))
	for i, p := range ps {
		wg.Go(func() { errs[i] = p.Run(ctx) })
	}
	select {
	case <-seen.done:
	case <-ctx.Done():
	}
	for _, s := range srcs {
		s.Stop()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	var redelivered int64
	for _, s := range srcs {
		redelivered += s.Stats().Redelivered
	}
	return redelivered
}

func s7Server(b *testing.B) (*server.Server, string) {
	b.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: b.TempDir(), NoLog: true, NoSigs: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		b.Fatal("the embedded server did not start")
	}
	return srv, "nats://127.0.0.1:" + strconv.Itoa(srv.Addr().(*net.TCPAddr).Port)
}

// s7Conns opens n connections, closed when b ends.
func s7Conns(b *testing.B, url string, n int) []natsjs.JetStream {
	b.Helper()
	out := make([]natsjs.JetStream, n)
	for i := range out {
		nc, err := nats.Connect(url)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		if out[i], err = natsjs.New(nc); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// s7Fill makes stream (subject = its name) with n messages of 100 bytes.
func s7Fill(ctx context.Context, b *testing.B, js natsjs.JetStream, stream string, n int) {
	b.Helper()
	if _, err := js.CreateStream(ctx, natsjs.StreamConfig{Name: stream, Subjects: []string{stream}, Storage: natsjs.FileStorage}); err != nil {
		b.Fatal(err)
	}
	var futures []natsjs.PubAckFuture
	flush := func() {
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
		futures = futures[:0]
	}
	for i := range n {
		data := make([]byte, 100)
		binary.BigEndian.PutUint64(data, uint64(i))
		f, err := js.PublishAsync(stream, data)
		if err != nil {
			b.Fatal(err)
		}
		if futures = append(futures, f); len(futures) == 512 {
			flush()
		}
	}
	flush()
}
