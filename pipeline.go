package pipeline

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"runtime/trace"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Pipeline is a graph of sources, stages and sinks, built with the package's top-level
// functions ([FromSlice], [Then], [To], ...) and executed by [Pipeline.Run], [Collect]
// or [All]. Building is not safe for concurrent use; a built pipeline may be run any
// number of times, one run at a time, as long as its sources can be read again (a
// slice or an [iter.Seq] can, a channel cannot). Each run has its own queues, workers
// and counters. The zero value is not usable: call [New].
type Pipeline struct {
	cfg       config
	names     map[string]struct{}
	streams   []consumable
	terminals []func(r *run)
	running   atomic.Bool
	ck        *checkpointCfg
	cur       atomic.Pointer[run] // the run in progress, for Snapshot

	mu      sync.Mutex
	report  Report
	runs    uint64       // runs started
	samples []rateSample // recent Snapshots of the current run, for rates
}

// New returns an empty pipeline. Options given here apply to the run as a whole:
// [WithBuffer] sets the default queue size of every stage, [WithErrorBudget] sets a
// budget shared by all stages. An option that only makes sense on one stage panics.
func New(opts ...Option) *Pipeline {
	p := &Pipeline{names: make(map[string]struct{}), report: Report{Checkpoint: -1}}
	for _, o := range opts {
		o.apply(&p.cfg)
	}
	if p.cfg.stageOnly != "" {
		panic(fmt.Sprintf("pipeline: %s is a stage option, not a pipeline option", p.cfg.stageOnly))
	}
	return p
}

type consumable interface {
	isConsumed() bool
	describe() string
}

// claim reserves a unique name in this pipeline. Stage names must be unique because the
// report and the errors identify stages by name. Rows the package names itself (sources,
// filters, batches, All) take their constructor's name, numbered when it is taken.
func (p *Pipeline) claim(name string, unique bool) string {
	if _, dup := p.names[name]; !dup {
		p.names[name] = struct{}{}
		return name
	}
	if unique {
		panic(fmt.Sprintf("pipeline: stage name %q is already used in this pipeline (by a stage, or a source, filter or batch named after its constructor)", name))
	}
	for i := 2; ; i++ {
		n := fmt.Sprintf("%s#%d", name, i)
		if _, dup := p.names[n]; !dup {
			p.names[n] = struct{}{}
			return n
		}
	}
}

// Run executes the pipeline and blocks until every goroutine it started has exited.
//
// It returns nil when every item reached its sink (or was filtered, or dead-lettered by
// a stage's policy); the first fatal error, as a [*StageError] naming the stage, after
// cancelling every other stage and source; a [*StageError] wrapping a [*BudgetError]
// when an error budget tripped; or [context.Cause] of ctx when ctx was canceled first.
// The [Pipeline.Report] of the run is ready when Run returns.
//
// Run panics when some stream has no consumer, when no sink was attached, or when the
// pipeline is already running.
func (p *Pipeline) Run(ctx context.Context) error {
	p.begin(false)
	r, err := p.exec(ctx, nil)
	return p.finish(r, err)
}

// Report returns the report of the last finished run (the zero Report before any).
// It is safe to call at any time, also from another goroutine during a run.
func (p *Pipeline) Report() Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.report
}

// begin checks the graph and marks the pipeline as running; misuse panics here, in the
// caller's goroutine. extra tells whether a terminal outside p.terminals will be added.
func (p *Pipeline) begin(extra bool) {
	for _, s := range p.streams {
		if !s.isConsumed() {
			panic(fmt.Sprintf("pipeline: the output of %s is never consumed; end it with To, Collect or All", s.describe()))
		}
	}
	if len(p.terminals) == 0 && !extra {
		panic("pipeline: Run on a pipeline without a sink; end it with To, Collect or All")
	}
	if !p.running.CompareAndSwap(false, true) {
		panic("pipeline: Run called while the pipeline is already running")
	}
}

// exec wires and runs the graph, then waits for every goroutine. extra, when not nil,
// attaches a terminal that is not part of the pipeline (the consumer of [All]).
func (p *Pipeline) exec(ctx context.Context, extra func(r *run)) (*run, error) {
	r := &run{p: p, parent: ctx, started: time.Now()}
	p.mu.Lock()
	p.runs++
	r.number = p.runs
	p.mu.Unlock()
	if trace.IsEnabled() { // go tool trace shows each run as a task, each attempt as a region
		var task *trace.Task
		ctx, task = trace.NewTask(ctx, "pipeline.Run")
		defer task.End()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.cancel = cancel
	if ck := p.ck; ck != nil {
		pos, skip, err := loadCheckpoint(ctx, ck.store) // commit.go
		if err != nil {
			return r, &StageError{Stage: "checkpoint", Err: fmt.Errorf("load: %w", err)}
		}
		ck.loaded = pos
		r.track = newTracker(ck.source, uint64(pos), ck.every)
		r.track.skip = skip
		r.saved.Store(pos)
	}
	g, gctx := errgroup.WithContext(ctx)
	r.ctx, r.g = gctx, g
	if p.cfg.budget != nil {
		r.shared = newBudgetState(*p.cfg.budget)
	}
	for _, t := range p.terminals {
		t(r)
	}
	if extra != nil {
		extra(r)
	}
	if r.track != nil {
		r.track.limit = uint64(p.ck.maxRedo)
		if p.ck.maxRedo == 0 {
			r.track.limit = uint64(p.ck.every + r.inflight())
		}
	}
	p.cur.Store(r)
	for _, fn := range r.pending {
		g.Go(fn)
	}
	r.pending = nil
	stop, saverDone := make(chan struct{}), make(chan struct{})
	if r.track != nil {
		go func() {
			defer close(saverDone)
			r.track.saver(gctx, p.ck.store, p.ck.interval, stop, r)
		}()
	} else {
		close(saverDone)
	}
	err := g.Wait()
	close(stop)
	<-saverDone
	if f := r.failure.Load(); f != nil && (err == nil || errors.Is(err, f)) {
		err = f
	}
	if err == nil {
		if d := r.drained.Load(); d != nil {
			err = d
		} else if r.parent.Err() != nil {
			// Canceled before anything failed, even before the run started (sources and
			// workers then start no item): the run did not do all its work.
			err = context.Cause(r.parent)
		}
	}
	return r, err
}

// finish saves a checkpointed run's final position, builds the report of the run and
// publishes it. It returns the run's error, or the final save's.
func (p *Pipeline) finish(r *run, err error) error {
	if r.track != nil {
		if w := r.track.watermark(); w != r.saved.Load() {
			if serr := p.ck.store.Save(context.WithoutCancel(r.parent), w); serr != nil {
				if err == nil {
					err = &StageError{Stage: "checkpoint", Err: serr}
				}
			} else {
				r.saved.Store(w)
				r.savedAt.Store(time.Now().UnixNano())
				r.emit(Event{Kind: EventCheckpoint, Stage: "checkpoint", Position: w})
			}
		}
	}
	if f := r.failure.Load(); f != nil && err == nil { // an observer of the final save panicked
		err = f
	}
	rep := r.report(err, true)
	p.mu.Lock()
	p.report = rep
	p.mu.Unlock()
	p.cur.Store(nil) // after the report is published: a Snapshot never sees an older one
	p.running.Store(false)
	return err
}

// run is the state of one execution: its context, its goroutines and its counters.
type run struct {
	p        *Pipeline
	parent   context.Context // the caller's context, for the final checkpoint save
	saved    atomic.Int64    // the last position saved (checkpointed runs)
	savedAt  atomic.Int64    // when, in Unix nanoseconds
	started  time.Time
	number   uint64 // 1 for the pipeline's first run
	ctx      context.Context
	g        *errgroup.Group
	rows     []*row
	shared   *budgetState
	drained  atomic.Pointer[StageError] // the error Run returns after a drain
	failure  atomic.Pointer[StageError] // a failure outside the goroutines' returns (an observer's panic)
	cancel   context.CancelCauseFunc    // cancels the run with a cause
	track    *tracker                   // the checkpoint's watermark, nil when none
	pending  []func() error             // goroutines to start once the graph is wired
	consumer *row                       // while wiring: the stage whose input is being opened
}

// fail stops the run with err, unless it has already failed.
func (r *run) fail(err *StageError) {
	if r.failure.CompareAndSwap(nil, err) && r.cancel != nil {
		r.cancel(err)
	}
}

// spawn registers fn to run in the run's group once the whole graph is wired.
func (r *run) spawn(fn func() error) { r.pending = append(r.pending, fn) }

// goSafe spawns fn; a panic in fn becomes a [*PanicError] that fails the run under the
// given name.
func (r *run) goSafe(name string, fn func() error) {
	r.spawn(func() (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = &StageError{Stage: name, Err: newPanicError(v)}
			}
		}()
		return fn()
	})
}

// errStopped is the cause with which [All] stops a run when the loop body breaks out.
var errStopped = errors.New("pipeline: iteration stopped")

// Collect runs the pipeline that s belongs to, with s as its last stream, and returns
// the items that reached the end, in arrival order. On failure it returns the items
// collected so far with the run's error (see [Pipeline.Run]). Memory grows with the
// output: for large outputs, use [All] or [To].
func Collect[T any](ctx context.Context, s *Stream[T]) ([]T, error) {
	var out []T
	for v, err := range All(ctx, s) {
		if err != nil {
			return out, err
		}
		out = append(out, v)
	}
	return out, nil
}

// All runs the pipeline that s belongs to, with s as its last stream, and yields each
// item that reaches the end, in arrival order, with a nil error. If the run fails, the
// last pair yielded is a zero value with the run's error (see [Pipeline.Run]).
//
// The loop body runs in the caller's goroutine while the stages run in their own; a
// slow body applies backpressure through the whole pipeline. Breaking out of the loop
// cancels the run, and the loop statement returns only after every goroutine of the run
// has exited. Each range over the sequence is a new run.
func All[T any](ctx context.Context, s *Stream[T]) iter.Seq2[T, error] {
	p := s.p
	s.consume("All")
	name := p.claim("All", false)
	buf := p.cfg.bufferOr(DefaultBuffer)
	return func(yield func(T, error) bool) {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		q := newQueue[T](buf)
		type result struct {
			r   *run
			err error
		}
		var (
			rw    *row
			tr    *tracker
			wired = make(chan struct{})
			done  = make(chan result, 1)
		)
		p.begin(true)
		go func() {
			r, err := p.exec(ctx, func(r *run) {
				rw, tr = r.newRow(name, kindSink, 1, buf, q), r.track
				s.open(r, q.pusher(r.ctx), q.close)
				r.addRow(rw)
				close(wired)
			})
			done <- result{r, err}
		}()
		var (
			res                               result
			stopped, finished, gotRes, inHand bool
		)
		select {
		case <-wired:
		case res = <-done:
			gotRes = true
			select {
			case <-wired: // wired, and already over: take what it left in the queue
			default: // it failed before it was wired (a checkpoint that cannot be loaded)
				yield(*new(T), p.finish(res.r, res.err))
				return
			}
		}
		defer func() {
			if !finished { // the loop body panicked: stop the run and wait for it
				if inHand {
					rw.workers[0].failed.inc()
				}
				cancel(errStopped)
				if !gotRes {
					res = <-done
				}
				_ = p.finish(res.r, nil)
			}
		}()
		w := &rw.workers[0]
		for {
			// Take items until the queue is closed (the run succeeded, or drained) or
			// the run has failed: after a failure the queue is not closed.
			var e item[T]
			var ok bool
			if gotRes {
				if d := res.r.drained.Load(); res.err != nil && (d == nil || res.err != error(d)) { //nolint:errorlint // identity: the very error a drain returns
					break // failed: the queue is not closed; a drained run's is
				}
				e, ok = <-q.ch
			} else {
				select {
				case e, ok = <-q.ch:
				case res = <-done:
					gotRes = true
					continue
				}
			}
			if !ok {
				break
			}
			w.peak.max(int64(min(len(q.ch)+1, cap(q.ch))))
			w.received.inc()
			inHand = true
			more := yield(e.v, nil)
			inHand = false
			w.succeeded.inc()
			if !more {
				stopped = true
				cancel(errStopped)
				break
			}
			tr.done(e.pos) // the loop body is done with it: committed
		}
		finished = true
		if !gotRes {
			res = <-done
		}
		err := res.err
		if stopped && errors.Is(err, errStopped) {
			err = nil
		}
		err = p.finish(res.r, err)
		if err != nil && !stopped {
			var zero T
			yield(zero, err)
		}
	}
}

// WorkersNeeded returns how many workers a stage needs to sustain targetPerSecond items
// per second when one item takes latency, with headroom (1.25 means 25 % spare): by
// Little's law, the items in service at once are rate × latency. The result is at least
// 1. It panics if targetPerSecond or latency is negative, or headroom is less than 1.
//
//	WorkersNeeded(750, 20*time.Millisecond, 1.25) // 19
func WorkersNeeded(targetPerSecond float64, latency time.Duration, headroom float64) int {
	if !(targetPerSecond >= 0) || latency < 0 || !(headroom >= 1) || math.IsInf(targetPerSecond, 0) || math.IsInf(headroom, 0) {
		panic(fmt.Sprintf("pipeline: WorkersNeeded(%v, %v, %v): need a finite rate >= 0, latency >= 0, headroom >= 1",
			targetPerSecond, latency, headroom))
	}
	n := math.Ceil(targetPerSecond * float64(latency) * headroom / 1e9) // 100/s × 70 ms is 7, not 7.000000000000001
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(1, int(n))
}
