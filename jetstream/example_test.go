package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/jetstream"
)

// exampleEnv is what every example needs: an embedded server, a connection, a stream
// ORDERS (subject orders) holding n messages "order-0" ... and a durable consumer on
// it. Real code connects to its own server instead.
type exampleEnv struct {
	srv  *server.Server
	dir  string
	nc   *nats.Conn
	js   natsjs.JetStream
	cons natsjs.Consumer
}

func newExampleEnv(n int) *exampleEnv {
	dir, err := os.MkdirTemp("", "jetstream-example")
	if err != nil {
		panic(err)
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		panic("the server did not start")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	js, err := natsjs.New(nc)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, cfg := range []natsjs.StreamConfig{
		{Name: "ORDERS", Subjects: []string{"orders"}},
		{Name: "SHIPPED", Subjects: []string{"shipped"}},
		{Name: "REJECTED", Subjects: []string{"rejected"}},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			panic(err)
		}
	}
	for i := range n {
		if _, err := js.Publish(ctx, "orders", []byte("order-"+strconv.Itoa(i))); err != nil {
			panic(err)
		}
	}
	cons, err := js.CreateConsumer(ctx, "ORDERS", natsjs.ConsumerConfig{Durable: "shipping", AckPolicy: natsjs.AckExplicitPolicy})
	if err != nil {
		panic(err)
	}
	return &exampleEnv{srv: srv, dir: dir, nc: nc, js: js, cons: cons}
}

func (e *exampleEnv) close() {
	e.nc.Close()
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	_ = os.RemoveAll(e.dir)
}

// count returns how many messages stream holds.
func (e *exampleEnv) count(stream string) uint64 {
	s, err := e.js.Stream(context.Background(), stream)
	if err != nil {
		panic(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		panic(err)
	}
	return info.State.Msgs
}

// stopAfter returns a sink function that counts items and stops src after n.
func stopAfter[T any](src *jetstream.Source[T], n int) func(context.Context, T) error {
	seen := 0
	return func(context.Context, T) error {
		if seen++; seen == n {
			src.Stop()
		}
		return nil
	}
}

// This example shows a pipeline that ships orders from a durable consumer to another
// stream: each message is acknowledged once the sink's publish is stored, a rejected
// one goes to a dead-letter stream with headers that say why, and Stop ends the run
// after the last one.
func Example() {
	env := newExampleEnv(5)
	defer env.close()

	p := pipeline.New()
	src := jetstream.NewSource(env.cons, jetstream.Bytes{}, jetstream.WithDeadLetterSubject(env.js, "rejected"))
	checked := pipeline.Then(src.Stream(p), pipeline.NewStage("check", 2, func(_ context.Context, order []byte) (string, error) {
		if string(order) == "order-3" {
			return "", pipeline.Permanent(errors.New("no address"))
		}
		return string(order), nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[[]byte])))
	var shipped atomic.Int64 // Map runs in the check stage's two workers
	counted := pipeline.Map(checked, func(o string) string {
		if shipped.Add(1) == 4 {
			src.Stop() // all the good orders are on their way
		}
		return o
	})
	pipeline.ToBatches(counted, 10, jetstream.NewSink("ship", 1, env.js, "shipped", pipeline.JSONCodec[string]{}, func(o string) string { return o }),
		pipeline.WithLinger(10*time.Millisecond))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	fmt.Println("shipped:", env.count("SHIPPED"), "rejected:", env.count("REJECTED"))
	st := src.Stats()
	fmt.Println("acked:", st.Acked, "dead-lettered:", st.DeadLettered)
	// Output:
	// shipped: 4 rejected: 1
	// acked: 4 dead-lettered: 1
}

// This example shows the headers of a dead-letter message.
func ExampleWithDeadLetterSubject() {
	env := newExampleEnv(1)
	defer env.close()

	p := pipeline.New()
	src := jetstream.NewSource(env.cons, jetstream.Bytes{}, jetstream.WithDeadLetterSubject(env.js, "rejected"))
	pipeline.To(src.Stream(p), pipeline.NewSink("store", 1, func(context.Context, []byte) error {
		src.Stop()
		return pipeline.Permanent(errors.New("no such customer"))
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[[]byte])))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	s, err := env.js.Stream(context.Background(), "REJECTED")
	if err != nil {
		panic(err)
	}
	m, err := s.GetMsg(context.Background(), 1)
	if err != nil {
		panic(err)
	}
	headers := []string{
		jetstream.HeaderStage, jetstream.HeaderClass, jetstream.HeaderError, jetstream.HeaderAttempts,
		jetstream.HeaderSubject, jetstream.HeaderStream, jetstream.HeaderSequence, jetstream.HeaderDeliveries,
	}
	for _, h := range headers {
		fmt.Printf("%s: %s\n", h, m.Header.Get(h))
	}
	fmt.Println(string(m.Data))
	// Output:
	// Pipeline-Stage: store
	// Pipeline-Class: item
	// Pipeline-Error: no such customer
	// Pipeline-Attempts: 1
	// Pipeline-Subject: orders
	// Pipeline-Stream: ORDERS
	// Pipeline-Sequence: 1
	// Pipeline-Deliveries: 1
	// order-0
}

// This example shows NewSource with its options for backpressure and timing.
func ExampleNewSource() {
	env := newExampleEnv(3)
	defer env.close()

	p := pipeline.New()
	later := func(int) time.Duration { return time.Second }
	src := jetstream.NewSource(env.cons, jetstream.Bytes{},
		jetstream.WithName("orders"),                // the source's row in the report
		jetstream.WithPullSize(64),                  // messages buffered by the client
		jetstream.WithMaxPending(128),               // messages held unsettled by the pipeline
		jetstream.WithProgressEvery(10*time.Second), // InProgress for a message held longer
		jetstream.WithAckTimeout(2*time.Second),     // for DoubleAck and dead-letter publishes
		jetstream.WithRedeliveryBackoff(later),      // the delay of a handed-back message
	)
	pipeline.To(src.Stream(p), pipeline.NewSink("store", 1, stopAfter(src, 3)))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	fmt.Println(p.Report().Stages[0].Name, "acked", src.Stats().Acked)
	// Output:
	// orders acked 3
}

// This example shows Stop: the input ends, what is in flight finishes and is acked,
// and Run returns nil.
func ExampleSource_Stop() {
	env := newExampleEnv(10)
	defer env.close()

	p := pipeline.New()
	src := jetstream.NewSource(env.cons, jetstream.Bytes{})
	pipeline.To(src.Stream(p), pipeline.NewSink("store", 1, stopAfter(src, 10)))
	fmt.Println(p.Run(context.Background()))
	fmt.Println("acked:", src.Stats().Acked)
	// Output:
	// <nil>
	// acked: 10
}

// This example shows the counts of a source: a message handed back by a stage is
// redelivered by the server, and its second delivery counts as a redelivery.
func ExampleSource_Stats() {
	env := newExampleEnv(1)
	defer env.close()

	p := pipeline.New()
	src := jetstream.NewSource(env.cons, jetstream.Bytes{})
	tries := 0
	pipeline.To(src.Stream(p), pipeline.NewSink("call", 1, func(context.Context, []byte) error {
		if tries++; tries == 1 {
			return pipeline.Transient(errors.New("busy"))
		}
		src.Stop()
		return nil
	}, pipeline.WithHandBack(), pipeline.WithRetry(1, pipeline.ConstantBackoff(10*time.Millisecond))))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	st := src.Stats()
	fmt.Printf("delivered %d, redelivered %d, handed back %d, acked %d\n", st.Delivered, st.Redelivered, st.HandedBack, st.Acked)
	// Output:
	// delivered 2, redelivered 1, handed back 1, acked 1
}

// This example shows Counters: a source's counts by the server's names for them, as a
// view of a connector's counters takes them (the dashboard's WithRowStats).
func ExampleStats_Counters() {
	st := jetstream.Stats{Delivered: 12, Redelivered: 2, Acked: 9, HandedBack: 2, DeadLettered: 1, AckErrors: 1}
	c := st.Counters()
	for _, k := range slices.Sorted(maps.Keys(c)) {
		fmt.Printf("%s=%d ", k, c[k])
	}
	fmt.Println()
	// Output:
	// ack errors=1 acked=9 delivered=12 nak=0 nak delay=2 redelivered=2 term=1
}

// This example shows Stream: the source's items enter the pipeline as a typed stream.
func ExampleSource_Stream() {
	env := newExampleEnv(2)
	defer env.close()

	p := pipeline.New()
	src := jetstream.NewSource(env.cons, jetstream.Bytes{})
	names := pipeline.Map(src.Stream(p), func(b []byte) string { return string(b) })
	got := map[string]bool{}
	pipeline.To(names, pipeline.NewSink("store", 1, func(_ context.Context, s string) error {
		if got[s] = true; len(got) == 2 {
			src.Stop()
		}
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	fmt.Println(got["order-0"], got["order-1"])
	// Output:
	// true true
}

// This example shows WithDoubleAck: the sink's worker waits until the server confirmed
// each acknowledgement.
func ExampleWithDoubleAck() {
	env := newExampleEnv(3)
	defer env.close()

	p := pipeline.New()
	src := jetstream.NewSource(env.cons, jetstream.Bytes{}, jetstream.WithDoubleAck())
	pipeline.To(src.Stream(p), pipeline.NewSink("store", 1, stopAfter(src, 3)))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	info, err := env.cons.Info(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println("acked:", src.Stats().Acked, "unacknowledged:", info.NumAckPending)
	// Output:
	// acked: 3 unacknowledged: 0
}

// This example shows NewSink: the same items published twice (as after a crash that
// came before the source's acks) are stored once, because each message's Nats-Msg-Id
// comes from its item.
func ExampleNewSink() {
	env := newExampleEnv(0)
	defer env.close()

	for range 2 {
		p := pipeline.New()
		items := pipeline.FromSlice(p, []string{"a", "b", "c"})
		pipeline.ToBatches(items, 3, jetstream.NewSink("ship", 1, env.js, "shipped", pipeline.JSONCodec[string]{},
			func(s string) string { return "id-" + s }, pipeline.WithRetry(3, pipeline.ConstantBackoff(10*time.Millisecond))))
		if err := p.Run(context.Background()); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println("stored:", env.count("SHIPPED"))
	// Output:
	// stored: 3
}

// This example shows the Bytes codec: items are the messages' data as they are.
func ExampleBytes() {
	var v []byte
	if err := (jetstream.Bytes{}).Unmarshal([]byte("raw"), &v); err != nil {
		fmt.Println(err)
	}
	out, _ := jetstream.Bytes{}.Marshal(v)
	fmt.Println(string(out))
	// Output:
	// raw
}

// This example shows a consumer deleted while the pipeline runs: Run fails with a
// ConsumerError that names it, within two WithConsumerCheck intervals when the run is
// busy (at once when a pull waits).
func ExampleConsumerError() {
	env := newExampleEnv(3)
	defer env.close()

	p := pipeline.New()
	src := jetstream.NewSource(env.cons, jetstream.Bytes{}, jetstream.WithConsumerCheck(100*time.Millisecond))
	deleted := false
	pipeline.To(src.Stream(p), pipeline.NewSink("store", 1, func(ctx context.Context, _ []byte) error {
		if !deleted {
			deleted = true
			return env.js.DeleteConsumer(ctx, "ORDERS", "shipping")
		}
		return nil
	}))
	err := p.Run(context.Background())
	var ce *jetstream.ConsumerError
	fmt.Println(errors.As(err, &ce), ce.Stream, ce.Consumer, errors.Is(err, natsjs.ErrConsumerDeleted))
	// Output:
	// true ORDERS shipping true
}

// This example shows WithConsumerCheck: how often a busy source asks the server
// whether its consumer still exists (two "not found" answers in a row fail the run).
func ExampleWithConsumerCheck() {
	env := newExampleEnv(1)
	defer env.close()

	p := pipeline.New()
	src := jetstream.NewSource(env.cons, jetstream.Bytes{}, jetstream.WithConsumerCheck(5*time.Second))
	pipeline.To(src.Stream(p), pipeline.NewSink("store", 1, stopAfter(src, 1)))
	fmt.Println(p.Run(context.Background()))
	// Output:
	// <nil>
}
