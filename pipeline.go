package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Pipeline is a graph of sources, stages and sinks, built with the package's top-level
// functions ([FromSlice], [Then], [To], ...) and executed by [Pipeline.Run] or, when
// it ends in a stream read by the caller, by [Collect] or [All]. Building is not safe
// for concurrent use; a built pipeline may be run any number of times, one run at a
// time (by Run, or by Collect or All on the same stream again; one called while a run is
// in progress returns [ErrRunning]), as long as its sources
// can be read again (a slice or an [iter.Seq] can, a channel cannot). Each run has its
// own queues, workers and counters. The zero value is not usable: call [New].
type Pipeline struct {
	cfg       config
	names     map[string]struct{}
	streams   []consumable
	terminals []func(r *run)
	running   atomic.Bool
	ck        *checkpointCfg
	ack       *ackCfg             // an acknowledged source (ack.go)
	cur       atomic.Pointer[run] // the run in progress, for Snapshot
	end       *collectEnd         // the stream read by Collect or All, if any

	mu      sync.Mutex
	report  Report
	runs    uint64       // runs started
	samples []rateSample // recent Snapshots of the current run, for rates

	recent    []latencySample // Snapshots' latency histograms, for StageReport.Recent (stats.go)
	recentRun *run            // the run they are of
}

// New returns an empty pipeline. Options given here apply to the run as a whole:
// [WithBuffer] sets the default queue size of every stage, [WithErrorBudget] sets a
// budget shared by all stages, [WithClassifier] the default classifier, and
// [WithObserver] and [WithLogger] watch every run.
func New(opts ...PipelineOption) *Pipeline {
	return &Pipeline{
		cfg:   configure("New", opts, PipelineOption.pipelineOption),
		names: make(map[string]struct{}), report: Report{Checkpoint: -1},
	}
}

type consumable interface {
	isConsumed() bool
	describe() string
}

// rowName claims the name of a row that [WithName] may name: the given name, which must
// be unique, or else the constructor's, numbered when it is taken.
func (p *Pipeline) rowName(given, ctor string) string {
	if given != "" {
		return p.claim(given, true)
	}
	return p.claim(ctor, false)
}

// claim reserves a unique name in this pipeline. Stage names must be unique because the
// report and the errors identify stages by name. Rows the package names itself (sources,
// filters, batches, Collect) take their constructor's name, numbered when it is taken.
func (p *Pipeline) claim(name string, unique bool) string {
	if _, dup := p.names[name]; !dup {
		p.names[name] = struct{}{}
		return name
	}
	if unique {
		panic(fmt.Sprintf("pipeline: name %q is already used in this pipeline (by a stage, or a source, filter, batch or end named with WithName or after its constructor)", name))
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
// When the pipeline is already running (one run at a time), Run returns [ErrRunning] at
// once. Run panics when some stream has no consumer, when no sink was attached, or when
// the pipeline ends in [Collect] or [All] (which run it themselves): mistakes in how the
// pipeline was built.
func (p *Pipeline) Run(ctx context.Context) error {
	if ctx == nil {
		panic("pipeline: Run(nil): need a context")
	}
	if p.end != nil {
		panic(fmt.Sprintf("pipeline: Run on a pipeline that ends in %s (%s): run it with %s again", p.end.ctor, p.end.desc, p.end.ctor))
	}
	if err := p.begin(false); err != nil {
		return err
	}
	r, err := p.exec(p.newRun(ctx), nil)
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
// It returns [ErrRunning], and marks nothing, when the pipeline is already running.
func (p *Pipeline) begin(extra bool) error {
	for _, s := range p.streams {
		if !s.isConsumed() {
			panic(fmt.Sprintf("pipeline: the output of %s is never consumed; end it with To, Collect or All", s.describe()))
		}
	}
	if len(p.terminals) == 0 && !extra {
		panic("pipeline: Run on a pipeline without a sink; end it with To, Collect or All")
	}
	if !p.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	return nil
}

// newRun returns the state of a new run under the caller's ctx.
func (p *Pipeline) newRun(ctx context.Context) *run {
	return &run{p: p, parent: ctx, started: time.Now(), track: noTrack{}}
}

// exec wires and runs the graph of run r, then waits for every goroutine. extra, when
// not nil, attaches a terminal that is not part of the pipeline (the consumer of [All]).
func (p *Pipeline) exec(r *run, extra func(r *run)) (*run, error) {
	ctx := r.parent
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
	r.drainCh = make(chan struct{})
	var (
		ckt *checkpointTracker // the run's tracker (r.track), when it has one of these
		akt *ackTracker
	)
	if ck := p.ck; ck != nil {
		var (
			pos  int64
			skip []PositionRange
		)
		err := safely(func() (err error) { pos, skip, err = loadCheckpoint(ctx, ck.store); return err }) // commit.go
		if err == nil && pos < 0 {
			err = fmt.Errorf("%w: %d", ErrBadCheckpoint, pos)
		}
		if err != nil {
			return r, &StageError{Stage: "checkpoint", Err: fmt.Errorf("load: %w", err)}
		}
		ck.loaded = pos
		ckt = newCheckpointTracker(uint64(pos), ck.every)
		ckt.skip, ckt.prior = skip, slices.Clone(skip)
		ckt.drain = r.drainCh // a source waiting for a save stops waiting when a budget drains
		r.track = ckt
		r.saved.Store(pos)
	}
	if p.ack != nil { // an acknowledged source (ack.go)
		akt = newAckTracker()
		akt.drain = r.drainCh // likewise, waiting for room
		r.track = akt
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
	r.order()
	if ckt != nil {
		ckt.limit = uint64(p.ck.maxRedo)
		if p.ck.maxRedo == 0 {
			ckt.limit = uint64(p.ck.every + r.inflight())
		}
	}
	if akt != nil { // WithMaxPending, or the capacity in flight
		akt.max = cmp.Or(p.ack.max, max(r.inflight(), 1))
	}
	// When the run stops, every goroutine sleeping on a queue is woken: they sleep on a
	// channel of their own, not in a select over the run's done channel.
	stopDone := make(chan struct{})
	stopWake := context.AfterFunc(gctx, func() {
		defer close(stopDone)
		for _, stop := range r.stoppers {
			stop()
		}
	})
	p.cur.Store(r)
	for _, fn := range r.pending {
		g.Go(fn)
	}
	r.pending = nil
	stop, saverDone := make(chan struct{}), make(chan struct{})
	if ckt != nil {
		go func() {
			defer close(saverDone)
			// A panic or a runtime.Goexit in the store or in an observer of the saves
			// fails the run, as in any goroutine of the run.
			returned := false
			defer guard(&returned, func(err error) { r.fail(&StageError{Stage: "checkpoint", Err: err}) })
			ckt.saver(gctx, p.ck.store, p.ck.interval, stop, r)
			returned = true
		}()
	} else {
		close(saverDone)
	}
	err := g.Wait()
	if !stopWake() { // it ran, or runs: wait for it
		<-stopDone
	}
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

// finish ends the run's tracking (a checkpoint's final save, an acknowledged source's
// last settlements), builds the report of the run and publishes it. It returns the
// run's error, or the tracker's.
func (p *Pipeline) finish(r *run, err error) error {
	// The final save of a checkpoint (checkpoint.go), the acknowledged source's
	// NotProcessed settlements (ack.go).
	if terr := r.track.finish(r); terr != nil && err == nil {
		err = terr
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
	drainCh  chan struct{}              // closed when a budget drains (after the rows' drain flags are set)
	failure  atomic.Pointer[StageError] // a failure outside the goroutines' returns (an observer's panic)
	cancel   context.CancelCauseFunc    // cancels the run with a cause
	track    tracker                    // the tracked source's (tracker.go): noTrack{} when none
	pending  []func() error             // goroutines to start once the graph is wired
	stoppers []func()                   // the queues' stop: wake every sleeper when the run stops
	tees     map[any]any                // while wiring: each Tee's branches opened so far (*teeWiring[T] by *tee[T])
}

// tracked reports whether the run's items carry positions: its pipeline has a tracked
// source ([FromCheckpoint] or [FromAcked]). Wiring asks, to leave out what an untracked
// run does not need.
func (r *run) tracked() bool { return r.p.ck != nil || r.p.ack != nil }

// safely calls fn, user code that runs in the run's own goroutines (a store's Load and
// Save, an acknowledged source's settle callbacks), and returns a panic as a
// *PanicError. A runtime.Goexit goes on unwinding.
func safely(fn func() error) (err error) {
	defer guard(nil, func(perr error) { err = perr })
	return fn()
}

// fail stops the run with err, unless it has already failed.
func (r *run) fail(err *StageError) {
	if r.failure.CompareAndSwap(nil, err) && r.cancel != nil {
		r.cancel(err)
	}
}

// spawn registers fn to run in the run's group once the whole graph is wired. If user
// code calls runtime.Goexit in fn's goroutine, fn never returns: the run then fails
// with [ErrGoexit] under the given name.
func (r *run) spawn(name string, fn func() error) {
	r.pending = append(r.pending, func() error {
		returned := false
		defer guard(&returned, func(err error) {
			if pe, ok := errors.AsType[*PanicError](err); ok {
				panic(pe.Value) // not user code's: every user call is recovered closer to it
			}
			r.fail(&StageError{Stage: name, Err: err})
		})
		err := fn()
		returned = true
		return err
	})
}

// wireInput opens s, the input of the consumer row rw: the rows that feed s directly
// learn that they feed rw, and the senders of rw's outlet carry the run's tracker. It
// returns those rows (none for a Tee's branches but the last: see tee.open).
func wireInput[T any](r *run, rw *row, s *Stream[T], out outlet[T], done func()) []*row {
	return wireFed(r, rw, s, out, done, nil)
}

// wireFed is wireInput for a consumer whose queue may take a slice source's items in
// place (into.feed).
func wireFed[T any](r *run, rw *row, s *Stream[T], out outlet[T], done func(), feed func([]T, *row) bool) []*row {
	tracked := func(h *hand) sender[T] {
		snd := out(h)
		snd.track = r.track
		return snd
	}
	feeders := s.open(r, into[T]{out: tracked, done: done, rows: []*row{rw}, feed: feed})
	for _, f := range feeders {
		f.feed(rw)
	}
	return feeders
}

// order sorts the rows of the wired graph upstream first (a row after every row that
// feeds it, otherwise in wiring order; Tee wires its earlier branches before its
// upstream) and gives each row the set of rows upstream of it.
func (r *run) order() {
	byName := make(map[string]*row, len(r.rows))
	indeg := make(map[*row]int, len(r.rows))
	for _, rw := range r.rows {
		byName[rw.name] = rw
	}
	for _, rw := range r.rows {
		for _, n := range rw.next {
			indeg[byName[n]]++
		}
	}
	sorted := make([]*row, 0, len(r.rows))
	placed := make(map[*row]bool, len(r.rows))
	for len(sorted) < len(r.rows) {
		found := false
		for _, rw := range r.rows { // the first row in wiring order that nothing unplaced feeds
			if !placed[rw] && indeg[rw] == 0 {
				placed[rw], found = true, true
				sorted = append(sorted, rw)
				for _, n := range rw.next {
					indeg[byName[n]]--
				}
				break
			}
		}
		if !found {
			panic("pipeline: internal error: the graph of rows has a cycle")
		}
	}
	r.rows = sorted
	for _, rw := range sorted { // feeders come first, so their ups are complete
		for _, n := range rw.next {
			d := byName[n]
			if !slices.Contains(d.ups, rw) {
				d.ups = append(d.ups, rw)
			}
			for _, u := range rw.ups {
				if !slices.Contains(d.ups, u) {
					d.ups = append(d.ups, u)
				}
			}
		}
	}
}

// feed records that f feeds rw directly (once: a Merge of a Tee's branches feeds one
// row from one row twice).
func (f *row) feed(rw *row) {
	if !slices.Contains(f.next, rw.name) {
		f.next = append(f.next, rw.name)
	}
}

// feederOf names the row that feeds the first of rows (a Tee's branch), for an error
// of the inline operators between them: when several do (a Merge), the first.
func (r *run) feederOf(rows []*row) string {
	if len(rows) == 0 {
		return ""
	}
	for _, f := range r.rows {
		if slices.Contains(f.next, rows[0].name) {
			return f.name
		}
	}
	return rows[0].name
}

// producerOf names the row whose goroutine h is, for an error of the inline operators
// it runs: the row the item came from. Without one (a hand from no row), it falls back
// on the row that feeds the first of rows.
func (r *run) producerOf(h *hand, rows []*row) string {
	if h != nil && h.row != nil {
		return h.row.name
	}
	return r.feederOf(rows)
}

// goSafe spawns fn; a panic in fn becomes a [*PanicError] that fails the run under the
// given name.
func (r *run) goSafe(name string, fn func() error) {
	r.spawn(name, func() (err error) {
		defer guard(nil, func(perr error) { err = &StageError{Stage: name, Err: perr} })
		return fn()
	})
}

// errStopped is the cause with which [All] stops a run when the loop body breaks out.
var errStopped = errors.New("pipeline: iteration stopped")

// collectEnd is the end of a pipeline read by Collect or All.
type collectEnd struct {
	stream any // the *Stream read
	ctor   string
	desc   string
	name   string
	buf    int
	opts   config // the options of the first call: a later one gives the same, or none
}

// Collect runs the pipeline that s belongs to, with s as its last stream, and returns
// the items that reached the end, in arrival order. On failure it returns the items
// collected so far with the run's error (see [Pipeline.Run]; [ErrRunning] when the
// pipeline is running already). Memory grows with the
// output: for large outputs, use [All] or [To]. Like All, it may be called again on the
// same stream for another run, with the options of the first call or none (the first
// call's stay); other options panic. Options: [WithName] (the end's row, "Collect" by
// default) and [WithBuffer].
func Collect[T any](ctx context.Context, s *Stream[T], opts ...CollectOption) ([]T, error) {
	var out []T
	for v, err := range collect(ctx, s, "Collect", opts) {
		if err != nil {
			return out, err
		}
		out = append(out, v)
	}
	return out, nil
}

// All runs the pipeline that s belongs to, with s as its last stream, and yields each
// item that reaches the end, in arrival order, with a nil error. If the run fails, the
// last pair yielded is a zero value with the run's error (see [Pipeline.Run]); when the
// pipeline is running already, the only pair is a zero value with [ErrRunning].
//
// The loop body runs in the caller's goroutine while the stages run in their own; a
// slow body applies backpressure through the whole pipeline. Breaking out of the loop
// cancels the run, and the loop statement returns only after every goroutine of the run
// has exited. An item settles when the body is done with it, that is when the loop
// asks for the next one: the item the body broke out on (which it may not have
// handled) does not settle, so an acknowledged source ([FromAcked]) is told
// NotProcessed for it, a checkpointed run ([FromCheckpoint]) redoes it, and the end's
// row of the report counts it as Failed (in flight when the run stopped, as when the
// body panics), not as Succeeded. Each range over the sequence is a new run, and so
// is a later All or [Collect] of the same stream: it takes the options of the first
// call, or none (the first call's stay); other options panic.
//
// A pipeline has at most one stream read by All or Collect, and is run by them, not by
// [Pipeline.Run]; its other ends ([To]) run with it. Options: [WithName] (the end's row
// in the report, "All" by default) and [WithBuffer] (its queue).
func All[T any](ctx context.Context, s *Stream[T], opts ...CollectOption) iter.Seq2[T, error] {
	return collect(ctx, s, "All", opts)
}

// sameCollectOptions reports whether two calls of Collect or All gave the same options.
func sameCollectOptions(a, b config) bool {
	return a.name == b.name && a.bufferSet == b.bufferSet && (!a.bufferSet || a.buffer == b.buffer)
}

// describeCollectOptions names the options of a call of Collect or All, for a panic.
func describeCollectOptions(c config) string {
	var parts []string
	if c.name != "" {
		parts = append(parts, fmt.Sprintf("WithName(%q)", c.name))
	}
	if c.bufferSet {
		parts = append(parts, fmt.Sprintf("WithBuffer(%d)", c.buffer))
	}
	if len(parts) == 0 {
		return "no option"
	}
	return strings.Join(parts, ", ")
}

func collect[T any](ctx context.Context, s *Stream[T], ctor string, opts []CollectOption) iter.Seq2[T, error] {
	if ctx == nil {
		panic(fmt.Sprintf("pipeline: %s: nil context", ctor))
	}
	s.check(ctor)
	p := s.p
	cfg := configure(ctor, opts, CollectOption.collectOption)
	if e := p.end; e == nil {
		s.consume(ctor)
		p.end = &collectEnd{stream: s, ctor: ctor, desc: s.desc, name: p.rowName(cfg.name, ctor), buf: cfg.bufferOr(p.cfg.bufferOr(DefaultBuffer)), opts: cfg}
	} else if e.stream != any(s) {
		panic(fmt.Sprintf("pipeline: %s of %s: the pipeline already ends in %s of %s; a pipeline has one end read by Collect or All (use Tee and To for others)",
			ctor, s.desc, e.ctor, e.desc))
	} else if len(opts) > 0 && !sameCollectOptions(cfg, e.opts) {
		panic(fmt.Sprintf("pipeline: %s of %s with %s: the first %s of this stream had %s, and its end keeps them; pass the same options again, or none",
			ctor, s.desc, describeCollectOptions(cfg), e.ctor, describeCollectOptions(e.opts)))
	}
	name, buf := p.end.name, p.end.buf
	return func(yield func(T, error) bool) {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		q := newQueue[T](buf, 1)
		type result struct {
			r   *run
			err error
		}
		var (
			rw    *row
			end   sender[struct{}] // the loop body is done with an item: it settles
			wired = make(chan struct{})
			done  = make(chan result, 1)
		)
		if err := p.begin(true); err != nil {
			yield(*new(T), err)
			return
		}
		go func() {
			r := p.newRun(ctx)
			returned := false
			defer func() {
				if !returned { // runtime.Goexit in user code run here (a store's Load)
					done <- result{r, &StageError{Stage: "checkpoint", Err: ErrGoexit}}
				}
			}()
			r, err := p.exec(r, func(r *run) {
				rw, end = r.newRow(name, KindSink, 1, buf, q), settler(r.track)
				r.stoppers = append(r.stoppers, q.stop)
				wireInput(r, rw, s, q.outlet(r.ctx), q.close)
				r.addRow(rw)
				close(wired)
			})
			returned = true
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
		c := newConsumer(q, 0, 0, &rw.workers[0], buf)
		rest := func() { c.t.discarded += int64(c.rest()) } // taken, never yielded: not started
		defer func() {
			if !finished { // the loop body panicked: stop the run and wait for it
				if inHand { // in flight when the run stopped
					c.t.failed++
				}
				rest()
				c.commit()
				cancel(errStopped)
				if !gotRes {
					res = <-done
				}
				_ = p.finish(res.r, nil)
			}
		}()
		// idle waits, parked, for items or for the run's end; once every goroutine of
		// the run has ended, nothing more will come.
		idle := func(wake <-chan struct{}) (bool, error) {
			if gotRes {
				return false, errStopped
			}
			select {
			case <-wake:
				return true, nil
			case res = <-done:
				gotRes = true
				return false, nil
			}
		}
		for {
			// Take items until the queue is closed (the run succeeded, or drained) or
			// the run has failed: after a failure the queue is not closed.
			if gotRes {
				if d := res.r.drained.Load(); res.err != nil && (d == nil || res.err != error(d)) { //nolint:errorlint // identity: the very error a drain returns
					rest() // failed: the queue is not closed; a drained run's is
					break
				}
			}
			if c.left() == 0 {
				// The queue only: the run's own stop ends the take (stop), never ctx.
				if _, ok, _ := c.take(context.Background(), chunk, 0, idle); !ok {
					break // closed, stopped, or the run ended
				}
			}
			e := c.next()
			inHand = true
			more := yield(e.v, nil)
			inHand = false
			if !more {
				// The item broken on does not settle (the body may not have handled
				// it): in flight when the run stopped, it counts as failed, as when
				// the body panics, not as succeeded.
				stopped = true
				c.t.failed++
				rest()
				cancel(errStopped)
				break
			}
			c.t.succeeded++
			end.settle(e.pos) // the loop body is done with it: committed
		}
		c.commit()
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
