package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/trace"
	"sync/atomic"
	"time"

	"github.com/gopipeline/pipeline/internal/adaptive"
	"github.com/gopipeline/pipeline/internal/attempt"
)

// Stage is a named, typed unit of per-item work run by a fixed number of goroutines
// (workers) that read from a bounded input queue. Create one with [NewStage],
// [NewFlatStage] or [NewSink] and attach it with [Then] or [To]. A Stage is an immutable
// definition: it may be used in several pipelines, and in each run it gets fresh
// workers, queue and counters; within one pipeline its name must be unique.
type Stage[In, Out any] struct {
	name    string
	workers int
	fn      func(context.Context, In) (Out, error)
	flat    func(context.Context, In, func(Out)) error
	sinkFn  func(context.Context, In) error // NewSink's fn, which fn wraps: a plain worker's untimed attempts call it directly
	sink    bool
	cfg     config
	dl      func(context.Context, DeadLetter[In]) error
	hash    func(In) uint64 // WithKey, WithPartition
}

// Name returns the stage's name.
func (st *Stage[In, Out]) Name() string { return st.name }

// NewStage returns a stage that calls fn once per item on up to workers goroutines and
// passes fn's result downstream. fn must honour ctx: it is canceled when the run stops
// and, with [WithTimeout], when an attempt's deadline passes. The error fn returns is
// handled according to its class (see the package documentation, "Error classes"); with
// no option, any error stops the run.
//
// It panics with a "pipeline:" message if name is empty, workers < 1, fn is nil, or an
// option does not fit the stage (a [WithDeadLetter] for another item type, a
// pipeline-only option).
//
// A stage without middleware options adds no allocation per item.
func NewStage[In, Out any](name string, workers int, fn func(ctx context.Context, item In) (Out, error), opts ...StageOption) *Stage[In, Out] {
	if fn == nil {
		panic(fmt.Sprintf("pipeline: NewStage(%q): nil function", name))
	}
	st := &Stage[In, Out]{fn: fn}
	st.init("NewStage", name, workers, opts)
	return st
}

// NewFlatStage returns a stage whose function may emit any number of outputs per input
// (none filters the item out; several flat-map it). emit only records an output: the
// outputs of an attempt are sent downstream after fn returns nil, in emit order, so a
// failed or retried attempt sends nothing and waiting on a full queue never counts
// against [WithTimeout]. The outputs of one item are held in memory until sent.
//
// emit is not safe for concurrent use: call it from fn's goroutine, or from goroutines
// that fn starts if they take turns (under a mutex, say) and fn waits for them before it
// returns. Concurrent calls are a data race that loses outputs (the race detector
// reports it). emit must not be called once fn has returned: a call while the worker is
// not in fn panics (one made while the worker already runs fn for its next item cannot
// be told apart, and goes with that item).
//
// It panics like [NewStage].
func NewFlatStage[In, Out any](name string, workers int, fn func(ctx context.Context, item In, emit func(Out)) error, opts ...StageOption) *Stage[In, Out] {
	if fn == nil {
		panic(fmt.Sprintf("pipeline: NewFlatStage(%q): nil function", name))
	}
	st := &Stage[In, Out]{flat: fn}
	st.init("NewFlatStage", name, workers, opts)
	return st
}

// NewSink returns a terminal stage: fn consumes each item and produces nothing. Attach
// it with [To]. It takes the same options as [NewStage] (a sink can retry and
// dead-letter too) and panics like it.
func NewSink[In any](name string, workers int, fn func(ctx context.Context, item In) error, opts ...StageOption) *Stage[In, struct{}] {
	if fn == nil {
		panic(fmt.Sprintf("pipeline: NewSink(%q): nil function", name))
	}
	st := &Stage[In, struct{}]{
		fn:     func(ctx context.Context, v In) (struct{}, error) { return struct{}{}, fn(ctx, v) },
		sinkFn: fn,
		sink:   true,
	}
	st.init("NewSink", name, workers, opts)
	return st
}

func (st *Stage[In, Out]) init(ctor, name string, workers int, opts []StageOption) {
	if name == "" {
		panic(fmt.Sprintf("pipeline: %s: empty stage name", ctor))
	}
	if workers < 1 {
		panic(fmt.Sprintf("pipeline: %s(%q): workers must be at least 1, got %d", ctor, name, workers))
	}
	st.name, st.workers = name, workers
	where := fmt.Sprintf("%s(%q)", ctor, name)
	st.cfg = configure(where, opts, StageOption.stageOption)
	if st.cfg.deadLetter != nil {
		st.dl = typed[func(context.Context, DeadLetter[In]) error, In](st.cfg.deadLetter, where, "WithDeadLetter", "a stage")
	}
	if st.cfg.key != nil {
		if st.cfg.keyClash != "" {
			panic(fmt.Sprintf("pipeline: %s(%q): %s together; give one way to route items to workers", ctor, name, st.cfg.keyClash))
		}
		by := st.cfg.keyBy
		hash := typed[func(In) uint64, In](st.cfg.key, where, by, "a stage")
		if st.cfg.ordered {
			panic(fmt.Sprintf("pipeline: %s(%q): %s and WithOrdered together; %s already keeps order per key", ctor, name, by, by))
		}
		st.hash = hash
	}
	if st.cfg.attempts == 0 {
		st.cfg.attempts = 1
	}
	st.checkClient(ctor) // client.go
}

// Stream is the typed output of a source, a stage or an inline operator, not yet
// connected to its consumer. Each Stream must be consumed exactly once: by [Then], [To],
// an inline operator ([Map], [Filter]), [Collect] or [All]. Consuming it twice panics.
type Stream[T any] struct {
	p        *Pipeline
	desc     string
	consumed bool
	// open wires the stream into run r for the consumer c, and returns the rows that
	// produce the stream directly (the rows its items come from; none yet for all but
	// the last branch of a Tee, see tee.open). From then on each goroutine of the
	// producer takes a sender from c.out and puts every item through it, flushing it
	// before it waits for anything but its consumer; the producer calls c.done exactly
	// once after its last flush when it ends well (its input ended, or a budget drained
	// it), and never when it fails: then the run is stopping, and the consumer sees no
	// end. Wiring keeps no state outside the run: a definition can be opened by many
	// runs, one after the other.
	open func(r *run, c into[T]) []*row
}

// into is what a consumer gives the stream it opens: the outlet its producers take
// senders from, the function they call when the stream ends, and the rows that consume
// the stream directly (one, or the first rows of every branch of a Tee): they count
// what a panic in an inline operator between them kept from them.
type into[T any] struct {
	out  outlet[T]
	done func()
	rows []*row
	// feed, when not nil, offers a slice source's items to the consumer's queue, to be
	// taken in place (queue.fedBy): a stage's plain queue, fed by its one input.
	feed func(items []T, src *row) bool
}

func newStream[T any](p *Pipeline, desc string) *Stream[T] {
	s := &Stream[T]{p: p, desc: desc}
	p.streams = append(p.streams, s)
	return s
}

func (s *Stream[T]) isConsumed() bool { return s.consumed }
func (s *Stream[T]) describe() string { return s.desc }

// check panics with a "pipeline:" message when s is nil (a stream from no constructor).
func (s *Stream[T]) check(where string) {
	if s == nil || s.p == nil {
		panic(fmt.Sprintf("pipeline: %s: nil *Stream", where))
	}
}

func (s *Stream[T]) consume(by string) {
	if s.consumed {
		panic(fmt.Sprintf("pipeline: %s consumes the output of %s, which is already consumed; a stream has one consumer", by, s.desc))
	}
	s.consumed = true
}

// Then connects stage st to stream s: the stage's workers take items from a queue that
// s fills, and the returned stream carries the stage's outputs. It panics if s is
// already consumed or st's name is already used in the pipeline.
func Then[In, Out any](s *Stream[In], st *Stage[In, Out]) *Stream[Out] {
	s.check("Then")
	if st == nil {
		panic("pipeline: Then: nil *Stage")
	}
	return then(s, st, st.sink, false)
}

// then is [Then]; sink tells that the stage's row is a sink (made by [NewSink], or
// attached by [To]): its function may call [Commit] and [SetAside], and its row is a
// "sink" in the report. terminal tells that [To] attached it: its outputs go nowhere.
func then[In, Out any](s *Stream[In], st *Stage[In, Out], sink, terminal bool) *Stream[Out] {
	p := s.p
	name := p.claim(st.name, true)
	desc := fmt.Sprintf("stage %q", name)
	s.consume(desc)
	out := newStream[Out](p, desc)
	buf := st.cfg.bufferOr(p.cfg.bufferOr(DefaultBuffer))
	classify := st.cfg.classify
	if classify == nil {
		classify = p.cfg.classify
	}
	kind := KindStage
	if sink {
		kind = KindSink
	}
	out.open = func(r *run, c into[Out]) []*row {
		next, done := c.out, c.done
		var q *queue[In]
		if st.hash != nil {
			q = newKeyedQueue(st.workers, buf, st.hash)
		} else {
			q = newQueue[In](buf, st.workers)
		}
		r.stoppers = append(r.stoppers, q.stop)
		rw := r.newRow(name, kind, st.workers, buf, q)
		wireFed(r, rw, s, q.outlet(r.ctx), q.close, q.fedBy)
		r.addRow(rw)
		b := r.shared
		if st.cfg.budget != nil {
			b = newBudgetState(*st.cfg.budget)
		}
		var ord *reorder[Out]
		if st.cfg.ordered {
			window := st.cfg.window
			if window == 0 {
				window = buf + chunk*st.workers // runs of chunk/2 or more for every worker (see WithOrdered)
			}
			ord = newReorder(window, next(&hand{row: rw}), st.flat != nil, r.tracked())
			rw.held, rw.extra = ord.heldCount, window
		}
		cl := newClient(r, rw, st)                           // client.go: nil without rate limit, breaker or adaptive workers
		tw := newTimeouts(r, rw, st.cfg.timeout, st.workers) // timeout.go: WithTimeout's clocks and watcher; nil without
		var left atomic.Int32
		left.Store(int32(st.workers))
		var failed atomic.Bool // a worker failed: downstream sees no end of input
		for i := range st.workers {
			lane := 0
			if st.hash != nil {
				lane = i
			}
			w := &worker[In, Out]{
				consumer: newConsumer(q, lane, i, &rw.workers[i], rw.capacity),
				st:       st, r: r, row: rw, budget: b, classify: classify, ord: ord, cl: cl.forWorker(i),
				runMax: 1, share: 1, sink: sink, quiet: terminal && !r.tracked(),
				direct: ord == nil && st.flat == nil, pending: ord != nil && st.flat == nil,
				fast:  ord == nil && st.flat == nil && b == nil,
				plain: cl == nil && st.flat == nil && (!sink || !r.tracked()),
			}
			w.ctxs = tw.clock(i)
			if ord == nil {
				// Counts and attempt contexts are current while the worker waits.
				h := &hand{row: rw, waits: []func(){w.commit}}
				if w.ctxs != nil {
					h.waits = append(h.waits, w.ctxs.Publish)
				}
				w.out, w.hand = next(h), h
			} else {
				w.out = ord.out.positions() // the window's flusher sends the outputs
			}
			if st.flat != nil {
				w.emit = func(o Out) {
					if !w.inFlat {
						panic(fmt.Sprintf("pipeline: NewFlatStage(%q): emit called after the stage's function returned", st.name))
					}
					w.buf = append(w.buf, o)
				}
			}
			r.spawn(name, func() (err error) {
				returned := false
				defer func() {
					if err != nil || !returned { // an error, or runtime.Goexit
						failed.Store(true)
					}
					if left.Add(-1) == 0 {
						tw.ended()
						r.emit(r.ctx, Event{Kind: EventStageDone, Stage: name}) // before the next stage can end
						if !failed.Load() {
							done()
						}
					}
				}()
				err = w.loop()
				returned = true
				return err
			})
		}
		tw.watch()
		return []*row{rw}
	}
	return out
}

// To ends stream s in sink: every item of s is passed to the sink's function. Use
// [NewSink] to make one. A stage made by [NewStage] with the output type struct{} is a
// sink all the same once To attaches it: its function may call [Commit] and [SetAside],
// and its row is a [KindSink] in the report, exactly as with NewSink. It panics like
// [Then], and when sink was made by [NewFlatStage] (its emit would have nowhere to go:
// use NewSink).
func To[T any](s *Stream[T], sink *Stage[T, struct{}]) {
	s.check("To")
	if sink == nil {
		panic("pipeline: To: nil *Stage")
	}
	if sink.flat != nil {
		panic(fmt.Sprintf("pipeline: To: stage %q was made by NewFlatStage: a sink emits nothing; make it with NewSink", sink.name))
	}
	out := then(s, sink, true, true)
	out.consumed = true
	s.p.terminals = append(s.p.terminals, func(r *run) {
		// The sink's function returned nil: the item's effect is committed, and its
		// position settles, with the rest of the worker's run (runSettler); in an
		// untracked run worker.end skips the call: quiet.
		out.open(r, into[struct{}]{out: func(*hand) sender[struct{}] { return runSettler(r.track) }, done: func() {}})
	})
}

// tally counts a consumer's outcomes between two commits (consumer.commit): in a stage
// worker, during a run of items, and only in worker.end. An item costs no locked
// instruction: the tally is added to the row's statistics once per run, and before the
// goroutine waits.
type tally struct{ succeeded, emitted, retried, deadLettered, handedBack, failed, discarded int64 }

// worker is one goroutine of a stage in one run.
type worker[In, Out any] struct {
	consumer[In] // its input: the queue, its run of items, its tally and statistics
	st           *Stage[In, Out]
	r            *run
	row          *row
	out          sender[Out] // its outputs go there; its positions are derived and settled through it
	budget       *budgetState
	classify     func(error) Class
	buf          []Out // outputs of the current attempt (flat stages)
	emit         func(Out)
	hand         *hand           // the worker's, when it has a sender of its own
	runMax       int             // the most items to take at once: fewer, the slower the function
	share        int             // the least run worth waking another worker for (takeOrPark)
	untimed      int             // attempts to make before the next timed one: one in 64 is timed, or every one while they are slow (measured)
	clock        time.Duration   // the worker's last clock reading, as an offset from the run's start
	pos          uint64          // the current item's source position (checkpointed runs)
	seq          uint64          // the current item's sequence number (ordered stages)
	si           int             // its slot in the reorder window: seq modulo the window's size
	ord          *reorder[Out]   // the reorder window (ordered stages)
	pend         []slotState     // ordered one-to-one stages: the states of the run's items since pseq, settled together (pendRun)
	pseq         uint64          // the sequence number of pend's first item
	plain        bool            // no client, no Commit scope, one output per item: items makes the first attempt itself
	direct       bool            // unordered, one output per item: end puts it itself
	fast         bool            // direct and no error budget: end settles a succeeded item in its first lines
	pending      bool            // ordered, one output per item: end puts it in its slot, settle in the window
	quiet        bool            // an untracked run's sink: its sender has nothing to tell
	sink         bool            // the stage is a sink (NewSink, or attached by To): Commit and SetAside work
	inFlat       bool            // a flat stage's function is running: its emit may be called
	inHand       bool            // an item is started and has not ended (end): a panic fails it
	f            fate            // how the item in hand failed, for end
	ctx          context.Context // the run's, as the worker's items see it (a sink's carries SetAside's row): end's, for this run only
	ctxs         *attempt.Clock  // WithTimeout: the attempts' contexts (nil without; a clock of its own, so that a context kept after its attempt keeps only it alive)
	cl           *client[In]     // rate limits, breaker, adaptive workers (client.go); nil without
	holdFn       func() error    // with cl: hold, for a policy about to keep an attempt waiting (client.go's before), which sets holdErr
	holdErr      error
	tk           ticket // the current attempt's, from w.cl (client.go)
	ticketed     bool   // tk is taken and its attempt not settled yet: a stop or a panic releases it
	again        bool   // the item in hand was held by its key's breaker (breaker.go): held again, it stays first
}

// runBudget is about how long a worker's run of items may take: a worker takes as many
// items at once as its function handles in that time (at least one, at most a chunk),
// so that a slow function leaves the queued items to the other workers and outputs wait
// little for the end of their run.
const runBudget = 16 * time.Microsecond

// splitWork is about the least work worth waking another worker for: a worker leaves
// waiting items to the workers that wait only when each share takes that long.
const splitWork = time.Microsecond

// loop takes items until the queue is closed and drained (nil) or the run stops (its
// cause). A panic in user code fails the run as a *PanicError; the item in flight is
// counted as failed, the rest of its run as not started.
func (w *worker[In, Out]) loop() (err error) {
	returned := false
	defer guard(&returned, func(perr error) {
		w.publish() // no attempt context of the worker stays live after it
		w.release() // a breaker's probe the panicking attempt held (middleware.go)
		if w.inHand {
			_ = w.end(interrupted, nil, 1, nil)
		}
		w.refusePending()
		if n := w.rest(); n > 0 {
			_ = w.end(abandoned, nil, n, nil)
		}
		if w.out.drop != nil {
			w.out.drop()
		}
		w.commit()
		if isGoexit(perr) { // the goroutine goes on ending; r.spawn fails the run
			w.row.addError("goexit", func(e *ErrorCount) { e.Failed++ })
			return
		}
		w.row.addError("panic", func(e *ErrorCount) { e.Failed++ })
		err = &StageError{Stage: w.st.name, Err: perr}
	})
	ctx := w.r.ctx
	if w.sink {
		ctx = newSinkCtx(ctx, w.row) // for SetAside (deadletter.go)
	}
	w.ctx = ctx
	if w.cl != nil {
		w.holdFn = func() error {
			w.holdErr = w.hold(ctx)
			return w.holdErr
		}
	}
	err = w.take(ctx)
	returned = true
	w.publish() // no attempt context of the worker stays live after it
	w.commit()
	return err
}

// take is the worker's loop over its input, a run of items at a time.
func (w *worker[In, Out]) take(ctx context.Context) error {
	var adapt *adaptive.Limit // WithAdaptiveWorkers (adaptive.go): nil, so one register test per run
	var keyed heldItems[In]
	var idle func(wake <-chan struct{}) (bool, error) // consumer.take's
	if w.cl != nil {
		adapt, keyed = w.cl.adapt, w.cl.keyed
	}
	if keyed != nil { // a breaker per key (breaker.go): an idle worker waits for held items too
		idle = func(wake <-chan struct{}) (bool, error) { return keyed.wait(ctx, wake) }
	}
	for {
		if adapt != nil { // above the adaptive limit: wait, with the last run counted
			w.commit()
			if err := adapt.Gate(ctx, w.id); err != nil {
				return err
			}
		}
		n := w.runMax
		if w.cl != nil && w.cl.serial {
			n = 1 // an item may wait for a token: the rest stay queued for the other workers (other keys)
		}
		if w.ord != nil { // runs that leave the window room for every worker's next one
			n = min(n, max(1, w.ord.size()/(2*w.st.workers)))
		}
		if keyed != nil { // held items whose key lets them through go first (breaker.go)
			if err := w.resume(ctx); err != nil {
				if w.out.drop != nil {
					w.out.drop()
				}
				return err
			}
		}
		seq, ok, err := w.consumer.take(w.r.ctx, n, w.share, idle) // the run's own: a sink's ctx adds a value layer to each Err
		if !ok {
			if err == nil && keyed != nil && w.keepsHeld() { // the input ended: stay for the held items
				_, err = keyed.wait(ctx, nil)
			}
			if errors.Is(err, errResume) {
				continue
			}
			if w.cl != nil {
				w.cl.ended()
			}
			return err
		}
		w.stats.busy.v.Store(1)
		err = w.items(ctx, seq)
		w.publish() // the run's attempts returned: tell their contexts
		w.stats.busy.v.Store(0)
		if err != nil {
			if w.out.drop != nil {
				w.out.drop() // outputs in hand: never sent
			}
			return err
		}
	}
}

// items handles the run of items taken, the first with sequence number seq: each
// item ends in one call of end. A plain worker makes an item's first attempt here, with
// nothing between the function and end; attempts makes every other attempt.
func (w *worker[In, Out]) items(ctx context.Context, seq uint64) error {
	w.tick() // the start of the run's attempts
	// Per run: a trace started during the run has regions from the next one.
	plain := w.plain && !trace.IsEnabled()
	fn, timeout := w.st.fn, w.st.cfg.timeout > 0
	sinkFn := w.st.sinkFn // a sink's function without fn's wrapper around it (two calls per item: S5 cpu 40 instructions per line)
	stop := w.r.ctx       // ctx's cancellation, without a sink's value layer to go through per item
	if w.hand != nil {
		w.hand.last = false // until the run's last item
	}
	var si0, slots int // the run's first slot in the window, and the window's size
	if w.ord != nil {
		slots = w.ord.size()
		si0 = int(seq % uint64(slots))
	}
	for j := w.j; j < w.k; j = w.j {
		// consumer.next, inline (a call per item costs 1xP several percent): its room
		// in the queue is free before its function is called, which may wait for its
		// producers; the first item's since take.
		e := &w.run[j]
		v := e.v
		w.pos = e.pos
		*e = item[In]{} // now, not when the run ends: the worker may wait in mid-run (a backoff, room downstream)
		w.j = j + 1
		if j > 0 && w.starts.add(1, &w.q.pwait) { // queue.started, without its call (3x4: 3 % of the library's instructions)
			w.q.wakeProducers()
		}
		if stop.Err() != nil { // the run is stopping: start nothing new
			return w.abandon(ctx, 1, context.Cause(ctx))
		}
		if slots > 0 { // ordered: its sequence number and slot (a run is at most half the window: one wrap at most)
			w.seq = seq + uint64(j)
			if w.si = si0 + j; w.si >= slots {
				w.si -= slots
			}
			if !w.ord.inside(w.seq) { // start only what the window has room for
				if err := w.settle(ctx); err != nil { // the window may wait for this run's items
					return w.abandon(ctx, 1, err)
				}
				if err := w.ord.admit(ctx, w.seq); err != nil {
					return w.abandon(ctx, 1, err)
				}
			}
		}
		if w.row.drain.Load() { // a drained budget: start no new item
			if err := w.end(drained, nil, 1, nil); err != nil {
				return w.abandon(ctx, 0, err)
			}
			continue
		}
		if w.j == w.k && w.hand != nil {
			w.hand.last = true // its outputs go at once: the run ends with it
		}
		w.inHand = true
		var out Out
		var err error
		o := succeeded
		if plain {
			if timeout { // timeoutCall, inline (its call cost S5 3x4's middleware about 20 instructions per attempt), ending apart (below)
				k := w.ctxs
				var a *attempt.Ctx
				if i := uint(k.I); i < uint(len(k.Slots)) && w.clock == k.Now && !k.Ask.Load() { // nextAttempt, written out (testing its nil cost 4 instructions): ctx is the latest Begin's
					k.I = int(i + 1)
					a = &k.Slots[i]
				} else {
					a = k.Begin(ctx, w.clock)
				}
				if w.untimed > 0 {
					w.untimed--
					out, err = fn(a, v)
				} else {
					t0 := time.Now()
					out, err = fn(a, v)
					w.measured(t0)
				}
				if err != nil {
					err = w.timedOut(a, err)
				}
				if k.Looks.Load() {
					a.Finish()
				}
				if err != nil {
					o, err = w.attempts(ctx, v, &out, err)
					keepInline(k, ctx) // its Begins may have had another parent
				}
				if err = w.end(o, &out, 1, err); err != nil { // apart: joined with the untimed worker's, it cost that one 3 instructions per item and stage in register moves
					return w.abandon(ctx, 0, err)
				}
				continue
			}
			if w.untimed > 0 { // timedCall, inline: even a helper for the timing costs 1xP 4 %
				w.untimed--
				if sinkFn != nil {
					err = sinkFn(ctx, v) // out is struct{}: nothing to set
				} else {
					out, err = fn(ctx, v)
				}
			} else {
				t0 := time.Now()
				out, err = fn(ctx, v)
				w.measured(t0)
			}
			if err != nil {
				o, err = w.attempts(ctx, v, &out, err)
			}
		} else {
			o, err = w.attempts(ctx, v, &out, nil)
		}
		if err = w.end(o, &out, 1, err); err != nil {
			return w.abandon(ctx, 0, err)
		}
	}
	if err := w.settle(ctx); err != nil {
		return err
	}
	if w.out.flush != nil {
		return w.out.flush()
	}
	return nil
}

// outcome is what became of an item of a stage, or of one of its attempts. Every item
// a worker takes ends in exactly one of succeeded, deadLettered, handedBack, failed,
// interrupted, abandoned and drained (held is one until resumed takes the item back);
// retried marks a failed attempt on the way, and refused corrects items of an ordered
// stage that never entered the reorder window. worker.end is the one place that counts
// them.
type outcome uint8

const (
	succeeded    outcome = iota // its outputs went downstream, or into the reorder window
	retried                     // an attempt failed and another follows: not an ending
	deadLettered                // its dead-letter destination accepted it
	handedBack                  // given back to its acknowledged source (WithHandBack)
	failed                      // its error stops the run, counted in the row's errors
	interrupted                 // failed without an error of its own: the run stopped, its destination failed, user code panicked
	abandoned                   // not started: the run is stopping
	drained                     // not started: a drained budget
	refused                     // counted succeeded, never entered the window (the run stopped): failed
	held                        // out of the worker's hands, held by its key's breaker (breaker.go): not started, until resumed
	resumed                     // a held item taken back: no longer not started; it goes on to another ending
)

// fate is what end needs to know of the item in hand beyond its error: set by attempts
// and setAside for the endings that follow failed attempts.
type fate struct {
	attempts int  // the item's attempts so far
	noDL     bool // failed: it would have been set aside had the stage a destination
	// mark is, for deadLettered, the record the destination took (without the item),
	// for handedBack what its source is told.
	mark ackMark
}

// end settles outcome o of the item in hand, or of n items for abandoned and refused,
// and returns the error that stops the worker, if any. It is the one place where a
// worker counts its items (the tally) and where an ending reaches the budget, the
// tracker, the reorder window and the run's events: see DESIGN.md, section 1.3.
//
// For succeeded, out is the output of a one-to-one stage (a flat stage's are in w.buf);
// for retried, failed, interrupted, deadLettered and handedBack, err is the item's
// error (the last attempt's, or for interrupted the one that stops the run), with w.f.
// An item is counted before anything that may panic after it (a settle callback, an
// inline operator past the window), so that it is never counted twice.
func (w *worker[In, Out]) end(o outcome, out *Out, n int, err error) error {
	if o == succeeded && w.fast { // first, apart: the one outcome of nearly every item
		var perr error
		if !w.quiet {
			perr = w.out.put(*out, w.pos) // counted after: a panic downstream leaves the item failed, not both
		}
		w.t.emitted++
		w.t.succeeded++
		w.inHand = false
		return perr
	}
	if o == succeeded && w.pending { // an ordered one-to-one worker's one outcome of nearly every item
		// Its output waits in its slot, to enter the window with the rest of the run
		// (settle); refused if the run stops before.
		w.ord.fill(w.si, w.pos, out)
		w.pendRun(slotReady)
		w.t.succeeded++
		w.inHand = false
		if w.budget == nil {
			return nil
		}
		return w.record(false)
	}
	return w.endMore(o, out, n, err)
}

// endMore is end for every outcome but a succeeded one of a fast or pending worker:
// apart, so that end's own frame stays small for nearly every item. Only end calls it.
func (w *worker[In, Out]) endMore(o outcome, out *Out, n int, err error) error {
	if o == succeeded {
		switch {
		case w.direct: // end's first lines, with the budget recorded below (a call to record in end costs every item a larger frame: 3x4 +2 % by callgrind)
			if !w.quiet {
				err = w.out.put(*out, w.pos) // counted after, as in end
			}
			w.t.emitted++
			w.t.succeeded++
			w.inHand = false
		default:
			err = w.deliver(w.ctx)
		}
		if err != nil || w.budget == nil {
			return err
		}
		return w.record(false)
	}
	return w.endOther(o, n, err)
}

// deliver is end's succeeded for a flat stage: it hands the item's outputs on, or to
// the window, and counts it.
func (w *worker[In, Out]) deliver(ctx context.Context) (err error) {
	if w.ord != nil {
		return w.enter(ctx)
	}
	err = w.putAll()
	w.t.succeeded++
	w.inHand = false
	return err
}

// endOther is end for every outcome but succeeded. Only endMore calls it.
func (w *worker[In, Out]) endOther(o outcome, n int, err error) error {
	ctx := w.ctx
	switch o {
	case retried:
		w.t.retried++
		w.row.addError(errTypeName(err), func(e *ErrorCount) { e.Retried++ })
		w.r.emit(ctx, Event{Kind: EventRetry, Stage: w.st.name, Attempt: w.f.attempts, Err: err})
		return nil
	case deadLettered, handedBack:
		// Settled first: a panic in a settle callback (FromAcked) leaves the item
		// failed, as after a sink, not counted twice. A destination's Commit has
		// settled it already (w.pos is noPos then: commit.go).
		w.out.setAside(w.pos, &w.f.mark)
		w.t.deadLettered++ // a hand-back too: the Settlement tells the two apart
		if o == handedBack {
			w.t.handedBack++ // of those dead-lettered, for the report's HandedBack
		}
		w.inHand = false
		typ := errTypeName(err)
		w.row.addCause(typ, causeMessage(err))
		w.row.addError(typ, func(e *ErrorCount) { e.DeadLettered++ })
		if o == deadLettered {
			w.r.emit(ctx, Event{Kind: EventDeadLetter, Stage: w.st.name, Attempt: w.f.attempts, Err: err})
		}
		if err := w.skip(ctx); err != nil {
			return err
		}
		return w.record(true)
	case failed:
		w.t.failed++
		w.inHand = false
		w.row.addError(errTypeName(err), func(e *ErrorCount) { e.Failed++ })
		return &StageError{Stage: w.st.name, Err: err, Attempts: w.f.attempts, NoDeadLetter: w.f.noDL}
	case interrupted:
		w.t.failed++
		w.inHand = false
		return err
	case abandoned:
		w.t.discarded += int64(n)
		return nil
	case drained:
		w.t.discarded++
		return w.skip(ctx)
	case refused:
		w.t.succeeded -= int64(n)
		w.t.failed += int64(n)
		return nil
	case held:
		w.t.discarded++ // not started until taken back, and so if the run stops first
		w.inHand = false
		return nil
	case resumed:
		w.t.discarded--
		return nil
	}
	panic("pipeline: internal error: an unknown outcome")
}

// putAll sends a flat stage's outputs of the item in hand downstream, counting each. If
// the run stops midway, every remaining output is still offered, so that each is
// counted (sent, or unsent) and none is lost from the accounting.
func (w *worker[In, Out]) putAll() error {
	w.out.split(w.pos, len(w.buf))
	var first error
	for _, o := range w.buf {
		if err := w.out.put(o, w.pos); err != nil && first == nil {
			first = err
		}
		w.t.emitted++
	}
	clear(w.buf)
	w.buf = w.buf[:0]
	return first
}

// enter hands a flat ordered stage's outputs of the item in hand to the window. The
// item is counted first: the window's from the moment it enters, it is counted once
// even if an inline operator downstream panics while the window is flushed.
func (w *worker[In, Out]) enter(ctx context.Context) error {
	w.out.split(w.pos, len(w.buf))
	w.t.succeeded++
	w.inHand = false
	w.publish() // the window may wait
	entered, err := w.ord.settle(ctx, w.stats, w.seq, w.pos, w.buf, false)
	clear(w.buf)
	w.buf = w.buf[:0]
	if !entered {
		_ = w.end(refused, nil, 1, nil)
	}
	return err
}

// abandon ends the run with err: the items after the current one, and the current
// one itself when current is 1, are not started. What the run finished before (an
// ordered one-to-one stage's outcomes, kept to be settled together) is the window's all
// the same, so that each item is counted once: settled into the window, or refused if
// it never enters.
func (w *worker[In, Out]) abandon(ctx context.Context, current int, err error) error {
	_ = w.end(abandoned, nil, current+w.rest(), nil)
	if len(w.pend) > 0 {
		_ = w.settle(ctx) // err, the run's cause or the item's, is what the run returns
	}
	return err
}

// settle hands the run's finished items of an ordered one-to-one stage to the window.
func (w *worker[In, Out]) settle(ctx context.Context) error {
	w.publish() // the window may wait
	if len(w.pend) == 0 {
		return nil
	}
	entered, err := w.ord.settleRun(ctx, w.stats, w.pseq, w.pend, func() { w.pend = w.pend[:0] })
	if !entered { // the run stopped before the window had room: never handed on
		w.refusePending()
	}
	return err
}

// pendRun adds the item in hand, of state st (slotReady: its output is in its slot;
// slotSkip: none), to the run's items to settle together. They are consecutive: a
// run's items in order, since its start or the last settle.
func (w *worker[In, Out]) pendRun(st slotState) {
	if len(w.pend) == 0 {
		w.pseq = w.seq
	} else if w.seq != w.pseq+uint64(len(w.pend)) {
		panic("pipeline: internal error: a run's outcomes are not consecutive")
	}
	w.pend = append(w.pend, st)
}

// refusePending ends the run's finished items of an ordered one-to-one stage that
// never entered the window: failed.
func (w *worker[In, Out]) refusePending() {
	if n := len(w.pend) - bytes.Count(w.pend, []byte{slotSkip}); n > 0 {
		_ = w.end(refused, nil, n, nil)
	}
	w.pend = w.pend[:0]
}

// attempt makes one call of the stage function, under the per-attempt timeout if any.
// Only the call is timed: delivering the result happens after, outside the deadline.
func (w *worker[In, Out]) attempt(ctx context.Context, v In) (out Out, err error) {
	if trace.IsEnabled() {
		defer trace.StartRegion(ctx, w.st.name).End()
	}
	if w.sink {
		ctx = w.out.scope(ctx, &w.pos) // for Commit (commit.go)
	}
	return w.timedCall(ctx, v)
}

// timedCall is attempt's call of the stage function, under the per-attempt timeout if
// any: one call in 64 is timed, or every one while they are slow enough for the
// clock's cost not to matter.
func (w *worker[In, Out]) timedCall(ctx context.Context, v In) (out Out, err error) {
	var t0 time.Time
	timed := w.untimed == 0
	if timed {
		t0 = time.Now()
	} else {
		w.untimed--
	}
	if w.st.cfg.timeout <= 0 {
		out, err = w.call(ctx, v)
	} else {
		out, err = w.timeoutCall(ctx, v)
	}
	if timed {
		w.measured(t0)
	}
	return out, err
}

// measured records how long an attempt begun at t0 took: the latency histogram, the
// worker's clock, and the runs it takes.
func (w *worker[In, Out]) measured(t0 time.Time) {
	d := time.Since(t0)
	w.clock = t0.Sub(w.r.started) + d
	w.stats.lat.record(d)
	w.untimed = 63 // the next 63 attempts are not timed, unless this one was slow
	if d > 20*time.Microsecond {
		w.untimed = 0
	}
	w.runMax, w.share = chunk, chunk
	if d > 0 {
		w.runMax = int(min(max(runBudget/d, 1), chunk))
		w.share = int(min(max(splitWork/d, 1), chunk))
	}
}

func (w *worker[In, Out]) call(ctx context.Context, v In) (Out, error) {
	if w.st.flat == nil {
		return w.st.fn(ctx, v)
	}
	clear(w.buf)
	w.buf = w.buf[:0]
	var zero Out
	w.inFlat = true
	err := w.st.flat(ctx, v, w.emit)
	w.inFlat = false
	return zero, err
}

// skip tells the reorder window, if any, that the current item has no output, so that
// it does not stall the items behind it.
func (w *worker[In, Out]) skip(ctx context.Context) error {
	if w.ord == nil {
		return nil
	}
	if w.st.flat == nil {
		w.pendRun(slotSkip)
		return nil
	}
	w.publish() // the window may wait
	_, err := w.ord.settle(ctx, w.stats, w.seq, w.pos, nil, true)
	return err
}

// hold is called before a worker waits for long with an item in hand (a retry's
// backoff, a breaker that may hold the attempt): it hands on the outputs of its run's
// earlier items and publishes its counts and its attempt clock first.
func (w *worker[In, Out]) hold(ctx context.Context) error {
	w.publish()
	if err := w.settle(ctx); err != nil {
		return err
	}
	w.commit()
	if w.out.flush != nil {
		return w.out.flush()
	}
	return nil
}
