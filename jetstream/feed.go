package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// feed is one run's reading of the consumer. Its reader takes each message from the
// client as it arrives and keeps it waiting for the run's body (next), held by the
// run's hand, which sends it InProgress signals like the messages the pipeline holds:
// no delivered message waits unseen in the client's buffer while its AckWait runs. The
// reader opens a client only while there is room for a batch, and asks it for exactly
// the room there is (StopAfter): the client's pull requests never ask the server for
// more, and it ends by itself once that many arrived, with no request left open. (A
// client drained with a request open loses what the server sends it meanwhile, which
// the server delivers again at once, counted as a second delivery:
// TestReaderAtItsBoundNoRedelivery.) So at most pull messages wait.
//
// Owed pulls: the client sends its next pull request from inside Next, when fewer
// messages are asked for than its threshold, but not while its previous request is
// still being sent. If that send is slow to return (a busy machine) while the answer
// arrives and is taken, the next request is owed and nothing sends it: Next would wait
// for a missed heartbeat, 30 s at the client's defaults. So every check interval the
// watcher kicks the reader: the context its Next waits on is cancelled, and the reader
// calls Next again with a new one, which sends what is owed. A kick costs a context
// per interval; nothing per message.
//
// The watcher checks, every check interval while the run holds messages, that the
// consumer still exists (the server tells a pull that waits, not a run busy with what
// it has): two answers in a row that it or its stream is not found end the feed with a
// [*ConsumerError], as does a terminal error of the client.
type feed struct {
	cons         natsjs.Consumer
	stream, name string
	h            *hand
	pull, batch  int
	check        time.Duration
	timeout      time.Duration // of a check
	delivery     func(*natsjs.MsgMetadata)
	nak          func(natsjs.Msg)
	pullError    func()

	mu       sync.Mutex
	cond     sync.Cond // on mu: a message waits or was taken, the feed stopped, the reader returned
	waiting  []waitingMsg
	it       natsjs.MessagesContext // the reader's client, if any
	stopped  bool                   // the input ended: pull no more
	err      error                  // why the feed ended, if it failed
	readDone bool
	kick     []natsjs.NextOpt // the reader's: the options of its Next, waiting on a context the watcher cancels

	unkick context.CancelFunc // on mu: cancels kick, the context the reader's Next waits on (owed pulls)
	poke   chan struct{}      // the reader asks the watcher to check now
	quit   chan struct{}      // closed when the run's body returns
	cancel context.CancelFunc // of ctx, the watcher's checks: when the body returns
	ctx    context.Context
	wg     sync.WaitGroup
}

// waitingMsg is a message delivered to a run and not yet taken by its body.
type waitingMsg struct {
	msg  natsjs.Msg
	meta *natsjs.MsgMetadata
	held *heldMsg
}

func (f *feed) start() {
	f.rearm()
	f.wg.Go(f.read)
	f.wg.Go(f.watch)
}

// wait ends the watcher and waits for it and for the reader, which must be stopping.
func (f *feed) wait() {
	close(f.quit)
	f.cancel()
	f.wg.Wait()
	f.unkick()
}

// stop ends the input: the reader drains the client (handing back what it still
// delivers) and returns. It does not wait.
func (f *feed) stop() {
	f.mu.Lock()
	f.stopped = true
	it := f.it
	f.cond.Broadcast()
	f.mu.Unlock()
	if it != nil {
		it.Drain()
	}
}

// fail ends the feed with err, unless the input ended already: what the client still
// buffers is dropped (the server redelivers it, if it can), next returns err at once.
func (f *feed) fail(err error) {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	f.err, f.stopped = err, true
	it := f.it
	f.cond.Broadcast()
	f.mu.Unlock()
	if it != nil {
		it.Stop()
	}
}

// next returns the next waiting message, waiting for one, and whether the feed was
// stopped (the message is then to be handed back); false once the reader returned and
// nothing waits (with the feed's error, if it failed), or at once when it failed.
func (f *feed) next() (m waitingMsg, stopped, ok bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		if f.err != nil {
			return waitingMsg{}, false, false, f.err
		}
		if len(f.waiting) > 0 {
			m := f.waiting[0]
			f.waiting[0] = waitingMsg{}
			if len(f.waiting) == 1 {
				f.waiting = f.waiting[:0] // keep the array: no allocation per message when the body keeps up
			} else {
				f.waiting = f.waiting[1:]
			}
			f.cond.Broadcast() // room for the reader
			return m, f.stopped, true, nil
		}
		if f.readDone {
			return waitingMsg{}, false, false, nil
		}
		f.cond.Wait()
	}
}

// rest returns what still waits, once the reader returned.
func (f *feed) rest() []waitingMsg {
	f.mu.Lock()
	defer f.mu.Unlock()
	rest := f.waiting
	f.waiting = nil
	return rest
}

// consumerError is err about f's consumer.
func (f *feed) consumerError(err error) *ConsumerError {
	return &ConsumerError{Stream: f.stream, Consumer: f.name, Err: err}
}

// read opens a client on the consumer whenever there is room for a batch, asking for
// the room there is, and reads it until it ends.
func (f *feed) read() {
	defer func() {
		f.mu.Lock()
		f.readDone = true
		f.cond.Broadcast()
		f.mu.Unlock()
	}()
	for {
		f.mu.Lock()
		for !f.stopped && len(f.waiting) > f.pull-f.batch {
			f.cond.Wait()
		}
		if f.stopped {
			f.mu.Unlock()
			return
		}
		room := f.pull - len(f.waiting)
		f.mu.Unlock()
		it, err := f.cons.Messages(natsjs.PullMaxMessages(f.batch), natsjs.StopAfter(room))
		if err != nil {
			f.fail(fmt.Errorf("jetstream: consume: %w", err))
			return
		}
		f.mu.Lock()
		f.it = it
		stopped := f.stopped
		f.mu.Unlock()
		if stopped { // stop found no client to drain
			it.Drain()
		}
		if !f.readClient(it, room) {
			return
		}
	}
}

// readClient reads it, which ends by itself after room messages: true if it ended so
// and the reader goes on.
func (f *feed) readClient(it natsjs.MessagesContext, room int) bool {
	taken := 0
	for {
		msg, err := it.Next(f.kick...)
		if errors.Is(err, context.Canceled) { // kicked (owed pulls at feed)
			f.rearm()
			continue
		}
		if errors.Is(err, natsjs.ErrMsgIteratorClosed) {
			f.mu.Lock()
			f.it = nil
			stopped := f.stopped
			f.mu.Unlock()
			switch {
			case stopped:
				return false
			case errors.Is(err, natsjs.ErrConnectionClosed):
				f.fail(fmt.Errorf("jetstream: consume: %w", err))
				return false
			case taken >= room: // all it was asked for arrived
				return true
			}
			f.fail(f.consumerError(err)) // closed by the client itself
			return false
		}
		if errors.Is(err, natsjs.ErrConsumerDeleted) || errors.Is(err, natsjs.ErrBadRequest) {
			f.fail(f.consumerError(err)) // the client stopped: it treats these as terminal
			return false
		}
		if err != nil { // a missed heartbeat while the server restarts, ...: the client goes on
			f.pullError()
			select { // is the consumer still there?
			case f.poke <- struct{}{}:
			default:
			}
			continue
		}
		taken++
		meta, err := msg.Metadata()
		if err != nil { // not a JetStream message: nothing to acknowledge
			f.pullError()
			continue
		}
		f.delivery(meta)
		f.mu.Lock()
		if f.stopped { // delivered while stopping
			f.mu.Unlock()
			f.nak(msg)
			continue
		}
		f.waiting = append(f.waiting, waitingMsg{msg: msg, meta: meta, held: f.h.hold(msg)})
		f.cond.Broadcast()
		f.mu.Unlock()
	}
}

// rearm gives the reader's Next a new context for the watcher to cancel.
func (f *feed) rearm() {
	ctx, cancel := context.WithCancel(context.Background())
	f.kick = []natsjs.NextOpt{natsjs.NextContext(ctx)}
	f.mu.Lock()
	f.unkick = cancel
	f.mu.Unlock()
}

// watch checks, every check interval while the run holds messages (or at once when the
// reader asks), that the consumer exists, and fails the feed once two answers in a row
// said that it or its stream is not found.
func (f *feed) watch() {
	tick := time.NewTicker(f.check)
	defer tick.Stop()
	misses := 0
	for {
		select {
		case <-f.quit:
			return
		case <-f.poke:
		case <-tick.C:
			f.mu.Lock()
			f.unkick()
			f.mu.Unlock()
			if misses == 0 && f.h.idle() { // a pull waits: the server tells it
				continue
			}
		}
		cctx, ccancel := context.WithTimeout(f.ctx, f.timeout)
		_, err := f.cons.Info(cctx)
		ccancel()
		switch {
		case err == nil:
			misses = 0
		case errors.Is(err, natsjs.ErrConsumerNotFound), errors.Is(err, natsjs.ErrStreamNotFound):
			if misses++; misses >= 2 {
				f.fail(f.consumerError(fmt.Errorf("%w: %w", natsjs.ErrConsumerDeleted, err)))
				return
			}
		}
	}
}
