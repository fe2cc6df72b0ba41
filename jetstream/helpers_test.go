package jetstream_test

import (
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
	"github.com/gopipeline/pipeline/jetstream"
)

// embedded is a JetStream server in this process, on loopback, with its store in a
// temporary folder; restart stops it and starts it again on the same port and store.
type embedded struct {
	t    *testing.T
	dir  string
	port int
	srv  *server.Server
}

func startServer(t *testing.T) *embedded {
	t.Helper()
	e := &embedded{t: t, dir: t.TempDir(), port: server.RANDOM_PORT}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *embedded) start() {
	e.t.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: e.port, JetStream: true, StoreDir: e.dir,
		NoLog: true, NoSigs: true, MaxPayload: 1 << 20,
	})
	require.NoError(e.t, err)
	go srv.Start()
	require.True(e.t, srv.ReadyForConnections(30*time.Second), "the embedded server did not start")
	e.srv = srv
	e.port = srv.Addr().(*net.TCPAddr).Port
}

func (e *embedded) stop() {
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		e.srv = nil
	}
}

func (e *embedded) restart() {
	e.stop()
	e.start()
}

// restartEmpty restarts it on the same port with a new, empty store: every stream and
// consumer is gone, and no client is told.
func (e *embedded) restartEmpty() {
	e.stop()
	e.dir = e.t.TempDir()
	e.start()
}

func (e *embedded) url() string { return "nats://127.0.0.1:" + strconv.Itoa(e.port) }

// connect opens a connection that reconnects for ever, closed when the test ends.
func connect(t *testing.T, url string) (*nats.Conn, natsjs.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := natsjs.New(nc)
	require.NoError(t, err)
	return nc, js
}

// setup makes the streams IN (subjects in.>), OUT (out) and DEAD (dead), and the
// durable consumer "work" on IN.
func setup(ctx context.Context, t *testing.T, js natsjs.JetStream, ackWait time.Duration, maxAck int) natsjs.Consumer {
	t.Helper()
	for _, cfg := range []natsjs.StreamConfig{
		{Name: "IN", Subjects: []string{"in.>"}, Storage: natsjs.FileStorage},
		{Name: "OUT", Subjects: []string{"out"}, Storage: natsjs.FileStorage, Duplicates: 10 * time.Minute},
		{Name: "DEAD", Subjects: []string{"dead"}, Storage: natsjs.FileStorage, Duplicates: 10 * time.Minute},
	} {
		_, err := js.CreateStream(ctx, cfg)
		require.NoError(t, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "IN", natsjs.ConsumerConfig{
		Durable: "work", AckPolicy: natsjs.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: maxAck, MaxDeliver: -1,
	})
	require.NoError(t, err)
	return cons
}

// newConsumer starts a server (startServer), connects to it and sets its stream and
// consumer up (setup, with ackWait and maxAck).
func newConsumer(t *testing.T, ackWait time.Duration, maxAck int) (natsjs.JetStream, natsjs.Consumer) {
	t.Helper()
	_, js, cons := newServerConsumer(t, ackWait, maxAck)
	return js, cons
}

// newServerConsumer is newConsumer for a test that also stops or restarts the server,
// or connects to it again: it returns the server too.
func newServerConsumer(t *testing.T, ackWait time.Duration, maxAck int) (*embedded, natsjs.JetStream, natsjs.Consumer) {
	t.Helper()
	srv := startServer(t)
	_, js := connect(t, srv.url())
	return srv, js, setup(t.Context(), t, js, ackWait, maxAck)
}

// publish puts n messages into IN: message i is 100 bytes starting with i in binary.
func publish(ctx context.Context, t *testing.T, js natsjs.JetStream, n int) {
	t.Helper()
	const window = 512
	futures := make([]natsjs.PubAckFuture, 0, window)
	wait := func() {
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				require.NoError(t, err)
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
		futures = futures[:0]
	}
	for i := range n {
		f, err := js.PublishAsync("in.items", payload(i))
		require.NoError(t, err)
		if futures = append(futures, f); len(futures) == window {
			wait()
		}
	}
	wait()
}

func payload(i int) []byte {
	b := make([]byte, 100)
	binary.BigEndian.PutUint64(b, uint64(i))
	return b
}

// item is a decoded message of IN.
type item struct{ ID int }

// itemCodec decodes payload's format.
type itemCodec struct{}

func (itemCodec) Marshal(v item) ([]byte, error) { return payload(v.ID), nil }

func (itemCodec) Unmarshal(data []byte, v *item) error {
	if len(data) < 8 {
		return errShort
	}
	v.ID = int(binary.BigEndian.Uint64(data))
	return nil
}

// msgs returns how many messages stream holds.
func msgs(ctx context.Context, t *testing.T, js natsjs.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return info.State.Msgs
}

// countItems returns a sink "count" that counts its items in n.
func countItems(n *atomic.Int64) *pipeline.Stage[item, struct{}] {
	return pipeline.NewSink("count", 1, func(context.Context, item) error {
		n.Add(1)
		return nil
	})
}

// countThenStop is a sink of workers that counts items in n and stops src once it has
// counted want: a run that ends when every message it should get has come.
func countThenStop(src *jetstream.Source[item], workers int, n *atomic.Int64, want int64) *pipeline.Stage[item, struct{}] {
	return pipeline.NewSink("count", workers, func(context.Context, item) error {
		if n.Add(1) == want {
			src.Stop()
		}
		return nil
	})
}

// eventually polls cond against the server, every 20 ms, for at most limit.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	scenario.Eventually(t, 20*time.Millisecond, limit, what, cond)
}

// runRejecting runs src through a stage that sets every item aside (its destination
// discards them: the source's own dead-letter subject, if any, is what a test looks at)
// into a sink; tried, when not nil, is called at each try. The channel gives Run's error.
func runRejecting(ctx context.Context, p *pipeline.Pipeline, src *jetstream.Source[item], tried func()) <-chan error {
	work := pipeline.Then(src.Stream(p), pipeline.NewStage("reject", 1, func(_ context.Context, v item) (item, error) {
		if tried != nil {
			tried()
		}
		return v, pipeline.Permanent(errShort)
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[item])))
	pipeline.To(work, pipeline.NewSink("sink", 1, func(context.Context, item) error { return nil }))
	return scenario.Start(ctx, p)
}
