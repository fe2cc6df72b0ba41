package jetstream

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/gopipeline/pipeline"
)

// Headers of a dead-letter message ([WithDeadLetterSubject]). Its data is the original
// message's data.
const (
	HeaderStage      = "Pipeline-Stage"       // the stage that set the item aside
	HeaderClass      = "Pipeline-Class"       // its error class: "item", "transient", ...
	HeaderErrType    = "Pipeline-Error-Type"  // the Go type of the last error
	HeaderError      = "Pipeline-Error"       // the last error's message
	HeaderFirstError = "Pipeline-First-Error" // the first attempt's error message
	HeaderAttempts   = "Pipeline-Attempts"    // attempts made, in decimal
	HeaderSubject    = "Pipeline-Subject"     // the original message's subject
	HeaderStream     = "Pipeline-Stream"      // the original message's stream
	HeaderSequence   = "Pipeline-Sequence"    // its stream sequence, in decimal
	HeaderDeliveries = "Pipeline-Deliveries"  // how many times it was delivered, in decimal
	HeaderTime       = "Pipeline-Time"        // when it was set aside, RFC 3339 with nanoseconds
)

// ConsumerError is the error with which a run fails when its consumer can no longer
// deliver messages: it was deleted, or its stream was, or the client ended the pull
// with another error it treats as terminal. Err is that error: for a consumer that is
// gone, it wraps [natsjs.ErrConsumerDeleted] (whether the server said so to the pull or
// the source's check found it missing, then with [natsjs.ErrConsumerNotFound] or
// [natsjs.ErrStreamNotFound] too); otherwise it is the client's error, such as
// [natsjs.ErrBadRequest].
type ConsumerError struct {
	Stream   string // the consumer's stream
	Consumer string // the consumer's name
	Err      error
}

func (e *ConsumerError) Error() string {
	return fmt.Sprintf("jetstream: consumer %q of stream %q: %v", e.Consumer, e.Stream, e.Err)
}

// Unwrap returns Err.
func (e *ConsumerError) Unwrap() error { return e.Err }

// SourceOption configures a [Source]: [NewSource].
type SourceOption interface{ sourceOption(*sourceConfig) }

type sourceOpt func(*sourceConfig)

func (f sourceOpt) sourceOption(c *sourceConfig) { f(c) }

type sourceConfig struct {
	name       string
	pull       int
	maxPending int
	doubleAck  bool
	dlJS       natsjs.JetStream
	dlSubject  string
	progress   time.Duration
	check      time.Duration
	ackTimeout time.Duration
	backoff    pipeline.Backoff
	// The consumer's limits on a pull request (0: none), which the client's requests
	// must keep to: the server answers one past them with a status the client does not
	// pass on, and no message comes.
	maxBatch   int
	maxExpires time.Duration
}

// WithName names the source's row in the pipeline's report ("JetStream" by default).
// It panics if name is empty.
func WithName(name string) SourceOption {
	if name == "" {
		panic(`jetstream: WithName(""): empty name`)
	}
	return sourceOpt(func(c *sourceConfig) { c.name = name })
}

// WithPullSize bounds the messages a run has taken from the consumer and the pipeline
// has not taken yet: the client asks the server for half of n at a time
// ([natsjs.PullMaxMessages], at least 1, at most the consumer's MaxRequestBatch; each request expires within its MaxRequestExpires), and the source asks for more only while the
// messages waiting for the pipeline and those asked for and still to come leave room
// for a whole request (so that the next request is under way before the last one's
// messages are all taken); the default is 256, or the consumer's max ack pending when
// that is smaller. A waiting message gets InProgress signals ([WithProgressEvery]) like
// the messages the pipeline holds, so a slow pipeline does not cause redeliveries; it
// is not offered to other processes that share the consumer meanwhile. After a
// reconnect or a missed heartbeat each open client (at most two) asks again without
// knowing whether its last request still stands, so one more request per client (half
// of n each) may come; what comes past the client's bound is dropped by the client,
// unseen by the source, and those messages are redelivered after AckWait (counted in
// Stats.Redelivered), not at once. It panics if n < 1.
func WithPullSize(n int) SourceOption {
	if n < 1 {
		panic(fmt.Sprintf("jetstream: WithPullSize(%d): need at least 1", n))
	}
	return sourceOpt(func(c *sourceConfig) { c.pull = n })
}

// WithMaxPending bounds the messages the pipeline holds unsettled ([pipeline.WithMaxPending]);
// the default is the consumer's max ack pending (1000 when the consumer has no limit).
// It panics if n < 1.
func WithMaxPending(n int) SourceOption {
	if n < 1 {
		panic(fmt.Sprintf("jetstream: WithMaxPending(%d): need at least 1", n))
	}
	return sourceOpt(func(c *sourceConfig) { c.maxPending = n })
}

// WithDoubleAck acknowledges a committed message with DoubleAck, which waits for the
// server to confirm the acknowledgement (in the goroutine where the item settled: a
// sink worker), instead of Ack, which only sends it. It costs a round trip per message.
// Once the run is stopping (canceled, or failed), a committed message is acknowledged
// with Ack: with the server unreachable, a wait of [WithAckTimeout] per message, one
// after the other in each sink worker, kept Run from returning for minutes.
func WithDoubleAck() SourceOption {
	return sourceOpt(func(c *sourceConfig) { c.doubleAck = true })
}

// WithDeadLetterSubject publishes each dead-lettered message to subject through js (a
// subject of a stream, so that the publish is acknowledged), with the original data
// and the Header* headers, and terminates the original ([natsjs.Msg.Term]) only after
// the stream acknowledged the copy. The copy's Nats-Msg-Id is derived from the
// original's stream, consumer and sequence, so that a message this consumer sets aside
// again after a redelivery is not stored twice (and one that two consumers of a stream
// set aside is stored for each). If the publish fails, the original is handed back
// instead (NakWithDelay: [WithRedeliveryBackoff]'s delay, or else [WithAckTimeout]'s),
// to be set aside on a later delivery; that counts in Stats.AckErrors. Without this option, a dead-lettered message is
// terminated once the stage's own dead-letter destination ([pipeline.WithDeadLetter])
// took the item. It panics if js is nil or subject empty.
func WithDeadLetterSubject(js natsjs.JetStream, subject string) SourceOption {
	if js == nil || subject == "" {
		panic("jetstream: WithDeadLetterSubject needs a JetStream and a subject")
	}
	return sourceOpt(func(c *sourceConfig) { c.dlJS, c.dlSubject = js, subject })
}

// WithProgressEvery sets how often a message the pipeline holds gets an InProgress
// signal, which restarts the server's AckWait timer: at most d after its delivery or its
// last signal (and at least three quarters of d); the default is a third of the
// consumer's AckWait. It panics if d <= 0.
func WithProgressEvery(d time.Duration) SourceOption {
	if d <= 0 {
		panic(fmt.Sprintf("jetstream: WithProgressEvery(%v): need a positive interval", d))
	}
	return sourceOpt(func(c *sourceConfig) { c.progress = d })
}

// WithConsumerCheck sets how often a run asks the server whether its consumer still
// exists (consumer info: one request per interval); the default is 1 s. The server
// tells a pull that waits when its consumer is deleted, but a busy run has no pull
// waiting, and a server restarted with another store (the consumer lost) tells no one.
// Two answers in a row that the consumer or its stream is not found fail the run with
// a [*ConsumerError]; an answer that does not come in time ([WithAckTimeout]) or
// another error (a server restarting) counts as neither. Every check that fails (the
// first not found included) counts in [Stats].PullErrors. A run also checks at once
// when the client reports an error it goes on after. The interval also bounds how long
// a run waits for a pull request the client owes (one it skipped while sending the one
// before). It panics if d <= 0.
func WithConsumerCheck(d time.Duration) SourceOption {
	if d <= 0 {
		panic(fmt.Sprintf("jetstream: WithConsumerCheck(%v): need a positive interval", d))
	}
	return sourceOpt(func(c *sourceConfig) { c.check = d })
}

// WithAckTimeout bounds the waits of a settlement that needs a reply (DoubleAck, and
// publishing a dead letter) and of a check that the consumer still exists
// ([WithConsumerCheck]). The default is 5 s. It panics if d <= 0.
func WithAckTimeout(d time.Duration) SourceOption {
	if d <= 0 {
		panic(fmt.Sprintf("jetstream: WithAckTimeout(%v): need a positive timeout", d))
	}
	return sourceOpt(func(c *sourceConfig) { c.ackTimeout = d })
}

// WithRedeliveryBackoff sets the delay of a handed-back message ([pipeline.WithHandBack])
// from how many times it was delivered: NakWithDelay(b(deliveries)). Without it, the
// delay is the stage's own backoff for its attempts ([pipeline.Settlement].Delay).
// It panics if b is nil.
func WithRedeliveryBackoff(b pipeline.Backoff) SourceOption {
	if b == nil {
		panic("jetstream: WithRedeliveryBackoff(nil)")
	}
	return sourceOpt(func(c *sourceConfig) { c.backoff = b })
}

// Stats counts what a [Source] did, over all its runs.
type Stats struct {
	Delivered    int64 // messages taken from the consumer
	Redelivered  int64 // of them, deliveries after the first (the server's delivery count > 1)
	Acked        int64 // committed: Ack (or DoubleAck) sent
	HandedBack   int64 // handed back by a stage: NakWithDelay sent
	NotProcessed int64 // the run stopped first, or the message arrived while stopping: Nak sent
	DeadLettered int64 // set aside (published to the dead-letter subject, if any), then Term sent
	Undecodable  int64 // of DeadLettered, messages the codec could not decode (never emitted)
	InProgress   int64 // InProgress signals sent
	AckErrors    int64 // settlements that could not be sent, counted here only (the server redelivers the message)
	PullErrors   int64 // errors the source went on after: failed consumer checks, and the few pull errors the client reports ([Source])
}

// Counters returns the counts as a map named in the server's terms, for a view that
// shows a connector's counters on its row, such as the dashboard's WithRowStats:
//
//	h.Add("orders", p, dashboard.WithRowStats("JetStream", func() map[string]int64 {
//		return src.Stats().Counters()
//	}))
//
// "delivered", "redelivered", "acked", "nak delay" (HandedBack), "nak" (NotProcessed)
// and "term" (DeadLettered) are always there; "undecodable", "in progress", "ack
// errors" and "pull errors" only when not 0. It makes a new map on each call.
func (st Stats) Counters() map[string]int64 {
	m := map[string]int64{
		"delivered": st.Delivered, "redelivered": st.Redelivered, "acked": st.Acked,
		"nak delay": st.HandedBack, "nak": st.NotProcessed, "term": st.DeadLettered,
	}
	for k, v := range map[string]int64{
		"undecodable": st.Undecodable, "in progress": st.InProgress,
		"ack errors": st.AckErrors, "pull errors": st.PullErrors,
	} {
		if v != 0 {
			m[k] = v
		}
	}
	return m
}

// Source reads a durable pull consumer as the acknowledged source of a pipeline
// ([pipeline.FromAcked]): one item per message, decoded by a codec, and one
// acknowledgement per message when its item's fate is known:
//
//	committed      Ack (DoubleAck with WithDoubleAck)
//	handed back    NakWithDelay: the stage's backoff, or WithRedeliveryBackoff
//	dead-lettered  published to WithDeadLetterSubject with headers, then, after the
//	               stream's PubAck, Term
//	not processed  Nak: another consumer process takes it at once
//
// A message the codec cannot decode is dead-lettered at once (stage: the source's name,
// class: item). Every message a run has taken from the consumer and not settled, in
// the pipeline or waiting for it, or with its dead-letter copy being published, gets
// an InProgress signal every [WithProgressEvery] (none once its acknowledgement is sent),
// so the server does not redeliver it however slow the pipeline is: only a message
// the client received and the source has not yet taken (some microseconds, or while the
// source drains the client to stop) goes without, and a process that stops sending
// them (a crash, a lost connection) has its messages redelivered after AckWait.
//
// Backpressure: the pipeline holds at most [WithMaxPending] unsettled messages (by
// default the consumer's MaxAckPending), and at most [WithPullSize] more wait for it;
// the source asks the server for more only when there is room for them. The server
// never has more than MaxAckPending unacknowledged messages out to all processes
// together, so several processes share the work in proportion to how fast each
// settles it.
//
// Order: two pull requests are under way at once (so that the flow does not stop
// between them), and the server serves them in turn, so the items come in about stream
// order, not exactly: within the pull size, besides redeliveries. With WithPullSize(1)
// one message is asked for at a time, in stream order.
//
// A consumer that is deleted, or whose stream is, fails the run with a
// [*ConsumerError] (errors.Is natsjs.ErrConsumerDeleted): at once when a pull of the
// run waits (the server tells it), otherwise within two [WithConsumerCheck] intervals
// (2 s by default), busy or idle. So does an error the client treats as ending the
// pull (natsjs.ErrBadRequest). The run fails when the source next has
// control: at once if it waits for messages, or when the pipeline next takes an item
// from it; a pipeline whose first stage stays full (every worker stuck) holds the
// source until then, as it would hold a cancellation of the run (the run's context
// ends that wait). Other errors are counted in [Stats].PullErrors and the run goes on:
// a consumer check that fails (no answer within [WithAckTimeout] while the server
// restarts or is unreachable, ...), and an error the client's pull reports. The client
// reports few: a reconnect, a pull request it could not send and a non-terminal status
// of the server (a leadership change, ...) never come out of it, and a missed
// heartbeat only when nothing came for a pull request's expiry (30 s, or the
// consumer's MaxRequestExpires if less) in one wait, which the source cuts short every
// [WithConsumerCheck] interval: so only with an interval longer than that expiry. A
// closed connection fails the run.
//
// Shutdown: when the run stops or [Source.Stop] is called, the source stops pulling,
// hands back (Nak) the messages waiting for the pipeline and those the client still
// delivers, and lets the items in flight finish (after Stop) or stop (on cancel), each
// acknowledged as it settles; every acknowledgement has been handed to the connection
// when [pipeline.Pipeline.Run] returns. Acks are sent asynchronously: flush or drain
// the connection before exit.
//
// A Source may serve one run at a time; it is safe for concurrent use.
type Source[T any] struct {
	cons  natsjs.Consumer
	codec pipeline.Codec[T]
	cfg   sourceConfig

	delivered, redelivered, acked, handedBack, notProcessed, deadLettered atomic.Int64
	undecodable, inProgress, ackErrors, pullErrors                        atomic.Int64
	pending                                                               atomic.Int64 // the newest delivery's num_pending + 1; 0 before the run's first (lag.go)

	mu       sync.Mutex
	feed     *feed // the current run's, if any
	stopping bool
}

// NewSource returns a source over cons (a durable pull consumer with explicit acks)
// whose messages codec decodes; a [pipeline.JSONCodec] or [Bytes] will do. Attach it
// to a pipeline with [Source.Stream]. It panics if cons or codec is nil.
func NewSource[T any](cons natsjs.Consumer, codec pipeline.Codec[T], opts ...SourceOption) *Source[T] {
	if cons == nil || codec == nil {
		panic("jetstream: NewSource needs a consumer and a codec")
	}
	var cfg sourceConfig
	for i, o := range opts {
		if o == nil {
			panic(fmt.Sprintf("jetstream: NewSource: option %d of %d is nil", i+1, len(opts)))
		}
		o.sourceOption(&cfg)
	}
	if cfg.name == "" {
		cfg.name = "JetStream"
	}
	if cfg.ackTimeout == 0 {
		cfg.ackTimeout = 5 * time.Second
	}
	if cfg.check == 0 {
		cfg.check = time.Second
	}
	info := cons.CachedInfo()
	var ackWait time.Duration
	maxAck := 0
	if info != nil {
		ackWait, maxAck = info.Config.AckWait, info.Config.MaxAckPending
		cfg.maxBatch, cfg.maxExpires = info.Config.MaxRequestBatch, info.Config.MaxRequestExpires
	}
	if ackWait <= 0 {
		ackWait = 30 * time.Second // the server's default
	}
	if cfg.progress == 0 {
		cfg.progress = max(ackWait/3, time.Millisecond)
	}
	if cfg.maxPending == 0 {
		cfg.maxPending = 1000
		if maxAck > 0 {
			cfg.maxPending = maxAck
		}
	}
	if cfg.pull == 0 {
		cfg.pull = 256
		if maxAck > 0 {
			cfg.pull = min(cfg.pull, maxAck)
		}
	}
	return &Source[T]{cons: cons, codec: codec, cfg: cfg}
}

// Stream adds the source to p and returns its stream of items. p gets an acknowledged
// source ([pipeline.FromAcked]): a pipeline may have only one, and Stream panics on a
// second one. The source's row of p's reports carries the consumer's backlog
// ([pipeline.WithLag]): one partition, labeled "stream/consumer", whose lag is the
// messages the server had not delivered to the consumer yet (its num_pending) as of
// the run's newest delivery (the highest consumer sequence), so it stays put while no
// message arrives; nil before the run's first message and between runs.
func (s *Source[T]) Stream(p *pipeline.Pipeline) *pipeline.Stream[T] {
	return pipeline.FromAcked(p, s.run, pipeline.WithName(s.cfg.name), pipeline.WithMaxPending(s.cfg.maxPending),
		pipeline.WithLag(s.lag))
}

// Stop ends the input of the current run, or of the next one if none is running: the
// source stops pulling and hands back the messages waiting for the pipeline, the items
// in flight finish and are acknowledged, and [pipeline.Pipeline.Run] then returns nil
// (unless something failed). It does not wait.
func (s *Source[T]) Stop() {
	s.mu.Lock()
	s.stopping = true
	f := s.feed
	s.mu.Unlock()
	if f != nil {
		f.stop()
	}
}

// Stats returns the source's counts so far.
func (s *Source[T]) Stats() Stats {
	return Stats{
		Delivered: s.delivered.Load(), Redelivered: s.redelivered.Load(), Acked: s.acked.Load(),
		HandedBack: s.handedBack.Load(), NotProcessed: s.notProcessed.Load(),
		DeadLettered: s.deadLettered.Load(), Undecodable: s.undecodable.Load(),
		InProgress: s.inProgress.Load(), AckErrors: s.ackErrors.Load(), PullErrors: s.pullErrors.Load(),
	}
}

// run is the body of the acknowledged source: one run's loop over the consumer.
func (s *Source[T]) run(ctx context.Context, emit func(T, func(pipeline.Settlement)) error) error {
	h := newHand(s.cfg.progress, &s.inProgress)
	f := s.newFeed(h)
	s.pending.Store(0) // not known yet in this run
	s.mu.Lock()
	s.feed = f
	stopping := s.stopping
	s.mu.Unlock()
	if stopping {
		f.stop()
	}
	f.start()
	unwatch := context.AfterFunc(ctx, f.stop) // stop pulling; hand back what waits
	// decoding is the message taken from the feed while the codec decodes it (neither
	// released nor given to emit): a codec that panics leaves it here, to hand back.
	var decoding waitingMsg
	var inCodec bool
	defer func() {
		unwatch()
		if inCodec {
			h.release(decoding.held)
			s.nak(decoding.msg)
		}
		f.stop()
		f.wait() // the readers have handed back what came after, the watcher returned
		for _, m := range f.rest() {
			h.release(m.held)
			s.nak(m.msg)
		}
		s.mu.Lock()
		s.feed, s.stopping = nil, false
		s.mu.Unlock()
		h.bodyDone()
	}()
	for {
		m, stopped, ok, err := f.next()
		if !ok {
			return err
		}
		if stopped { // waiting when the input ended
			h.release(m.held)
			s.nak(m.msg)
			continue
		}
		var v T
		decoding, inCodec = m, true
		err = s.codec.Unmarshal(m.msg.Data(), &v)
		decoding, inCodec = waitingMsg{}, false
		if err != nil {
			s.undecodable.Add(1)
			s.deadLetter(h, m, pipeline.DeadLetter[struct{}]{
				Stage: s.cfg.name, Attempts: 1, Class: pipeline.ClassItem, ErrType: fmt.Sprintf("%T", err),
				FirstError: err.Error(), LastError: err.Error(), Time: time.Now(),
			})
			continue
		}
		if err := emit(v, func(st pipeline.Settlement) {
			s.settle(h, m, st, ctx.Err() != nil) // the run stopping: no DoubleAck waits
		}); err != nil {
			f.stop() // emit settled v as not processed; hand back what waits
		}
	}
}

// newFeed returns the feed of one run, not started.
func (s *Source[T]) newFeed(h *hand) *feed {
	f := &feed{
		cons: s.cons, h: h, pull: s.cfg.pull, batch: (s.cfg.pull + 1) / 2, expires: s.cfg.maxExpires,
		check: s.cfg.check, timeout: s.cfg.ackTimeout,
		delivery: func(meta *natsjs.MsgMetadata, newest bool) {
			s.delivered.Add(1)
			if newest {
				s.pending.Store(int64(min(meta.NumPending, 1<<62)) + 1)
			}
			if meta.NumDelivered > 1 {
				s.redelivered.Add(1)
			}
		},
		nak:       s.nak,
		pullError: func() { s.pullErrors.Add(1) },
		poke:      make(chan struct{}, 1),
		quit:      make(chan struct{}),
	}
	if s.cfg.maxBatch > 0 {
		f.batch = min(f.batch, s.cfg.maxBatch)
	}
	f.cond.L = &f.mu
	f.ctx, f.cancel = context.WithCancel(context.Background())
	if info := s.cons.CachedInfo(); info != nil {
		f.stream, f.name = info.Stream, info.Name
	}
	return f
}

// settle acknowledges m according to st, and releases it from h; stopping tells that
// the run's context is done, when a DoubleAck is not waited for.
func (s *Source[T]) settle(h *hand, m waitingMsg, st pipeline.Settlement, stopping bool) {
	if st.Outcome == pipeline.DeadLettered {
		s.deadLetter(h, m, st.DeadLetter) // held while its copy is published
		return
	}
	// Released before the acknowledgement is sent: no InProgress comes after it (one
	// after a NakWithDelay resets its delay to AckWait). A DoubleAck that waits is no
	// reason to hold on: a signal sent after the Ack reaches the server after it.
	h.release(m.held)
	msg, meta := m.msg, m.meta
	var (
		err   error
		count *atomic.Int64
	)
	switch st.Outcome {
	case pipeline.Committed:
		if s.cfg.doubleAck && !stopping {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ackTimeout)
			err = msg.DoubleAck(ctx)
			cancel()
		} else {
			err = msg.Ack()
		}
		count = &s.acked
	case pipeline.HandedBack:
		d := st.Delay
		if s.cfg.backoff != nil {
			d = s.cfg.backoff(int(min(meta.NumDelivered, 1<<31)))
		}
		if d > 0 {
			err = msg.NakWithDelay(d)
		} else {
			err = msg.Nak()
		}
		count = &s.handedBack
	default:
		s.nak(msg)
		return
	}
	if err != nil {
		s.ackErrors.Add(1)
		return
	}
	count.Add(1)
}

func (s *Source[T]) nak(msg natsjs.Msg) {
	if err := msg.Nak(); err != nil {
		s.ackErrors.Add(1)
		return
	}
	s.notProcessed.Add(1)
}

// deadLetter publishes a copy of m's message with rec's headers, if a subject is set,
// and then terminates the message; if the publish fails, it hands it back instead. The
// message stays held by h, with its InProgress signals, until the publish is done: a
// publish slower than AckWait (up to WithAckTimeout) let the server deliver it again
// while it was being set aside.
func (s *Source[T]) deadLetter(h *hand, m waitingMsg, rec pipeline.DeadLetter[struct{}]) {
	msg, meta := m.msg, m.meta
	var err error // the copy's publish
	if s.cfg.dlJS != nil {
		dl := nats.NewMsg(s.cfg.dlSubject)
		dl.Data = msg.Data()
		hd := dl.Header
		hd.Set(HeaderStage, rec.Stage)
		hd.Set(HeaderClass, rec.Class.String())
		hd.Set(HeaderErrType, rec.ErrType)
		hd.Set(HeaderError, rec.LastError)
		hd.Set(HeaderFirstError, rec.FirstError)
		hd.Set(HeaderAttempts, strconv.Itoa(rec.Attempts))
		hd.Set(HeaderSubject, msg.Subject())
		hd.Set(HeaderStream, meta.Stream)
		hd.Set(HeaderSequence, strconv.FormatUint(meta.Sequence.Stream, 10))
		hd.Set(HeaderDeliveries, strconv.FormatUint(meta.NumDelivered, 10))
		hd.Set(HeaderTime, rec.Time.UTC().Format(time.RFC3339Nano))
		// The same message set aside twice by this consumer (redelivered after a crash
		// between the PubAck and the Term) is stored once; another consumer's copy of it
		// (another pipeline over the stream) is a record of its own.
		hd.Set(nats.MsgIdHdr, "dl:"+meta.Stream+":"+meta.Consumer+":"+strconv.FormatUint(meta.Sequence.Stream, 10))
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ackTimeout)
		_, err = s.cfg.dlJS.PublishMsg(ctx, dl)
		cancel()
	}
	h.release(m.held)
	if err != nil {
		// Handed back, to be set aside on a later delivery: after a delay, or a stream
		// that refuses it (full, say) would see the message again at once, and every
		// stage do it again. Counted in AckErrors only.
		s.ackErrors.Add(1)
		d := s.cfg.ackTimeout
		if s.cfg.backoff != nil {
			d = s.cfg.backoff(int(min(meta.NumDelivered, 1<<31)))
		}
		_ = msg.NakWithDelay(d)
		return
	}
	if err := msg.Term(); err != nil {
		s.ackErrors.Add(1) // redelivered, and set aside again: the copy's Nats-Msg-Id keeps one
		return
	}
	s.deadLettered.Add(1)
}

// hand keeps the messages a run holds and sends each an InProgress signal every
// interval, from a goroutine that lives while the source's body runs or any message is
// held (settlements come until the run ends; the last one stops it and waits for it).
type hand struct {
	every time.Duration
	count *atomic.Int64

	mu   sync.Mutex
	held map[*heldMsg]struct{}
	done bool // the source's body returned
	quit chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

type heldMsg struct {
	msg  natsjs.Msg
	last time.Time // the delivery, or the last InProgress

	// mu is held while an InProgress is sent, so that release waits for it: a signal
	// taken before the release and sent after the settlement reached the server after
	// it, and reset a NakWithDelay's delay to AckWait.
	mu       sync.Mutex
	released bool // no InProgress any more
}

func newHand(every time.Duration, count *atomic.Int64) *hand {
	h := &hand{every: every, count: count, held: map[*heldMsg]struct{}{}, quit: make(chan struct{})}
	h.wg.Go(h.loop)
	return h
}

func (h *hand) loop() {
	// A message is due at the first tick after it has been held a tick less than every,
	// so that its signals are at most every apart (between every - period and every).
	// Sent once every had passed, they came up to every + period apart: a WithProgressEvery
	// near AckWait let the server redeliver.
	period := max(h.every/4, time.Millisecond)
	tick := time.NewTicker(period)
	defer tick.Stop()
	soon := h.every - period
	var due []*heldMsg
	for {
		select {
		case <-h.quit:
			return
		case now := <-tick.C:
			due = due[:0]
			h.mu.Lock()
			for m := range h.held {
				if now.Sub(m.last) >= soon {
					m.last = now
					due = append(due, m)
				}
			}
			h.mu.Unlock()
			for _, m := range due {
				m.mu.Lock()
				if !m.released && m.msg.InProgress() == nil {
					h.count.Add(1)
				}
				m.mu.Unlock()
			}
			clear(due)
		}
	}
}

func (h *hand) hold(msg natsjs.Msg) *heldMsg {
	m := &heldMsg{msg: msg, last: time.Now()}
	h.mu.Lock()
	h.held[m] = struct{}{}
	h.mu.Unlock()
	return m
}

// release ends m's InProgress signals; once it returns, none is under way.
func (h *hand) release(m *heldMsg) {
	m.mu.Lock()
	m.released = true
	m.mu.Unlock()
	h.mu.Lock()
	delete(h.held, m)
	last := h.done && len(h.held) == 0
	h.mu.Unlock()
	if last {
		h.stop()
	}
}

func (h *hand) bodyDone() {
	h.mu.Lock()
	h.done = true
	last := len(h.held) == 0
	h.mu.Unlock()
	if last {
		h.stop()
	}
}

func (h *hand) stop() {
	h.once.Do(func() { close(h.quit) })
	h.wg.Wait()
}
