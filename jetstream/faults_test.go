package jetstream_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
	"github.com/gopipeline/pipeline/jetstream"
)

// consumerState returns the consumer's pending and unacknowledged counts.
func consumerState(ctx context.Context, t *testing.T, js natsjs.JetStream) (pending uint64, unacked int) {
	t.Helper()
	c, err := js.Consumer(ctx, "IN", "work")
	require.NoError(t, err)
	ci, err := c.Info(ctx)
	require.NoError(t, err)
	return ci.NumPending, ci.NumAckPending
}

// TestServerRestart restarts the server (same store, same port) while two pipelines
// share the work: they reconnect and finish, and OUT holds every message once.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	const n = 10_000
	ctx := t.Context()
	srv, admin, _ := newServerConsumer(t, 5*time.Second, 512)
	publish(ctx, t, admin, n)
	var worked atomic.Int64
	half := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	var srcs []*jetstream.Source[item]
	errs := make([]error, 2)
	for i := range 2 {
		_, js := connect(t, srv.url())
		cons, err := js.Consumer(ctx, "IN", "work")
		require.NoError(t, err)
		p, src := sharePipeline(cons, js, func() {
			if worked.Add(1) == n/4 {
				once.Do(func() { close(half) })
			}
		})
		srcs = append(srcs, src)
		wg.Go(func() { errs[i] = p.Run(ctx) })
	}
	<-half
	srv.restart()
	failures := 0
	for i := range n {
		if rejected(i) {
			failures++
		}
	}
	eventually(t, 3*time.Minute, "every message in OUT or DEAD after the restart", func() bool {
		return msgs(ctx, t, admin, "OUT") == uint64(n-failures) && msgs(ctx, t, admin, "DEAD") == uint64(failures)
	})
	for _, s := range srcs {
		s.Stop()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "pipeline %d", i)
	}
	ids := readIDs(ctx, t, admin, "OUT", n-failures, nil)
	for i := range n {
		if !rejected(i) {
			assert.Equal(t, 1, ids[i], "item %d in OUT", i)
		}
	}
	for i, s := range srcs {
		t.Logf("pipeline %d: %+v", i, s.Stats())
	}
}

// TestPullErrorsCountChecksThatFail stops the server under an idle run for some
// check intervals and starts it again: the checks that get no answer count in
// PullErrors (which counted only the errors the client's pull returned, and the client
// returned none: it deals with a reconnect by itself, and the missed heartbeat it
// would report never fires while the source's kicks restart its wait), and the run
// goes on after the restart.
func TestPullErrorsCountChecksThatFail(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, js, cons := newServerConsumer(t, 30*time.Second, 100)
	publish(ctx, t, js, 1)
	p := pipeline.New()
	// A check's timeout well above a loaded machine's round trip: no check fails while
	// the server is up; while it is down, they fail (a closed connection, or no answer).
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithConsumerCheck(50*time.Millisecond),
		jetstream.WithAckTimeout(time.Second))
	var done atomic.Int64
	pipeline.To(src.Stream(p), countItems(&done))
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // the failure guard
	defer cancel()
	errc := scenario.Start(rctx, p)
	eventually(t, 30*time.Second, "the first item", func() bool { return src.Stats().Acked == 1 })
	require.Zero(t, src.Stats().PullErrors, "no error while the server is up")
	srv.stop()
	eventually(t, 30*time.Second, "pull errors while the server is down", func() bool { return src.Stats().PullErrors > 0 })
	srv.start()
	eventually(t, time.Minute, "a message published after the restart", func() bool {
		_, err := js.Publish(ctx, "in.items", payload(1), natsjs.WithMsgID("after"))
		return err == nil
	})
	eventually(t, time.Minute, "the run goes on", func() bool { return src.Stats().Acked == 2 })
	src.Stop()
	require.NoError(t, <-errc)
	t.Logf("%+v", src.Stats())
}

// TestInProgress runs a stage slower than the consumer's AckWait: the source's
// InProgress signals keep the server from redelivering, with the default interval and
// with one near AckWait (0.8 of it: the signals used to come up to 1.5 intervals apart,
// past AckWait). Without them (a progress interval longer than the test), the server
// redelivers: the test can tell.
func TestInProgress(t *testing.T) {
	t.Parallel()
	const (
		n       = 8
		ackWait = 500 * time.Millisecond
	)
	for _, tc := range []struct {
		name     string
		opts     []jetstream.SourceOption
		redelive bool
	}{
		{name: "progress", redelive: false},
		{name: "progress near AckWait", opts: []jetstream.SourceOption{jetstream.WithProgressEvery(8 * ackWait / 10)}, redelive: false},
		{name: "no progress", opts: []jetstream.SourceOption{jetstream.WithProgressEvery(time.Hour)}, redelive: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			js, cons := newConsumer(t, ackWait, 100)
			publish(ctx, t, js, n)
			p := pipeline.New()
			src := jetstream.NewSource(cons, itemCodec{}, tc.opts...)
			var done atomic.Int64
			work := pipeline.Then(src.Stream(p), pipeline.NewStage("slow", n, func(ctx context.Context, v item) (item, error) {
				// The work of a slow stage: three AckWaits.
				select {
				case <-time.After(3 * ackWait):
				case <-ctx.Done():
					return v, ctx.Err()
				}
				return v, nil
			}))
			pipeline.To(work, countItems(&done))
			errc := scenario.Start(ctx, p)
			if tc.redelive {
				eventually(t, time.Minute, "a redelivery", func() bool { return src.Stats().Redelivered > 0 })
			} else {
				eventually(t, time.Minute, "every item done", func() bool { return src.Stats().Acked == n })
			}
			src.Stop()
			require.NoError(t, <-errc)
			st := src.Stats()
			t.Logf("%+v", st)
			if tc.redelive {
				assert.Positive(t, st.Redelivered)
				return
			}
			assert.Zero(t, st.Redelivered, "InProgress must hold the messages")
			assert.Positive(t, st.InProgress)
			assert.Equal(t, int64(n), done.Load())
		})
	}
}

// TestHandBack: a stage with WithHandBack hands back each item's first delivery with a
// transient error; the source naks it with the stage's backoff as delay, the server
// redelivers it, and the second delivery succeeds. A message the codec cannot decode
// goes to DEAD from the source itself.
func TestHandBack(t *testing.T) {
	t.Parallel()
	const n = 200
	ctx := t.Context()
	js, cons := newConsumer(t, 30*time.Second, 100)
	publish(ctx, t, js, n)
	_, err := js.Publish(ctx, "in.short", []byte{1, 2})
	require.NoError(t, err)
	p := pipeline.New()
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithDeadLetterSubject(js, "dead"))
	var mu sync.Mutex
	seen := map[int]int{}
	work := pipeline.Then(src.Stream(p), pipeline.NewStage("flaky", 4, func(_ context.Context, v item) (item, error) {
		mu.Lock()
		seen[v.ID]++
		first := seen[v.ID] == 1
		mu.Unlock()
		if first {
			return v, pipeline.Transient(errors.New("busy"))
		}
		return v, nil
	}, pipeline.WithHandBack(), pipeline.WithRetry(1, pipeline.ConstantBackoff(20*time.Millisecond))))
	pipeline.ToBatches(work, 16, jetstream.NewSink("out", 2, js, "out", itemCodec{}, func(v item) string { return strconv.Itoa(v.ID) }),
		pipeline.WithLinger(5*time.Millisecond))
	errc := scenario.Start(ctx, p)
	eventually(t, time.Minute, "every item in OUT", func() bool { return msgs(ctx, t, js, "OUT") == n && msgs(ctx, t, js, "DEAD") == 1 })
	src.Stop()
	require.NoError(t, <-errc)
	st := src.Stats()
	t.Logf("%+v", st)
	assert.Equal(t, int64(n), st.HandedBack)
	assert.Equal(t, int64(n), st.Redelivered)
	assert.Equal(t, int64(n), st.Acked)
	assert.Equal(t, int64(1), st.Undecodable)
	assert.Equal(t, int64(1), st.DeadLettered)
	row := p.Report().Stages[1]
	assert.Equal(t, "flaky", row.Name)
	assert.Equal(t, int64(n), row.DeadLettered, "a handed-back item counts as set aside")
	readIDs(ctx, t, js, "DEAD", 1, func(m natsjs.Msg) {
		assert.Equal(t, "JetStream", m.Headers().Get(jetstream.HeaderStage))
		assert.Equal(t, "in.short", m.Headers().Get(jetstream.HeaderSubject))
	})
}

// TestHandBackKeepsItsDelayUnderProgress hands back every item with a delay of an hour
// while InProgress signals go out every millisecond: a signal taken for a message just
// before its release, and written to the connection after its NakWithDelay (the
// client's check that a message is settled came first), reset the delay to AckWait,
// and the server delivered the message again after AckWait (a few of the n, run after
// run). A message fetched once every signal reached the server times AckWait: the
// consumer must deliver it again before any message handed back.
//
// Not parallel: its flow of signals (under the race detector) slowed the timed tests
// running beside it enough that the server redelivered their messages.
func TestHandBackKeepsItsDelayUnderProgress(t *testing.T) {
	const (
		n       = 8000
		ackWait = 2 * time.Second
	)
	ctx := t.Context()
	js, cons := newConsumer(t, ackWait, n+1) // every message stays unacknowledged
	publish(ctx, t, js, n)
	p := pipeline.New()
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithProgressEvery(time.Millisecond),
		jetstream.WithRedeliveryBackoff(func(int) time.Duration { return time.Hour }))
	work := pipeline.Then(src.Stream(p), pipeline.NewStage("busy", 8, func(_ context.Context, v item) (item, error) {
		return v, pipeline.Transient(errors.New("busy"))
	}, pipeline.WithHandBack()))
	var done atomic.Int64
	pipeline.To(work, countItems(&done))
	errc := scenario.Start(ctx, p)
	eventually(t, time.Minute, "every item handed back", func() bool { return src.Stats().HandedBack >= n })
	src.Stop()
	require.NoError(t, <-errc)            // the source's signals have all been sent
	require.NoError(t, js.Conn().Flush()) // and the server has them
	t.Logf("%+v", src.Stats())
	assert.Zero(t, src.Stats().Redelivered, "a message handed back for an hour came again during the run")
	_, err := js.Publish(ctx, "in.items", payload(n))
	require.NoError(t, err)
	next := func(wait time.Duration) (int, uint64) {
		t.Helper()
		batch, err := cons.Fetch(1, natsjs.FetchMaxWait(wait))
		require.NoError(t, err)
		var got []natsjs.Msg
		for m := range batch.Messages() {
			got = append(got, m)
		}
		require.NoError(t, batch.Error())
		require.Len(t, got, 1, "a message within %v", wait)
		var v item
		require.NoError(t, itemCodec{}.Unmarshal(got[0].Data(), &v))
		meta, err := got[0].Metadata()
		require.NoError(t, err)
		return v.ID, meta.NumDelivered
	}
	id, deliveries := next(10 * time.Second) // the clock starts: not acknowledged
	require.Equal(t, n, id, "the new message first, not a handed-back one (delivered %d times)", deliveries)
	var early []int // handed back for an hour, and delivered again after AckWait
	for {
		id, deliveries = next(time.Minute)
		if id == n {
			break
		}
		early = append(early, id)
	}
	assert.Empty(t, early, "messages handed back for an hour came again after AckWait")
	assert.Equal(t, uint64(2), deliveries)
}

// TestShutdown stops the source while items are in the stage: the source stops
// pulling and hands back what it buffered, the items in flight finish and are acked,
// and Run returns nil; a canceled run naks its items at once instead of letting them
// wait for AckWait. Either way the consumer is left with nothing unacknowledged.
func TestShutdown(t *testing.T) {
	t.Parallel()
	for _, cancelRun := range []bool{false, true} {
		t.Run("cancel="+strconv.FormatBool(cancelRun), func(t *testing.T) {
			t.Parallel()
			const n = 1000
			ctx := t.Context()
			js, cons := newConsumer(t, time.Hour, 500)
			publish(ctx, t, js, n)
			p := pipeline.New()
			src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithPullSize(50))
			gate := make(chan struct{})
			var entered, committed atomic.Int64
			work := pipeline.Then(src.Stream(p), pipeline.NewStage("gated", 4, func(ctx context.Context, v item) (item, error) {
				entered.Add(1)
				select {
				case <-gate:
				case <-ctx.Done():
					return v, ctx.Err()
				}
				return v, nil
			}))
			pipeline.To(work, countItems(&committed))
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			errc := scenario.Start(rctx, p)
			eventually(t, time.Minute, "four items in the stage", func() bool { return entered.Load() == 4 })
			if cancelRun {
				cancel()
				require.ErrorIs(t, <-errc, context.Canceled)
			} else {
				src.Stop()
				close(gate)
				require.NoError(t, <-errc)
			}
			st := src.Stats()
			t.Logf("%+v", st)
			assert.Equal(t, st.Delivered, st.Acked+st.NotProcessed, "every delivery settled")
			assert.Equal(t, committed.Load(), st.Acked)
			if cancelRun {
				assert.Zero(t, st.Acked)
			} else {
				assert.GreaterOrEqual(t, st.Acked, int64(4), "the items in flight finished")
			}
			// Nothing is lost: a second run takes every message the first did not commit
			// at once, without waiting for an AckWait (an hour).
			q := pipeline.New()
			again := jetstream.NewSource(cons, itemCodec{})
			pipeline.To(again.Stream(q), countThenStop(again, 2, &committed, n))
			qctx, qcancel := context.WithTimeout(ctx, time.Minute)
			defer qcancel()
			require.NoError(t, q.Run(qctx))
			assert.Equal(t, int64(n), committed.Load())
			eventually(t, time.Minute, "nothing unacknowledged", func() bool {
				pending, unacked := consumerState(ctx, t, js)
				return pending == 0 && unacked == 0
			})
		})
	}
}
