package jetstream_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
	"github.com/gopipeline/pipeline/jetstream"
)

// TestDeletedConsumerFailsRun deletes the consumer (or its stream) under a running
// pipeline, idle or busy with a slow stage; the run used to return nil at once (idle)
// or not at all (busy), and must now fail with a ConsumerError naming both.
func TestDeletedConsumerFailsRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		busy         bool
		deleteStream bool
	}{
		{name: "idle"},
		{name: "busy", busy: true},
		{name: "idle stream deleted", deleteStream: true},
		{name: "busy stream deleted", busy: true, deleteStream: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			js, cons := newConsumer(t, 30*time.Second, 1000)
			n := 5
			if tc.busy {
				n = 2000 // far more than the pipeline and the source's buffer hold
			}
			publish(ctx, t, js, n)
			p := pipeline.New()
			src := jetstream.NewSource(cons, itemCodec{})
			var done atomic.Int64
			work := pipeline.Then(src.Stream(p), pipeline.NewStage("slow", 4, func(ctx context.Context, v item) (item, error) {
				if tc.busy { // each item takes a while: the source waits for room
					select {
					case <-time.After(50 * time.Millisecond):
					case <-ctx.Done():
						return v, ctx.Err()
					}
				}
				return v, nil
			}))
			pipeline.To(work, countItems(&done))
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second) // the failure guard
			defer cancel()
			errc := scenario.Start(rctx, p)
			if tc.busy {
				eventually(t, time.Minute, "the pipeline busy", func() bool { return done.Load() >= 8 })
			} else {
				eventually(t, time.Minute, "every item done", func() bool { return src.Stats().Acked == int64(n) })
			}
			deleted := time.Now()
			if tc.deleteStream {
				require.NoError(t, js.DeleteStream(ctx, "IN"))
			} else {
				require.NoError(t, js.DeleteConsumer(ctx, "IN", "work"))
			}
			err := <-errc
			require.Error(t, err)
			require.NotErrorIs(t, err, context.DeadlineExceeded, "the run did not notice")
			require.ErrorIs(t, err, natsjs.ErrConsumerDeleted)
			var ce *jetstream.ConsumerError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, "IN", ce.Stream)
			assert.Equal(t, "work", ce.Consumer)
			assert.Contains(t, err.Error(), `"work"`)
			assert.Contains(t, err.Error(), `"IN"`)
			if tc.busy {
				assert.Less(t, done.Load(), int64(n), "the run stopped before the backlog was done")
			}
			t.Logf("returned %v after the delete: %v; %+v", time.Since(deleted).Round(time.Millisecond), err, src.Stats())
		})
	}
}

// TestSlowStageNoRedelivery runs a stage slower than AckWait with the default pull
// size and a backlog larger than the pipeline holds: the messages waiting in the
// client's buffer got no InProgress and were redelivered; now every message is
// delivered once and acked once.
func TestSlowStageNoRedelivery(t *testing.T) {
	t.Parallel()
	const (
		n       = 40
		ackWait = time.Second
		workers = 8
	)
	ctx := t.Context()
	js, cons := newConsumer(t, ackWait, 1000)
	publish(ctx, t, js, n)
	p := pipeline.New()
	// The default pull size; InProgress more often than the default third of AckWait,
	// so that a machine slowed down by the race detector does not miss AckWait.
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithProgressEvery(ackWait/10))
	var done atomic.Int64
	var mu sync.Mutex
	seen := map[int]int{}
	work := pipeline.Then(src.Stream(p), pipeline.NewStage("slow", workers, func(ctx context.Context, v item) (item, error) {
		mu.Lock()
		seen[v.ID]++
		mu.Unlock()
		select { // the work of a slow stage: longer than AckWait
		case <-time.After(3 * ackWait / 2):
		case <-ctx.Done():
			return v, ctx.Err()
		}
		return v, nil
	}, pipeline.WithBuffer(4))) // the pipeline holds some 12 items: the rest wait for it
	pipeline.To(work, countItems(&done))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errc := scenario.Start(rctx, p)
	var redelivered int // the most the server counted at once
	eventually(t, time.Minute, "every item done", func() bool {
		c, err := js.Consumer(ctx, "IN", "work")
		require.NoError(t, err)
		ci, err := c.Info(ctx)
		require.NoError(t, err)
		redelivered = max(redelivered, ci.NumRedelivered)
		return done.Load() >= n
	})
	src.Stop()
	require.NoError(t, <-errc)
	st := src.Stats()
	t.Logf("%+v", st)
	assert.Zero(t, redelivered, "the server redelivered")
	assert.Zero(t, st.Redelivered, "the source saw redeliveries")
	assert.Equal(t, int64(n), st.Delivered)
	assert.Equal(t, int64(n), st.Acked, "every message acked once")
	assert.Equal(t, int64(n), done.Load())
	assert.Zero(t, st.NotProcessed+st.HandedBack+st.DeadLettered+st.AckErrors)
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		assert.Equal(t, 1, seen[i], "item %d worked", i)
	}
	eventually(t, time.Minute, "nothing unacknowledged", func() bool {
		pending, unacked := consumerState(ctx, t, js)
		return pending == 0 && unacked == 0
	})
}

// TestReaderAtItsBoundNoRedelivery runs a stage slower than delivery with a backlog,
// so that the reader keeps reaching its bound while the server has more to send: a
// client drained for room with its pull request still open lost what
// the server sent meanwhile, which the server delivered again at once (delivery count
// 2); now every message is delivered once.
func TestReaderAtItsBoundNoRedelivery(t *testing.T) {
	t.Parallel()
	const n = 5000
	ctx := t.Context()
	js, cons := newConsumer(t, time.Minute, 1000)
	publish(ctx, t, js, n)
	p := pipeline.New()
	src := jetstream.NewSource(cons, itemCodec{}) // the default pull size: 256, in requests of 128
	var done atomic.Int64
	work := pipeline.Then(src.Stream(p), pipeline.NewStage("slow", 8, func(_ context.Context, v item) (item, error) {
		time.Sleep(time.Millisecond) // the work: slower than the server delivers
		return v, nil
	}))
	pipeline.To(work, countItems(&done))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errc := scenario.Start(rctx, p)
	eventually(t, time.Minute, "every item done", func() bool { return done.Load() >= n })
	src.Stop()
	require.NoError(t, <-errc)
	st := src.Stats()
	assert.Zero(t, st.Redelivered, "the source saw redeliveries")
	assert.Equal(t, int64(n), st.Delivered)
	assert.Equal(t, int64(n), st.Acked, "every message acked once")
	ci, err := cons.Info(ctx)
	require.NoError(t, err)
	assert.Zero(t, ci.NumRedelivered, "the server redelivered")
}

// TestStreamReportsNumPendingAsLag holds every item at the sink: the source's row of
// the report shows the consumer's backlog, the messages not delivered yet as of the
// last delivery (labeled stream/consumer); released, it goes to 0; the final report
// and the reports between runs have none.
func TestStreamReportsNumPendingAsLag(t *testing.T) {
	t.Parallel()
	const n = 200
	ctx := t.Context()
	js, cons := newConsumer(t, time.Minute, 1000)
	publish(ctx, t, js, n)
	// The num_pending a delivery carries is the consumer's running count, which counts
	// a stored message once the stream has signalled it: wait until it counts all n.
	eventually(t, 30*time.Second, "the consumer to count every message", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == n
	})
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithPullSize(20), jetstream.WithMaxPending(10))
	gate := make(chan struct{})
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("held", 2, func(ctx context.Context, _ item) error {
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}))
	lag := func(rep pipeline.Report) []pipeline.PartitionLag {
		s, _ := rep.Stage("JetStream") // none before the run starts
		return s.Lag
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errc := scenario.Start(rctx, p)

	var held []pipeline.PartitionLag
	eventually(t, 30*time.Second, "the backlog behind the held items", func() bool {
		delivered := src.Stats().Delivered
		held = lag(p.Snapshot())
		return delivered > 0 && src.Stats().Delivered == delivered && // deliveries have stopped
			len(held) == 1 && held[0].Lag == n-delivered
	})
	assert.Equal(t, "IN/work", held[0].Partition)
	assert.Positive(t, held[0].Lag)
	close(gate)
	eventually(t, 30*time.Second, "no backlog once all are delivered", func() bool {
		l := lag(p.Snapshot())
		return len(l) == 1 && l[0].Lag == 0
	})
	src.Stop()
	require.NoError(t, <-errc)
	assert.Nil(t, lag(p.Report()), "the final report: no run")
}

// TestConsumerLostWhileIdleFailsRun restarts the server with an empty store under an
// idle run: its stream and consumer are gone, and no one tells the run's pull (the
// server that took it no longer exists). The run must find out by its check and fail
// with a ConsumerError, not wait for ever.
func TestConsumerLostWhileIdleFailsRun(t *testing.T) {
	t.Parallel()
	const n = 5
	ctx := t.Context()
	srv, admin, _ := newServerConsumer(t, 30*time.Second, 1000)
	publish(ctx, t, admin, n)
	_, js := connect(t, srv.url())
	cons, err := js.Consumer(ctx, "IN", "work")
	require.NoError(t, err)
	p := pipeline.New()
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithConsumerCheck(100*time.Millisecond))
	var done atomic.Int64
	pipeline.To(src.Stream(p), countItems(&done))
	rctx, cancel := context.WithTimeout(ctx, time.Minute) // the failure guard
	defer cancel()
	errc := scenario.Start(rctx, p)
	eventually(t, time.Minute, "every item done", func() bool { return src.Stats().Acked == n })
	srv.restartEmpty()
	err = <-errc
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the run did not notice")
	require.ErrorIs(t, err, natsjs.ErrConsumerDeleted)
	var ce *jetstream.ConsumerError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "work", ce.Consumer)
}

// panicCodec decodes items as itemCodec does, and panics on the item with id 1.
type panicCodec struct{ itemCodec }

func (c panicCodec) Unmarshal(data []byte, v *item) error {
	if err := c.itemCodec.Unmarshal(data, v); err != nil {
		return err
	}
	if v.ID == 1 {
		panic("codec: bad input")
	}
	return nil
}

// TestSourceCodecPanicHandsBackItsMessage runs a codec that panics: the run fails, and
// the message it was decoding is handed back (Nak), not held: it used to stay held, its
// InProgress signals going on from a goroutine left behind after Run returned.
func TestSourceCodecPanicHandsBackItsMessage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js, cons := newConsumer(t, 30*time.Second, 100)
	publish(ctx, t, js, 3)
	p := pipeline.New()
	src := jetstream.NewSource(cons, panicCodec{}, jetstream.WithPullSize(1))
	var done atomic.Int64
	pipeline.To(src.Stream(p), countItems(&done))
	err := p.Run(ctx)
	require.ErrorContains(t, err, "codec: bad input")
	st := src.Stats()
	assert.Equal(t, st.Delivered, st.Acked+st.NotProcessed, "every message delivered is settled: %+v", st)
	assert.Positive(t, st.NotProcessed, "the panicked message handed back")
	// The next run gets it at once, not after the 30 s AckWait of a message left held.
	q := pipeline.New()
	again := jetstream.NewSource(cons, itemCodec{})
	var got atomic.Int64
	pipeline.To(again.Stream(q), countThenStop(again, 1, &got, 3-st.Acked))
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, q.Run(rctx))
	assert.Positive(t, again.Stats().Redelivered, "the panicked message came back: %+v", again.Stats())
}

// TestSourceKeepsToConsumerRequestLimits runs a source over consumers that limit a pull
// request's batch (below the source's half of its pull size) or its expiry (below the
// client's 30 s): the server answered every request past them with a status the client
// does not pass on, and the run waited for ever with nothing delivered.
func TestSourceKeepsToConsumerRequestLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  natsjs.ConsumerConfig
	}{
		{"MaxRequestBatch", natsjs.ConsumerConfig{MaxRequestBatch: 4}},
		{"MaxRequestExpires", natsjs.ConsumerConfig{MaxRequestExpires: 5 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			js, _ := newConsumer(t, 30*time.Second, 1000)
			cfg := tc.cfg
			cfg.Durable, cfg.AckPolicy, cfg.MaxDeliver = "work", natsjs.AckExplicitPolicy, -1
			cons, err := js.CreateOrUpdateConsumer(ctx, "IN", cfg)
			require.NoError(t, err)
			const n = 20
			publish(ctx, t, js, n)
			p := pipeline.New()
			src := jetstream.NewSource(cons, itemCodec{})
			var done atomic.Int64
			pipeline.To(src.Stream(p), countThenStop(src, 1, &done, n))
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			require.NoError(t, p.Run(rctx))
			assert.Equal(t, int64(n), src.Stats().Acked)
		})
	}
}

// TestSourceDeadLetterIsPerConsumer sets aside one message of a stream from two
// consumers (two pipelines over the stream) to one dead-letter subject: each copy is
// stored. The copy's message id named the stream and sequence only, so the second was
// taken for a repeat, acknowledged, and lost.
func TestSourceDeadLetterIsPerConsumer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js, cons := newConsumer(t, 30*time.Second, 100)
	other, err := js.CreateOrUpdateConsumer(ctx, "IN", natsjs.ConsumerConfig{
		Durable: "audit", AckPolicy: natsjs.AckExplicitPolicy, MaxDeliver: -1,
	})
	require.NoError(t, err)
	publish(ctx, t, js, 1)
	for _, c := range []natsjs.Consumer{cons, other} {
		p := pipeline.New()
		src := jetstream.NewSource(c, itemCodec{}, jetstream.WithDeadLetterSubject(js, "dead"))
		errc := runRejecting(ctx, p, src, nil)
		eventually(t, 10*time.Second, "set aside", func() bool { return src.Stats().DeadLettered == 1 })
		src.Stop()
		require.NoError(t, <-errc)
	}
	assert.Equal(t, uint64(2), msgs(ctx, t, js, "DEAD"), "each consumer's dead letter stored")
}

// TestSourceDeadLetterRefusedIsHandedBackLater sets aside a message to a stream that
// refuses it (full, discarding new messages): the message is handed back with a delay
// (WithRedeliveryBackoff's), counted once in AckErrors, and neither terminated nor
// counted as not processed. It was handed back at once, so every stage took it again
// in a busy loop, and it counted in both.
func TestSourceDeadLetterRefusedIsHandedBackLater(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js, cons := newConsumer(t, 30*time.Second, 100)
	_, err := js.CreateStream(ctx, natsjs.StreamConfig{Name: "FULL", Subjects: []string{"full"}, MaxMsgs: 1, Discard: natsjs.DiscardNew})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "full", []byte("x"))
	require.NoError(t, err)
	publish(ctx, t, js, 1)
	p := pipeline.New()
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithDeadLetterSubject(js, "full"),
		jetstream.WithRedeliveryBackoff(func(int) time.Duration { return time.Hour }))
	var tries atomic.Int64
	errc := runRejecting(ctx, p, src, func() { tries.Add(1) })
	eventually(t, 10*time.Second, "the publish refused", func() bool { return src.Stats().AckErrors == 1 })
	src.Stop()
	require.NoError(t, <-errc)
	st := src.Stats()
	assert.Equal(t, int64(1), tries.Load(), "not redelivered within the hour's delay")
	assert.Zero(t, st.DeadLettered)
	assert.Zero(t, st.NotProcessed, "counted in AckErrors only")
	_, unacked := consumerState(ctx, t, js)
	assert.Equal(t, 1, unacked, "waiting for its redelivery, not terminated")
}

// TestSourceStopsWithoutWaitingForDoubleAcks commits items with WithDoubleAck while the
// server is down, and cancels the run: the acknowledgements made once the run is
// stopping do not wait for a confirmation (an hour each here: Run used to wait for
// every one of them, one after the other), and each settlement is counted.
func TestSourceStopsWithoutWaitingForDoubleAcks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, js, cons := newServerConsumer(t, 30*time.Second, 100)
	const n = 4
	publish(ctx, t, js, n)
	p := pipeline.New()
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithDoubleAck(), jetstream.WithAckTimeout(time.Hour))
	gate := make(chan struct{})
	var entered atomic.Int64
	pipeline.To(src.Stream(p), pipeline.NewSink("gated", n, func(context.Context, item) error {
		entered.Add(1)
		<-gate // commits once the run is canceled
		return nil
	}))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := scenario.Start(rctx, p)
	eventually(t, 30*time.Second, "every item in the sink", func() bool { return entered.Load() == n })
	srv.stop()
	cancel()
	close(gate)
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(time.Minute): // a guard against the hang, not a measure
		t.Fatal("Run waits for the DoubleAcks of a canceled run")
	}
	st := src.Stats()
	assert.Equal(t, int64(n), st.Acked+st.AckErrors+st.NotProcessed, "every settlement counted: %+v", st)
}

// TestSourceDeadLetterKeepsProgressWhilePublishing sets a message aside to a subject
// whose PubAck comes only after some AckWaits (a responder holds it, as a slow stream
// would): the message was released before the publish and got no InProgress meanwhile,
// and the server delivered it again while it was being set aside (a duplicate); now
// its signals go on until the copy is stored, and it is delivered once and terminated.
func TestSourceDeadLetterKeepsProgressWhilePublishing(t *testing.T) {
	t.Parallel()
	const ackWait = time.Second // as TestSlowStageNoRedelivery's: a loaded machine's pause stays well under it
	ctx := t.Context()
	srv, js, cons := newServerConsumer(t, ackWait, 100)
	publish(ctx, t, js, 1)
	rc, _ := connect(t, srv.url())
	asked := make(chan struct{}, 10)
	hold := make(chan struct{})
	answer := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(answer) // before the connection closes: the responder does not stay blocked
	_, err := rc.Subscribe("late", func(m *nats.Msg) {
		asked <- struct{}{}
		<-hold
		_ = m.Respond([]byte(`{"stream":"LATE","seq":1}`))
	})
	require.NoError(t, err)
	p := pipeline.New()
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithDeadLetterSubject(js, "late"),
		jetstream.WithAckTimeout(time.Minute), jetstream.WithProgressEvery(ackWait/10))
	errc := runRejecting(ctx, p, src, nil)
	select {
	case <-asked:
	case <-time.After(time.Minute): // a guard against the hang, not a measure
		t.Fatal("no dead letter published")
	}
	// Twenty signals, at least three quarters of a tenth of AckWait apart, span more
	// than AckWait; without them, the server delivers the message again.
	base := src.Stats().InProgress
	eventually(t, time.Minute, "signals past AckWait, or a redelivery", func() bool {
		st := src.Stats()
		return st.Delivered > 1 || st.InProgress >= base+20
	})
	require.Equal(t, int64(1), src.Stats().Delivered, "delivered again while it was being set aside: %+v", src.Stats())
	answer()
	eventually(t, 10*time.Second, "set aside", func() bool { return src.Stats().DeadLettered == 1 })
	src.Stop()
	require.NoError(t, <-errc)
	st := src.Stats()
	assert.Equal(t, int64(1), st.Delivered)
	assert.Zero(t, st.AckErrors)
	_, unacked := consumerState(ctx, t, js)
	assert.Zero(t, unacked, "terminated")
}
