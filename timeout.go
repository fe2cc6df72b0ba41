package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/gopipeline/pipeline/internal/attempt"
)

// WithTimeout bounds each attempt of the stage function at d: the function's context is
// canceled after d, and an error it returns after that matches [ErrTimeout]. Its class
// is the stage's classifier's ([WithClassifier]), or else that of an item error
// (dead-lettered, not retried), unless the function marks it ([Transient], ...).
// Waiting for room in the next queue happens after the attempt and never counts against
// d. It panics if d <= 0.
//
// An attempt's start is read from the clock once per run of items a worker takes (and
// after a retry's backoff or a wait for a rate limit's token or a breaker); when the
// function first looks at its context (Done, Err, Deadline) and that reading is over a
// millisecond old (the worker waited meanwhile for room downstream, say), the deadline
// counts from that moment instead (readings less than about 16 µs apart may count as
// one). An error of a
// function that never looked at its context is its own, not a timeout.
//
// The context is canceled once its attempt returns: at once if the function looked at it
// during the attempt; if it was handed on unlooked (to a goroutine, say) and first looked
// at later, by the end of the worker's run of items, and at its deadline at the latest.
// It never shows anything of a later attempt. An attempt whose function never looks
// costs no clock read, no locked instruction (the worker's first attempt after each
// publish of its attempt clock makes one store, for the stuck-attempt watcher: one per
// run of items) and about two bytes of an allocation shared by up to 256 attempts; one
// that calls Done costs a timer, as [context.WithTimeout] does.
//
// An attempt whose function does not return after its context is done is reported: an
// [EventStuck] when it has run a quarter of d past d (1 ms at least), and its age in
// [StageReport.OldestAttempt]; see "Middleware" in the package doc.
func WithTimeout(d time.Duration) StageOption {
	if d <= 0 {
		panic(fmt.Sprintf("pipeline: WithTimeout(%v): the timeout must be positive", d))
	}
	return stageOpt(func(c *config) { c.timeout = d })
}

// timeouts is WithTimeout's part of one stage in one run: each worker's attempt clock
// (internal/attempt) and the stuck-attempt watcher over them. A stage without a timeout
// has a nil *timeouts, whose methods do nothing and whose clocks are nil (a nil
// attempt.Clock's Publish does nothing).
type timeouts struct {
	r      *run
	rw     *row
	d      time.Duration
	clocks []*attempt.Clock
	done   chan struct{} // closed when every worker has exited: the watcher ends
}

// newTimeouts returns the timeout part of a stage's run of workers workers, or nil when
// d is not positive (no WithTimeout).
func newTimeouts(r *run, rw *row, d time.Duration, workers int) *timeouts {
	if d <= 0 {
		return nil
	}
	rw.timeout = d
	t := &timeouts{r: r, rw: rw, d: d, clocks: make([]*attempt.Clock, workers), done: make(chan struct{})}
	for i := range t.clocks {
		t.clocks[i] = attempt.NewClock(runBudget, r.started, d)
	}
	return t
}

// clock returns worker i's attempt clock.
func (t *timeouts) clock(i int) *attempt.Clock {
	if t == nil {
		return nil
	}
	return t.clocks[i]
}

// watch starts the stuck-attempt watcher (attempt.Watch): one goroutine, which ends
// once ended is called.
func (t *timeouts) watch() {
	if t == nil {
		return
	}
	aw := attempt.NewWatch(t.d, t.r.started, t.clocks)
	t.rw.watch = aw
	t.r.spawn(t.rw.name, func() error {
		aw.Run(t.done, func(age time.Duration) {
			t.r.emit(t.r.ctx, Event{Kind: EventStuck, Stage: t.rw.name, Age: age})
		})
		return nil
	})
}

// ended is called when the stage's last worker exits.
func (t *timeouts) ended() {
	if t != nil {
		close(t.done)
	}
}

// publish tells the worker's attempt contexts, under WithTimeout, that their attempts
// returned (attempt.Clock.Publish); the worker calls it before it waits. Without a
// timeout it is a register test, not a call (a method of an internal package is not
// inlined in the root's generic code: S5 latency about 80 instructions per item).
func (w *worker[In, Out]) publish() {
	if w.ctxs != nil {
		w.ctxs.Publish()
	}
}

// tick reads the clock for the attempts that follow, under WithTimeout (see attempt.Ctx),
// and makes the next attempt call Begin (attempt.Clock.Now): the inline fast path in
// items, which does not compare parents, then starts each run from an epoch of its own
// ctx.
func (w *worker[In, Out]) tick() {
	if k := w.ctxs; k != nil {
		w.clock = time.Since(w.r.started)
		k.Now = -1
	}
}

// timeoutCall is the call of the stage function under the per-attempt timeout, which
// the stage must have, with the attempt's context of its own: the attempts after a
// failed one, and every attempt of a worker that is not plain (timedCall). A plain
// worker's first attempts make the same steps inline in items.
func (w *worker[In, Out]) timeoutCall(ctx context.Context, v In) (out Out, err error) {
	k := w.ctxs
	a := parentAttempt(k, ctx, w.clock)
	if w.st.flat == nil {
		out, err = w.st.fn(a, v)
	} else {
		out, err = w.call(a, v)
	}
	if err != nil {
		err = w.timedOut(a, err)
	}
	if k.Looks.Load() {
		a.Finish()
	}
	return out, err
}

// timedOut returns err, the error of attempt a, as a *timeoutError when a ran past its
// deadline.
func (w *worker[In, Out]) timedOut(a *attempt.Ctx, err error) error {
	if a.TimedOut() {
		return &timeoutError{after: w.st.cfg.timeout, err: err}
	}
	return err
}

// nextAttempt is [attempt.Clock.Begin]'s common case, the next slot of the latest
// Begin's epoch, or nil when Begin must run (see the fields it reads). It does not
// compare parents: its caller knows that its parent is the latest Begin's (items' inline
// path: every Begin of its run is its own or one inside attempts, after which it checks;
// tick makes each run's first attempt call Begin), or compares them first
// (parentAttempt). It is here, not in package attempt, and not generic, so that it
// inlines in the worker: a function of another package called only from generic code
// is not inlined where that code is instantiated (the user's package). Begin's call per
// attempt was most of the timeout's instructions (S5 3x4's middleware: Begin 172 of 284
// per item); comparing the parent's two words per attempt cost about 9 more, as did
// the checks in another order (a second bounds check).
func nextAttempt(k *attempt.Clock, now time.Duration) *attempt.Ctx {
	if i := uint(k.I); i < uint(len(k.Slots)) && now == k.Now && !k.Ask.Load() {
		k.I = int(i + 1)
		return &k.Slots[i]
	}
	return nil
}

// keepInline is called by items' inline path after other paths may have begun attempts
// on k (attempts): its fast path (nextAttempt, no parent compared) goes on only if the
// latest Begin's parent is its own, parent.
func keepInline(k *attempt.Clock, parent context.Context) {
	if !attempt.SameContext(&k.Parent, parent) {
		k.Now = -1
	}
}

// parentAttempt returns the context of the worker's next attempt, with parent parent:
// nextAttempt's when the latest Begin's parent is parent, else Begin's.
func parentAttempt(k *attempt.Clock, parent context.Context, now time.Duration) *attempt.Ctx {
	if attempt.SameContext(&k.Parent, parent) {
		if a := nextAttempt(k, now); a != nil {
			return a
		}
	}
	return k.Begin(parent, now)
}
