package jetstream_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/jetstream"
)

const childEnv = "JETSTREAM_TEST_CHILD_URL"

var (
	shareRuns    atomic.Int64 // TestShareWork's runs in this process
	errShort     = errors.New("short message")
	errPermanent = errors.New("item rejected")
)

// rejected tells which items the work stage fails for good: they must end up in DEAD.
func rejected(id int) bool { return id%997 == 0 }

// sharePipeline is the pipeline every process of the scale-out test runs: the source,
// a work stage that dead-letters the rejected items, and a sink that publishes to OUT
// in batches, with the item's id as Nats-Msg-Id. worked is called after each item the
// work stage finished.
func sharePipeline(cons natsjs.Consumer, js natsjs.JetStream, worked func()) (*pipeline.Pipeline, *jetstream.Source[item]) {
	p := pipeline.New()
	src := jetstream.NewSource(cons, itemCodec{}, jetstream.WithDeadLetterSubject(js, "dead"), jetstream.WithPullSize(128))
	work := pipeline.Then(src.Stream(p), pipeline.NewStage("work", 4, func(_ context.Context, v item) (item, error) {
		defer worked()
		if rejected(v.ID) {
			return v, pipeline.Permanent(fmt.Errorf("item %d: %w", v.ID, errPermanent))
		}
		return v, nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[item])))
	pipeline.ToBatches(work, 64, jetstream.NewSink("out", 2, js, "out", itemCodec{}, func(v item) string { return strconv.Itoa(v.ID) },
		pipeline.WithRetry(20, pipeline.ExponentialBackoff(10*time.Millisecond, 200*time.Millisecond))),
		pipeline.WithLinger(5*time.Millisecond))
	return p, src
}

// runChild is the child process of TestShareWork: it runs sharePipeline against the
// server at the URL in childEnv, prints "ready" once it has worked 500 items, and goes
// on until it is killed.
func runChild() int {
	nc, err := nats.Connect(os.Getenv(childEnv), nats.MaxReconnects(-1))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	cons, err := js.Consumer(ctx, "IN", "work")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var n atomic.Int64
	p, _ := sharePipeline(cons, js, func() {
		if n.Add(1) == 500 {
			fmt.Println("ready")
		}
	})
	if err := p.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestShareWork runs three pipelines on one durable consumer: A in this process on a
// connection that is closed mid-run, B in a child process killed with SIGKILL, and C,
// which finishes the work. Every message must end up once in OUT (the sink publishes
// with its id as Nats-Msg-Id) or, for the rejected ones, once in DEAD with its
// headers; the messages A and B held unacknowledged are redelivered, and counted so.
// 100,000 messages; under the race detector, which makes it some 13 s, 100,000 the
// first time in the process and 20,000 when -count or -cpu repeats it.
func TestShareWork(t *testing.T) {
	n := 100_000
	if raceEnabled && shareRuns.Add(1) > 1 {
		n = 20_000
	}
	ctx := t.Context()
	srv, admin, _ := newServerConsumer(t, 2*time.Second, 1024)
	publish(ctx, t, admin, n)
	failures := 0
	for i := range n {
		if rejected(i) {
			failures++
		}
	}

	// B: the child process, killed once it has worked 500 items.
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+srv.url())
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	child.Stderr = os.Stderr
	require.NoError(t, child.Start())
	childDone := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) == "ready" {
			err = child.Process.Signal(syscall.SIGKILL)
		} else if err == nil {
			err = fmt.Errorf("child said %q", line)
		}
		childDone <- errors.Join(err, ignoreKilled(child.Wait()))
	}()

	// A: cut off once it has worked 1000 items.
	ncA, jsA := connect(t, srv.url())
	consA, err := jsA.Consumer(ctx, "IN", "work")
	require.NoError(t, err)
	var workedA atomic.Int64
	cut := make(chan struct{})
	pA, srcA := sharePipeline(consA, jsA, func() {
		if workedA.Add(1) == 1000 {
			close(cut)
		}
	})
	// C: the survivor.
	_, jsC := connect(t, srv.url())
	consC, err := jsC.Consumer(ctx, "IN", "work")
	require.NoError(t, err)
	pC, srcC := sharePipeline(consC, jsC, func() {})

	var wg sync.WaitGroup
	var errA, errC error
	wg.Go(func() { errA = pA.Run(ctx) })
	wg.Go(func() { errC = pC.Run(ctx) })
	wg.Go(func() {
		select {
		case <-cut:
			ncA.Close() // no ack of A's gets out from now on
		case <-ctx.Done():
		}
	})
	require.NoError(t, <-childDone, "the child process")
	eventually(t, 5*time.Minute, "every message in OUT or DEAD", func() bool {
		return msgs(ctx, t, admin, "OUT") == uint64(n-failures) && msgs(ctx, t, admin, "DEAD") == uint64(failures)
	})
	srcC.Stop()
	wg.Wait()
	require.Error(t, errA, "A's connection was closed under it")
	require.NoError(t, errC)
	// The work is done: nothing is left pending or unacknowledged.
	eventually(t, time.Minute, "the consumer to have nothing pending", func() bool {
		info, err := admin.Consumer(ctx, "IN", "work")
		require.NoError(t, err)
		ci, err := info.Info(ctx)
		require.NoError(t, err)
		return ci.NumPending == 0 && ci.NumAckPending == 0
	})

	ids := readIDs(ctx, t, admin, "OUT", n-failures, nil)
	dead := readIDs(ctx, t, admin, "DEAD", failures, func(m natsjs.Msg) {
		h := m.Headers()
		assert.Equal(t, "work", h.Get(jetstream.HeaderStage))
		assert.Equal(t, "item", h.Get(jetstream.HeaderClass))
		assert.Equal(t, "1", h.Get(jetstream.HeaderAttempts))
		assert.Equal(t, "in.items", h.Get(jetstream.HeaderSubject))
		assert.Equal(t, "IN", h.Get(jetstream.HeaderStream))
		assert.Contains(t, h.Get(jetstream.HeaderError), errPermanent.Error())
		assert.NotEmpty(t, h.Get(jetstream.HeaderErrType))
		seq, err := strconv.ParseUint(h.Get(jetstream.HeaderSequence), 10, 64)
		if assert.NoError(t, err) {
			assert.Positive(t, seq)
		}
		d, err := strconv.Atoi(h.Get(jetstream.HeaderDeliveries))
		if assert.NoError(t, err) {
			assert.Positive(t, d)
		}
	})
	for i := range n {
		if rejected(i) {
			assert.Equal(t, 1, dead[i], "item %d in DEAD", i)
			assert.Zero(t, ids[i], "item %d in OUT", i)
		} else {
			assert.Equal(t, 1, ids[i], "item %d in OUT", i)
		}
	}
	a, c := srcA.Stats(), srcC.Stats()
	t.Logf("A: %+v", a)
	t.Logf("C: %+v", c)
	assert.Positive(t, c.Redelivered, "C redid what A and B held")
	assert.Positive(t, a.Delivered)
	assert.GreaterOrEqual(t, c.Delivered+a.Delivered, int64(n-1500), "A and C together did about all the work, B some")
}

func ignoreKilled(err error) error {
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return nil
		}
	}
	return err
}

// readIDs reads want messages of stream with an ordered consumer and counts them by
// item id; check, if not nil, sees each message.
func readIDs(ctx context.Context, t *testing.T, js natsjs.JetStream, stream string, want int, check func(natsjs.Msg)) map[int]int {
	t.Helper()
	oc, err := js.OrderedConsumer(ctx, stream, natsjs.OrderedConsumerConfig{})
	require.NoError(t, err)
	ids := make(map[int]int, want)
	for len(ids) < want {
		batch, err := oc.Fetch(min(want-len(ids), 1000), natsjs.FetchMaxWait(10*time.Second))
		require.NoError(t, err)
		got := 0
		for m := range batch.Messages() {
			v := item{ID: -1} // a message the codec cannot decode
			_ = itemCodec{}.Unmarshal(m.Data(), &v)
			ids[v.ID]++
			got++
			if check != nil {
				check(m)
			}
		}
		require.NoError(t, batch.Error())
		require.Positive(t, got, "%s holds fewer than %d messages", stream, want)
	}
	return ids
}
