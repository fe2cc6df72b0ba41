package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// feed is one run's reading of the consumer. Its readers take each message from their
// client as it arrives and keep it waiting for the run's body (next), held by the run's
// hand, which sends it InProgress signals like the messages the pipeline holds: no
// delivered message waits unseen in a client's buffer while its AckWait runs. The feed
// opens a client only while there is room for a batch, counting the messages asked of
// the clients still open and not yet arrived (owed), and asks it for exactly that room
// (StopAfter): the clients' pull requests never ask the server for more, and each ends
// by itself once its messages arrived, with no request left open. (A client drained
// with a request open loses what the server sends it meanwhile, which the server
// delivers again at once, counted as a second delivery:
// TestReaderAtItsBoundNoRedelivery.) So at most pull messages wait or are on their way.
//
// Two clients overlap: the next opens, with its own reader, as soon as the messages
// taken by the body leave room for a batch, while the one before still delivers the
// rest of its own. One client at a time stopped the flow at each client's end for the
// round trip of the next one's first pull, and asked for at most a batch at a time.
//
// Owed pulls: a client sends its next pull request from inside Next, when fewer
// messages are asked for than its threshold, but not while its previous request is
// still being sent. If that send is slow to return (a busy machine) while the answer
// arrives and is taken, the next request is owed and nothing sends it: Next would wait
// for a missed heartbeat, 30 s at the client's defaults. So every check interval the
// watcher kicks the readers: the context their Next waits on is cancelled and replaced,
// and each reader calls Next again with the new one, which sends what is owed. A kick
// costs a context per interval; nothing per message.
//
// The watcher checks, every check interval, that the consumer still exists: two
// answers in a row that it or its stream is not found end the feed with a
// [*ConsumerError], as does a terminal error of the client. A run busy with what it
// has has no pull waiting for the server to tell; an idle one's pull may have gone to
// a server that lost the consumer without a word (restarted with another store), and
// the missed heartbeat that would tell the client never fires, since the kicks restart
// Next before it could.
type feed struct {
	cons         natsjs.Consumer
	stream, name string
	h            *hand
	pull, batch  int
	expires      time.Duration // each request's expiry: the client's default (30 s), or the consumer's MaxRequestExpires if less
	check        time.Duration
	timeout      time.Duration                               // of a check
	delivery     func(meta *natsjs.MsgMetadata, newest bool) // newest: no delivery before it had a later consumer sequence
	nak          func(natsjs.Msg)
	// pullError counts an error the feed goes on after: a check that failed, or an
	// error the client's Next returned. Next returns few: a reconnect, its own pull
	// request's failure and a non-terminal status (409 Leadership Change, ...) never
	// come out of it, and a missed heartbeat only when no message or heartbeat came
	// for two heartbeats (a request's expiry) in one call, which the kicks cut short
	// unless the check interval is longer.
	pullError func()

	mu       sync.Mutex
	cond     sync.Cond // on mu: a message waits or was taken, a client ended, the feed stopped, the readers returned
	waiting  []waitingMsg
	its      []natsjs.MessagesContext // the open clients (at most two)
	owed     int                      // messages asked of the open clients and not yet arrived
	seq      uint64                   // the newest delivery's consumer sequence
	stopped  bool                     // the input ended: pull no more
	err      error                    // why the feed ended, if it failed
	readDone bool
	kick     []natsjs.NextOpt   // the options of the readers' Next: a context the watcher cancels (owed pulls)
	unkick   context.CancelFunc // cancels kick's context

	poke   chan struct{}      // a reader asks the watcher to check now
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
	f.wg.Go(f.open)
	f.wg.Go(f.watch)
}

// wait ends the watcher and waits for it and for the readers, which must be stopping.
func (f *feed) wait() {
	close(f.quit)
	f.cancel()
	f.wg.Wait()
	f.mu.Lock()
	f.unkick()
	f.mu.Unlock()
}

// stop ends the input: the readers drain their clients (handing back what they still
// deliver) and return. It does not wait.
func (f *feed) stop() {
	f.mu.Lock()
	f.stopped = true
	its := slices.Clone(f.its)
	f.cond.Broadcast()
	f.mu.Unlock()
	for _, it := range its {
		it.Drain()
	}
}

// fail ends the feed with err, unless the input ended already: what the clients still
// buffer is dropped (the server redelivers it, if it can), next returns err at once.
func (f *feed) fail(err error) {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	f.err, f.stopped = err, true
	its := slices.Clone(f.its)
	f.cond.Broadcast()
	f.mu.Unlock()
	for _, it := range its {
		it.Stop()
	}
}

// next returns the next waiting message, waiting for one, and whether the feed was
// stopped (the message is then to be handed back); false once the readers returned and
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

// rest returns what still waits, once the readers returned.
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

// open opens a client on the consumer whenever there is room for a batch (at most two
// at a time), asking for the room there is, and starts a reader on it; it returns once
// the feed stopped and every reader returned.
func (f *feed) open() {
	var readers sync.WaitGroup
	defer func() {
		readers.Wait()
		f.mu.Lock()
		f.readDone = true
		f.cond.Broadcast()
		f.mu.Unlock()
	}()
	for {
		f.mu.Lock()
		for !f.stopped && (len(f.its) == 2 || f.pull-len(f.waiting)-f.owed < f.batch) {
			f.cond.Wait()
		}
		if f.stopped {
			f.mu.Unlock()
			return
		}
		room := f.pull - len(f.waiting) - f.owed
		f.owed += room
		f.mu.Unlock()
		opts := []natsjs.PullMessagesOpt{natsjs.PullMaxMessages(f.batch), natsjs.StopAfter(room)}
		if f.expires > 0 && f.expires < 30*time.Second {
			opts = append(opts, natsjs.PullExpiry(f.expires))
		}
		it, err := f.cons.Messages(opts...)
		if err != nil {
			f.mu.Lock()
			f.owed -= room
			f.mu.Unlock()
			f.fail(fmt.Errorf("jetstream: consume: %w", err))
			return
		}
		f.mu.Lock()
		f.its = append(f.its, it)
		stopped := f.stopped
		f.mu.Unlock()
		if stopped { // stop found no client to drain
			it.Drain()
		}
		readers.Go(func() { f.read(it, room) })
	}
}

// read reads it, which ends by itself after room messages (or when the feed stops or
// fails), and takes it off the open clients.
func (f *feed) read(it natsjs.MessagesContext, room int) {
	taken := 0
	defer func() {
		f.mu.Lock()
		f.its = slices.DeleteFunc(f.its, func(c natsjs.MessagesContext) bool { return c == it })
		f.owed -= room - taken // what never arrived
		f.cond.Broadcast()
		f.mu.Unlock()
	}()
	f.mu.Lock()
	kick := f.kick
	f.mu.Unlock()
	for {
		msg, err := it.Next(kick...)
		if errors.Is(err, context.Canceled) { // kicked (owed pulls at feed)
			f.mu.Lock()
			kick = f.kick
			f.mu.Unlock()
			continue
		}
		if errors.Is(err, natsjs.ErrMsgIteratorClosed) {
			f.mu.Lock()
			stopped := f.stopped
			f.mu.Unlock()
			switch {
			case stopped:
			case errors.Is(err, natsjs.ErrConnectionClosed):
				f.fail(fmt.Errorf("jetstream: consume: %w", err))
			case taken >= room: // all it was asked for arrived
			default:
				f.fail(f.consumerError(err)) // closed by the client itself
			}
			return
		}
		if errors.Is(err, natsjs.ErrConsumerDeleted) || errors.Is(err, natsjs.ErrBadRequest) {
			f.fail(f.consumerError(err)) // the client stopped: it treats these as terminal
			return
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
			f.mu.Lock()
			f.owed--
			f.cond.Broadcast()
			f.mu.Unlock()
			continue
		}
		f.mu.Lock()
		// Under mu: the readers' deliveries count in turn, and the lag is the newest
		// delivery's (two clients' messages arrive interleaved).
		newest := meta.Sequence.Consumer > f.seq
		if newest {
			f.seq = meta.Sequence.Consumer
		}
		f.delivery(meta, newest)
		f.owed--
		if f.stopped { // delivered while stopping
			f.mu.Unlock()
			f.nak(msg)
			continue
		}
		f.waiting = append(f.waiting, waitingMsg{msg: msg, meta: meta, held: f.h.hold(msg)})
		kick = f.kick
		f.cond.Broadcast()
		f.mu.Unlock()
	}
}

// rearm gives the readers' Next a new context for the watcher to cancel, and cancels
// the one before (a kick).
func (f *feed) rearm() {
	ctx, cancel := context.WithCancel(context.Background())
	f.mu.Lock()
	if f.unkick != nil {
		f.unkick()
	}
	f.kick = []natsjs.NextOpt{natsjs.NextContext(ctx)}
	f.unkick = cancel
	f.mu.Unlock()
}

// watch kicks the readers every check interval, and checks, every check interval (or at
// once when a reader asks), that the consumer exists: it fails the feed once two
// answers in a row said that it or its stream is not found.
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
			f.rearm()
		}
		cctx, ccancel := context.WithTimeout(f.ctx, f.timeout)
		_, err := f.cons.Info(cctx)
		ccancel()
		if err != nil && f.ctx.Err() == nil { // not cut short by the run's end
			// The errors a run sees: the client's pull reports few (see pullError).
			f.pullError()
		}
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
