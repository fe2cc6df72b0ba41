package pipeline

import (
	"context"
	"fmt"
	"runtime/trace"
	"sync/atomic"
	"time"
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
	sink    bool
	cfg     config
	dl      func(context.Context, DeadLetter[In]) error
	hash    func(In) uint64 // WithKey
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
// against [WithTimeout]. emit must not be used after fn returns. The outputs of one item
// are held in memory until sent.
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
		fn:   func(ctx context.Context, v In) (struct{}, error) { return struct{}{}, fn(ctx, v) },
		sink: true,
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
	st.cfg = configure(fmt.Sprintf("%s(%q)", ctor, name), opts, StageOption.stageOption)
	if st.cfg.deadLetter != nil {
		dl, ok := st.cfg.deadLetter.(func(context.Context, DeadLetter[In]) error)
		if !ok {
			var zero In
			panic(fmt.Sprintf("pipeline: %s(%q): WithDeadLetter for another item type (%T) on a stage of %T",
				ctor, name, st.cfg.deadLetter, zero))
		}
		st.dl = dl
	}
	if st.cfg.key != nil {
		hash, ok := st.cfg.key.(func(In) uint64)
		if !ok {
			var zero In
			panic(fmt.Sprintf("pipeline: %s(%q): WithKey for another item type on a stage of %T", ctor, name, zero))
		}
		if st.cfg.ordered {
			panic(fmt.Sprintf("pipeline: %s(%q): WithKey and WithOrdered together; WithKey already keeps order per key", ctor, name))
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
	// open wires the stream into run r: from then on the producer calls push for every
	// item, from any number of goroutines, and calls done exactly once after its last
	// push (also when it fails).
	open func(r *run, push pushFunc[T], done func())
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
	kind := kindStage
	if st.sink {
		kind = kindSink
	}
	out.open = func(r *run, push pushFunc[Out], done func()) {
		var q inbox[In]
		switch {
		case st.hash != nil:
			q = newKeyedQueue(st.workers, buf, st.hash)
		case st.cfg.ordered:
			q = newOrderedQueue[In](buf)
		default:
			q = newQueue[In](buf)
		}
		rw := r.newRow(name, kind, st.workers, buf, q)
		rw.timeout = st.cfg.timeout
		wireInput(r, rw, s, q.pusher(r.ctx), q.close)
		r.addRow(rw)
		defer r.feeds(rw)
		b := r.shared
		if st.cfg.budget != nil {
			b = newBudgetState(*st.cfg.budget)
		}
		var ord *reorder[Out]
		if st.cfg.ordered {
			window := st.cfg.window
			if window == 0 {
				window = buf + 4*st.workers
			}
			ord = newReorder(window, push)
			rw.held, rw.extra = ord.heldCount, window
		}
		cl := newClient(r, rw, st) // client.go: nil without rate limit, breaker or adaptive workers
		var left atomic.Int32
		left.Store(int32(st.workers))
		var failed atomic.Bool // a worker failed: downstream sees no end of input
		for i := range st.workers {
			w := &worker[In, Out]{st: st, r: r, row: rw, stats: &rw.workers[i], push: push, budget: b, classify: classify, ord: ord, cl: cl, id: i}
			w.ch, w.och = q.bind(i)
			if kq, ok := q.(*keyedQueue[In]); ok {
				w.slots = kq.slots
			}
			if st.flat != nil {
				w.emit = func(o Out) { w.buf = append(w.buf, o) }
			}
			r.spawn(name, func() (err error) {
				returned := false
				defer func() {
					if err != nil || !returned { // an error, or runtime.Goexit
						failed.Store(true)
					}
					if left.Add(-1) == 0 {
						r.emit(Event{Kind: EventStageDone, Stage: name}) // before the next stage can end
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
	}
	return out
}

// To ends stream s in sink: every item of s is passed to the sink's function. Use
// [NewSink] to make one. It panics like [Then].
func To[T any](s *Stream[T], sink *Stage[T, struct{}]) {
	s.check("To")
	if sink == nil {
		panic("pipeline: To: nil *Stage")
	}
	out := Then(s, sink)
	out.consumed = true
	s.p.terminals = append(s.p.terminals, func(r *run) {
		// The sink's function returned nil: the item's effect is committed.
		out.open(r, func(_ struct{}, pos uint64) error {
			r.track.done(pos)
			return nil
		}, func() {})
	})
}

// worker is one goroutine of a stage in one run.
type worker[In, Out any] struct {
	st       *Stage[In, Out]
	r        *run
	row      *row
	stats    *workerStats
	push     pushFunc[Out]
	budget   *budgetState
	classify func(error) Class
	buf      []Out            // outputs of the current attempt (flat stages)
	emit     func(Out)        // appends to buf (flat stages)
	ch       chan item[In]    // the worker's input: plain and keyed stages
	slots    chan struct{}    // keyed stages: the stage's buffer, shared by its channels
	och      chan seqItem[In] // the worker's input: ordered stages
	pos      uint64           // the current item's source position (checkpointed runs)
	seq      uint64           // the current item's sequence number (ordered stages)
	ord      *reorder[Out]    // the reorder window (ordered stages)
	one      [1]Out           // a one-to-one output handed to the window
	slow     bool             // the last timed attempt took long: time every attempt
	busy     bool             // an item is in hand and not yet counted: a panic fails it
	ctxs     attemptSlab      // WithTimeout: fresh attempt contexts
	cl       *client[In]      // rate limits, breaker, adaptive workers (client.go); nil without
	id       int              // the worker's index in its stage
	tk       ticket           // the current attempt's, from w.cl (client.go)
}

// loop takes items until the queue is closed and drained (nil) or the run stops (its
// cause). A panic in user code fails the run as a *PanicError; the item in flight is
// counted as failed.
func (w *worker[In, Out]) loop() (err error) {
	returned := false
	defer func() {
		v := recover()
		if v == nil && returned {
			return
		}
		if w.busy {
			w.stats.failed.inc()
		}
		if v == nil { // runtime.Goexit: the goroutine goes on ending; r.spawn fails the run
			w.row.addError("goexit", func(e *ErrorCount) { e.Failed++ })
			return
		}
		w.row.addError("panic", func(e *ErrorCount) { e.Failed++ })
		err = &StageError{Stage: w.st.name, Err: newPanicError(v)}
	}()
	err = w.take(w.r.ctx)
	returned = true
	return err
}

// take is the worker's loop over its input.
func (w *worker[In, Out]) take(ctx context.Context) error {
	var adapt *adaptive // WithAdaptiveWorkers (adaptive.go): nil, so one register test per item
	if w.cl != nil {
		adapt = w.cl.adapt
	}
	for {
		var (
			v      In
			ok     bool
			err    error
			queued int
		)
		if adapt != nil { // above the adaptive limit: wait
			if err := adapt.gate(ctx, w.id); err != nil {
				return err
			}
		}
		switch {
		case w.slots != nil: // keyed: the slots count what waits in every worker's channel
			var e item[In]
			if e, ok, err = recv(ctx, w.ch); ok {
				queued = len(w.slots)
				<-w.slots
			}
			v, w.pos = e.v, e.pos
		case w.och == nil:
			var e item[In]
			e, ok, err = recv(ctx, w.ch)
			v, w.pos, queued = e.v, e.pos, min(len(w.ch)+1, cap(w.ch))
		default:
			var e seqItem[In]
			e, ok, err = recv(ctx, w.och)
			v, w.pos, w.seq, queued = e.v, e.pos, e.seq, min(len(w.och)+1, cap(w.och))
		}
		if !ok {
			if w.cl != nil {
				w.cl.ended()
			}
			return err
		}
		w.stats.received.inc()
		if ctx.Err() != nil { // the run is stopping: start nothing new
			w.stats.discarded.inc()
			return context.Cause(ctx)
		}
		w.stats.peak.max(int64(queued))
		if w.ord != nil { // start only what the reorder window has room for
			if err := w.ord.admit(ctx, w.seq); err != nil {
				w.stats.discarded.inc()
				return err
			}
		}
		if w.row.drain.Load() {
			w.stats.discarded.inc() // a drained budget: start no new item
			if err := w.skip(ctx); err != nil {
				return err
			}
			continue
		}
		w.busy = true
		w.stats.busy.v.Store(1)
		err = w.process(ctx, v)
		w.stats.busy.v.Store(0)
		w.busy = false
		if err != nil {
			return err
		}
	}
}

// attempt makes one call of the stage function, under the per-attempt timeout if any.
// Only the call is timed: delivering the result happens after, outside the deadline.
func (w *worker[In, Out]) attempt(ctx context.Context, v In) (out Out, err error) {
	if trace.IsEnabled() {
		defer trace.StartRegion(ctx, w.st.name).End()
	}
	if w.st.sink && w.r.track != nil && w.pos != noPos {
		ctx = w.r.track.scope(ctx, &w.pos) // for Commit (commit.go)
	}
	// Time one attempt in 16, or every one while they are slow enough for the clock's
	// cost not to matter.
	var t0 time.Time
	timed := w.slow || w.stats.received.load()&15 == 0
	if timed {
		t0 = time.Now()
	}
	if d := w.st.cfg.timeout; d <= 0 {
		out, err = w.call(ctx, v)
	} else {
		a := w.ctxs.next()
		a.start(ctx, w.r.started, d)
		out, err = w.call(a, v)
		if err != nil && a.timedOut() {
			err = &timeoutError{after: d, err: err}
		}
		a.end()
	}
	if timed {
		d := time.Since(t0)
		w.stats.lat.record(d)
		w.slow = d > 20*time.Microsecond
	}
	return out, err
}

func (w *worker[In, Out]) call(ctx context.Context, v In) (Out, error) {
	if w.st.flat == nil {
		return w.st.fn(ctx, v)
	}
	clear(w.buf)
	w.buf = w.buf[:0]
	var zero Out
	return zero, w.st.flat(ctx, v, w.emit)
}

// deliver sends an item's outputs downstream. If the run stops midway, every remaining
// output is still offered, so that each is counted (sent, or unsent) and none is lost
// from the accounting.
//
// handed is false when the item could not even be handed to the reorder window (an
// ordered stage whose run stopped while the item waited for room).
func (w *worker[In, Out]) deliver(ctx context.Context, out Out) (handed bool, err error) {
	if w.ord != nil {
		outs := w.buf
		if w.st.flat == nil {
			w.one[0] = out
			outs = w.one[:]
		}
		w.r.track.split(w.pos, len(outs))
		handed, err := w.ord.settle(ctx, w.stats, w.seq, w.pos, outs, false, w.enteredWindow)
		clear(outs)
		w.buf = w.buf[:0]
		return handed, err
	}
	if w.st.flat == nil {
		err := w.push(out, w.pos)
		w.stats.emitted.inc()
		return true, err
	}
	w.r.track.split(w.pos, len(w.buf))
	var first error
	for _, o := range w.buf {
		if err := w.push(o, w.pos); err != nil && first == nil {
			first = err
		}
		w.stats.emitted.inc()
	}
	clear(w.buf)
	w.buf = w.buf[:0]
	return true, first
}

// enteredWindow counts an ordered stage's item as succeeded once the reorder window
// holds it: from then on the window accounts for it.
func (w *worker[In, Out]) enteredWindow() {
	w.stats.succeeded.inc()
	w.busy = false
}

// fail counts the current item as failed by err, its error after attempts calls, which
// stops the run; noDeadLetter tells that it would have been set aside had the stage a
// destination.
func (w *worker[In, Out]) fail(err error, attempts int, noDeadLetter bool) error {
	w.stats.failed.inc()
	w.row.addError(errTypeName(err), func(e *ErrorCount) { e.Failed++ })
	return &StageError{Stage: w.st.name, Err: err, Attempts: attempts, NoDeadLetter: noDeadLetter}
}

// skip tells the reorder window, if any, that the current item has no output, so that
// it does not stall the items behind it.
func (w *worker[In, Out]) skip(ctx context.Context) error {
	if w.ord == nil {
		return nil
	}
	_, err := w.ord.settle(ctx, w.stats, w.seq, w.pos, nil, true, func() { w.busy = false }) // counted already
	return err
}
