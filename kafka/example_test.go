package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
)

// exampleEnv is what every example needs: a Kafka cluster in the process (kfake), with
// the one-partition topics orders, shipped and rejected, and a producing client. Real
// code gives its clients the seed brokers of its own cluster instead.
type exampleEnv struct {
	cluster *kfake.Cluster
	prod    *kgo.Client
}

func newExampleEnv(orders ...string) *exampleEnv {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "shipped", "rejected"),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		panic(err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	for _, o := range orders {
		if err := prod.ProduceSync(context.Background(), &kgo.Record{Topic: "orders", Key: []byte(o), Value: []byte(o)}).FirstErr(); err != nil {
			panic(err)
		}
	}
	return &exampleEnv{cluster: c, prod: prod}
}

// client returns the options of a consumer of the cluster.
func (e *exampleEnv) client() []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(e.cluster.ListenAddrs()...),
		kgo.SessionTimeout(2 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}
}

// read returns the values of topic's records (at most n, waiting for them).
func (e *exampleEnv) read(topic string, n int) []string {
	var got []string
	for _, r := range e.records(topic, n) {
		got = append(got, string(r.Value))
	}
	return got
}

// records returns topic's records (at most n, waiting at most 10 s for them).
func (e *exampleEnv) records(topic string, n int) []*kgo.Record {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.cluster.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []*kgo.Record
	for len(got) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, r) })
	}
	return got
}

func (e *exampleEnv) close() {
	e.prod.Close()
	e.cluster.Close()
}

// This example shows a pipeline that ships orders from one topic to another, as a
// member of the consumer group "shipping": each record's offset is committed once the
// sink's produce is acknowledged, a rejected order goes to a dead-letter topic with
// headers that say why, and Stop ends the run, committing every settled record.
func Example() {
	env := newExampleEnv("order-0", "order-1", "order-2", "order-3", "order-4")
	defer env.close()

	p := pipeline.New()
	src := kafka.NewSource(env.client(), "shipping", []string{"orders"}, kafka.Bytes{},
		kafka.WithDeadLetterTopic(env.prod, "rejected"))
	checked := pipeline.Then(src.Stream(p), pipeline.NewStage("check", 2, func(_ context.Context, m kafka.Message[[]byte]) (string, error) {
		if string(m.Value) == "order-3" {
			return "", pipeline.Permanent(errors.New("no address"))
		}
		return string(m.Value), nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[kafka.Message[[]byte]])))
	var shipped atomic.Int64 // Map runs in the check stage's two workers
	counted := pipeline.Map(checked, func(o string) string {
		if shipped.Add(1) == 4 {
			src.Stop() // all the good orders are on their way
		}
		return o
	})
	key := func(o string) ([]byte, []kgo.RecordHeader) { return []byte(o), nil }
	pipeline.ToBatches(counted, 10, kafka.NewSink("ship", 1, env.prod, "shipped", pipeline.JSONCodec[string]{}, key),
		pipeline.WithLinger(10*time.Millisecond))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	fmt.Println("shipped:", len(env.read("shipped", 4)), "rejected:", env.read("rejected", 1))
	st := src.Stats()
	fmt.Println("committed:", st.Committed, "dead-lettered:", st.DeadLettered)
	// Output:
	// shipped: 4 rejected: [order-3]
	// committed: 4 dead-lettered: 1
}

// This example shows a source with its options: the group's members share the
// partitions of the topics, each holding at most 500 records, committing every half
// second, and giving the items of a revoked partition 2 s to settle.
func ExampleNewSource() {
	env := newExampleEnv("a", "b", "c")
	defer env.close()

	src := kafka.NewSource(env.client(), "letters", []string{"orders"}, kafka.Bytes{},
		kafka.WithName("letters"), kafka.WithMaxPending(500),
		kafka.WithCommitInterval(500*time.Millisecond), kafka.WithRevokeTimeout(2*time.Second),
		kafka.WithRequestTimeout(5*time.Second))
	p := pipeline.New()
	n := 0
	pipeline.To(src.Stream(p), pipeline.NewSink("print", 1, func(_ context.Context, m kafka.Message[[]byte]) error {
		fmt.Printf("%s/%d@%d: %s\n", m.Topic, m.Partition, m.Offset, m.Value)
		if n++; n == 3 {
			src.Stop()
		}
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// orders/0@0: a
	// orders/0@1: b
	// orders/0@2: c
}

// This example shows the sink: items produced in batches, each with a key (which picks
// its partition) and headers, acknowledged by the broker before the batch's items
// count as committed.
func ExampleNewSink() {
	env := newExampleEnv()
	defer env.close()

	p := pipeline.New()
	meta := func(fruit []byte) ([]byte, []kgo.RecordHeader) {
		return fruit[:1], []kgo.RecordHeader{{Key: "length", Value: fmt.Append(nil, len(fruit))}}
	}
	fruits := [][]byte{[]byte("apple"), []byte("banana"), []byte("cherry")}
	pipeline.ToBatches(pipeline.FromSlice(p, fruits), 2, kafka.NewSink("produce", 1, env.prod, "shipped", kafka.Bytes{}, meta),
		pipeline.WithLinger(10*time.Millisecond))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	fmt.Println(env.read("shipped", 3))
	// Output:
	// [apple banana cherry]
}

// This example shows what a dead-letter record says: a record the codec cannot decode
// is produced to the dead-letter topic, with the original value and headers naming
// the stage, the error and where the record was.
func ExampleWithDeadLetterTopic() {
	env := newExampleEnv(`not json`, `{"id":1}`)
	defer env.close()

	type order struct{ ID int }
	src := kafka.NewSource(env.client(), "orders", []string{"orders"}, pipeline.JSONCodec[order]{},
		kafka.WithDeadLetterTopic(env.prod, "rejected"))
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("print", 1, func(_ context.Context, m kafka.Message[order]) error {
		fmt.Println("order", m.Value.ID)
		src.Stop() // the record before it was set aside (in offset order) before it was emitted
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	dead := env.records("rejected", 1)[0]
	fmt.Printf("dead letter: %s\n", dead.Value)
	for _, h := range dead.Headers {
		if h.Key != kafka.HeaderTime && h.Key != kafka.HeaderError && h.Key != kafka.HeaderFirstError {
			fmt.Printf("  %s: %s\n", h.Key, h.Value)
		}
	}
	// Output:
	// order 1
	// dead letter: not json
	//   pipeline-stage: Kafka
	//   pipeline-class: item
	//   pipeline-error-type: *json.SyntaxError
	//   pipeline-attempts: 1
	//   pipeline-topic: orders
	//   pipeline-partition: 0
	//   pipeline-offset: 0
}

// This example shows a graceful stop from the sink, once it has seen what it wanted:
// the items in flight finish and every settled record is committed, so that the next
// run of the group starts after them. (Each run stops at the last record there is:
// Stop does not wait, and the records the source emitted before it finish too.)
func ExampleSource_Stop() {
	env := newExampleEnv("x", "y")
	defer env.close()

	for run, last := range []string{"y", "z"} {
		if run == 1 { // an order that comes between the runs
			if err := env.prod.ProduceSync(context.Background(), &kgo.Record{Topic: "orders", Value: []byte("z")}).FirstErr(); err != nil {
				panic(err)
			}
		}
		src := kafka.NewSource(env.client(), "stopper", []string{"orders"}, kafka.Bytes{})
		p := pipeline.New()
		pipeline.To(src.Stream(p), pipeline.NewSink("print", 1, func(_ context.Context, m kafka.Message[[]byte]) error {
			fmt.Printf("run %d: %s\n", run, m.Value)
			if string(m.Value) == last {
				src.Stop() // the run commits x and y; the next one starts after them
			}
			return nil
		}))
		if err := p.Run(context.Background()); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// run 0: x
	// run 0: y
	// run 1: z
}

// This example shows the source's counts after a run.
func ExampleSource_Stats() {
	env := newExampleEnv("oops", "1", "2")
	defer env.close()

	src := kafka.NewSource(env.client(), "stats", []string{"orders"}, pipeline.JSONCodec[int]{})
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("stop at 2", 1, func(_ context.Context, m kafka.Message[int]) error {
		if m.Value == 2 {
			src.Stop()
		}
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	st := src.Stats()
	fmt.Println("fetched:", st.Fetched, "committed:", st.Committed, "undecodable:", st.Undecodable)
	// Output:
	// fetched: 3 committed: 2 undecodable: 1
}

// This example shows the consumer lag a run sees while its sink holds the records,
// and the counters a dashboard row shows (dashboard.WithRowStats).
func ExampleStats_Counters() {
	env := newExampleEnv("1", "2", "3")
	defer env.close()

	src := kafka.NewSource(env.client(), "lagging", []string{"orders"}, pipeline.JSONCodec[int]{},
		kafka.WithCommitInterval(50*time.Millisecond))
	p := pipeline.New()
	release := make(chan struct{})
	pipeline.To(src.Stream(p), pipeline.NewSink("held", 1, func(ctx context.Context, m kafka.Message[int]) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		if m.Value == 3 {
			src.Stop()
		}
		return nil
	}))
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	for src.Stats().TotalLag() != 3 { // nothing committed yet: the three records
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("lag of orders/0:", src.Stats().Lag[kafka.TopicPartition{Topic: "orders", Partition: 0}])
	close(release)
	if err := <-done; err != nil {
		fmt.Println(err)
	}
	c := src.Stats().Counters()
	fmt.Println("committed:", c["committed"], "lag:", c["lag"])
	// Output:
	// lag of orders/0: 3
	// committed: 3 lag: 0
}

// This example shows a stage keyed by partition: its four workers process the records
// of each partition one at a time and in offset order.
func ExampleMessage_TopicPartition() {
	env := newExampleEnv("p", "q", "r")
	defer env.close()

	src := kafka.NewSource(env.client(), "keyed", []string{"orders"}, kafka.Bytes{})
	p := pipeline.New()
	upper := pipeline.Then(src.Stream(p), pipeline.NewStage("upper", 4, func(_ context.Context, m kafka.Message[[]byte]) (string, error) {
		return strings.ToUpper(string(m.Value)), nil
	}, pipeline.WithKey(kafka.Message[[]byte].TopicPartition)))
	n := 0
	pipeline.To(upper, pipeline.NewSink("print", 1, func(_ context.Context, s string) error {
		fmt.Println(s)
		if n++; n == 3 {
			src.Stop()
		}
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// P
	// Q
	// R
}

// This example shows a run whose dead-letter topic the broker refuses (a permission
// missing: no retry can help, so the run fails at once), and a patience for causes that
// may pass, such as a dead-letter topic not created yet.
func ExampleDeadLetterError() {
	env := newExampleEnv(`not json`)
	defer env.close()
	env.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "rejected", Err: kerr.TopicAuthorizationFailed, Count: -1})

	src := kafka.NewSource(env.client(), "orders", []string{"orders"}, pipeline.JSONCodec[int]{},
		kafka.WithDeadLetterTopic(env.prod, "rejected"), kafka.WithDeadLetterTimeout(30*time.Second))
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("drop", 1, func(context.Context, kafka.Message[int]) error { return nil }))
	err := p.Run(context.Background())
	if de, ok := errors.AsType[*kafka.DeadLetterError](err); ok {
		fmt.Printf("record %s/%d@%d, permanent: %v, unauthorized: %v\n", de.From.Topic, de.From.Partition, de.Offset,
			de.Permanent, errors.Is(err, kerr.TopicAuthorizationFailed))
	}
	// Output:
	// record orders/0@0, permanent: true, unauthorized: true
}

// This example shows Kafka to Kafka exactly once: each batch of outputs is produced in
// a transaction that also commits the offsets of the records they come from. The
// stage keeps each output's origin (the message's Topic, Partition and Offset) and is
// keyed by partition, so that each partition's records reach the sink in order.
func ExampleNewTransactSink() {
	env := newExampleEnv("a", "b", "c")
	defer env.close()

	src := kafka.NewSource(env.client(), "shipping", []string{"orders"}, kafka.Bytes{},
		kafka.WithTransactionalID("shipping-1")) // one id per member, the same across its restarts
	p := pipeline.New()
	upper := pipeline.Then(src.Stream(p), pipeline.NewStage("upper", 2, func(_ context.Context, m kafka.Message[[]byte]) (kafka.Message[string], error) {
		if string(m.Value) == "c" {
			src.Stop()
		}
		return kafka.Message[string]{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: strings.ToUpper(string(m.Value))}, nil
	}, pipeline.WithKey(kafka.Message[[]byte].TopicPartition)))
	pipeline.ToBatches(upper, 10, kafka.NewTransactSink("ship", src, "shipped", pipeline.JSONCodec[string]{}, nil),
		pipeline.WithLinger(10*time.Millisecond))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	fmt.Println(env.read("shipped", 3))
	st := src.Stats()
	fmt.Println("committed:", st.Committed, "aborted:", st.Aborted)
	// Output:
	// ["A" "B" "C"]
	// committed: 3 aborted: 0
}

// This example shows the error of a run whose topic does not exist.
func ExampleGroupError() {
	env := newExampleEnv()
	defer env.close()

	src := kafka.NewSource(env.client(), "billing", []string{"invoices"}, kafka.Bytes{})
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("drop", 1, func(context.Context, kafka.Message[[]byte]) error { return nil }))
	err := p.Run(context.Background())
	if ge, ok := errors.AsType[*kafka.GroupError](err); ok {
		fmt.Println("group:", ge.Group, "topic:", ge.Topic, "unknown:", errors.Is(err, kerr.UnknownTopicOrPartition))
	}
	// Output:
	// group: billing topic: invoices unknown: true
}

// This example shows Bytes, the codec of raw values.
func ExampleBytes() {
	var v []byte
	_ = kafka.Bytes{}.Unmarshal([]byte("as it is"), &v)
	data, _ := kafka.Bytes{}.Marshal(v)
	fmt.Println(string(data))
	// Output:
	// as it is
}

// This example shows the error of a second run begun while the source serves one: a
// Source is one member of its group at a time.
func ExampleErrConcurrentRun() {
	env := newExampleEnv("x")
	defer env.close()

	src := kafka.NewSource(env.client(), "once", []string{"orders"}, kafka.Bytes{})
	started, release := make(chan struct{}), make(chan struct{})
	newPipeline := func() *pipeline.Pipeline {
		p := pipeline.New()
		pipeline.To(src.Stream(p), pipeline.NewSink("hold", 1, func(context.Context, kafka.Message[[]byte]) error {
			close(started) // the topic has one record: the first run's
			<-release
			src.Stop()
			return nil
		}))
		return p
	}
	done := make(chan error, 1)
	go func() { done <- newPipeline().Run(context.Background()) }()
	<-started // the first run is under way
	err := newPipeline().Run(context.Background())
	fmt.Println(errors.Is(err, kafka.ErrConcurrentRun))
	close(release)
	fmt.Println(<-done)
	// Output:
	// true
	// <nil>
}
