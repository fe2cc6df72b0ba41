package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// WithTimeout bounds each attempt of the stage function at d: the function's context is
// canceled after d, and an error it returns after that matches [ErrTimeout]. Its class
// is the stage's classifier's ([WithClassifier]), or else that of an item error
// (dead-lettered, not retried), unless the function marks it ([Transient], ...).
// Waiting for room in the next queue happens after the attempt and never counts against
// d. It panics if d <= 0.
//
// An attempt's start is read from the clock once per run of items a worker takes (and
// after each wait); when the function first looks at its context (Done, Err, Deadline)
// and that reading is over a millisecond old, the deadline counts from that moment
// instead. An error of a function that never looked at its context is its own, not a
// timeout. An attempt whose function never looks costs no clock read and no allocation
// of its own; one that calls Done costs a timer, as [context.WithTimeout] does.
func WithTimeout(d time.Duration) StageOption {
	if d <= 0 {
		panic(fmt.Sprintf("pipeline: WithTimeout(%v): the timeout must be positive", d))
	}
	return stageOpt(func(c *config) { c.timeout = d })
}

// Backoff returns how long to wait before retry number attempt (1 for the wait after
// the first failed attempt).
type Backoff func(attempt int) time.Duration

// ExponentialBackoff waits about base, 2×base, 4×base, ... capped at limit, with "equal
// jitter": each wait is drawn uniformly from [d/2, d], so that workers that failed
// together do not retry together. It panics if base <= 0 or limit < base.
func ExponentialBackoff(base, limit time.Duration) Backoff {
	if base <= 0 || limit < base {
		panic(fmt.Sprintf("pipeline: ExponentialBackoff(%v, %v): need 0 < base <= limit", base, limit))
	}
	return func(attempt int) time.Duration {
		d := limit
		if s := max(attempt, 1) - 1; s < 63 && base <= limit>>s {
			d = base << s
		}
		half := d / 2
		return half + rand.N(d-half+1)
	}
}

// ConstantBackoff waits d before every retry.
func ConstantBackoff(d time.Duration) Backoff {
	if d < 0 {
		panic(fmt.Sprintf("pipeline: ConstantBackoff(%v): negative wait", d))
	}
	return func(int) time.Duration { return d }
}

// WithRetry makes up to attempts calls (the first included) for an item whose error is
// [ClassTransient], waiting backoff(n) between call n and n+1 (a nil backoff does not
// wait). The wait ends early when the run stops. Errors of other classes are not
// retried. While one worker waits, the stage's other workers go on. It panics if
// attempts < 1.
func WithRetry(attempts int, backoff Backoff) StageOption {
	if attempts < 1 {
		panic(fmt.Sprintf("pipeline: WithRetry(%d): attempts must be at least 1", attempts))
	}
	return stageOpt(func(c *config) { c.attempts, c.backoff = attempts, backoff })
}

// WithClassifier sets the function that classifies the errors of a stage's function
// that carry no marker ([Transient], [Permanent], [Fatal]), timeouts included (they
// match [ErrTimeout]: return [ClassTransient] to retry them, [ClassItem] to set them
// aside as a stage without a classifier does). Given to [New], it is the default for
// every stage that has none. Build it on [errors.Is] and [errors.As], and return
// [ClassFatal] for anything unexpected. A class that is not one of the three fails the
// run. It panics if fn is nil.
func WithClassifier(fn func(error) Class) ClassifierOption {
	if fn == nil {
		panic("pipeline: WithClassifier(nil)")
	}
	return ClassifierOption{fn}
}

// sleep waits backoff(attempt), or longer if err asks for a longer delay (see
// [RetryAfter]), or until ctx is done (returning its cause).
func sleep(ctx context.Context, backoff Backoff, attempt int, err error) error {
	var d time.Duration
	if backoff != nil {
		d = backoff(attempt)
	}
	d = max(d, retryAfterOf(err)) // retryafter.go
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// attemptCtx is the context of one attempt under WithTimeout. context.WithTimeout costs
// a timer, a channel and several allocations per call, whether or not the function ever
// looks at its context; this one costs nothing but a compare-and-swap when the function
// does not look at it. Its start is the worker's last clock reading (taken once per run
// of items, and after each timed attempt), checked when the function first looks at
// its context (Done, Err, Deadline): a reading more than staleStart old is replaced by
// that moment's. Its lock, channel and timer are made only when the function calls Done
// or Err. Every attempt gets a context of its
// own, never reused (a function may hand its context to a goroutine that outlives the
// attempt, which must see it canceled, and nothing of a later attempt); workers carve
// them out of slabs, one allocation per 64 attempts.
type attemptCtx struct {
	parent context.Context
	base   time.Time     // the run's start, with its monotonic reading
	due    time.Duration // the deadline, as an offset from base (estimated: from the worker's last clock reading)
	d      time.Duration // the timeout
	guess  bool          // due is estimated: fix it when the function first looks (anchor)
	fixed  atomic.Int64  // the deadline once fixed, plus one (0: not yet)
	state  atomic.Int32  // ctxLive, ctxArmed (Done or Err was called), ctxEnded (ended unarmed)
	armed  atomic.Pointer[armedCtx]
}

// staleStart is how old the worker's clock reading may be for an attempt to take it
// as its start.
const staleStart = time.Millisecond

const (
	ctxLive int32 = iota
	ctxArmed
	ctxEnded
)

// armedCtx is the part of an attemptCtx that only a function that looks at its context
// needs.
type armedCtx struct {
	mu         sync.Mutex
	done       chan struct{}
	err        error
	timer      *time.Timer
	stopParent func() bool
}

// closedChan is the Done channel of every attempt context that ended before anyone
// asked for it.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// attemptSlab hands out fresh attempt contexts, 64 per allocation.
type attemptSlab []attemptCtx

func (s *attemptSlab) next() *attemptCtx {
	if len(*s) == 0 {
		*s = make([]attemptCtx, 64)
	}
	c := &(*s)[0]
	*s = (*s)[1:]
	return c
}

// start begins an attempt of at most d. Time is kept as an offset from base (the run's
// start): time.Since reads only the monotonic clock, half the cost of time.Now.
func (c *attemptCtx) start(parent context.Context, base time.Time, d time.Duration) {
	c.parent, c.base, c.due = parent, base, time.Since(base)+d
}

// startAt begins an attempt of at most d that started about at offset now from base
// (the worker's last clock reading): no clock read until the function looks.
func (c *attemptCtx) startAt(parent context.Context, base time.Time, now, d time.Duration) {
	c.parent, c.base, c.due, c.d, c.guess = parent, base, now+d, d, true
}

// deadline returns the deadline as an offset from base, fixing an estimated one the
// first time: the estimate, unless the clock reading it came from is stale, then now.
func (c *attemptCtx) deadline() time.Duration {
	if !c.guess {
		return c.due
	}
	if v := c.fixed.Load(); v != 0 {
		return time.Duration(v - 1)
	}
	due := c.due
	if now := time.Since(c.base); now-(due-c.d) > staleStart {
		due = now + c.d
	}
	if c.fixed.CompareAndSwap(0, int64(due)+1) {
		return due
	}
	return time.Duration(c.fixed.Load() - 1)
}

// looked reports whether the function looked at its context's deadline.
func (c *attemptCtx) looked() bool { return !c.guess || c.fixed.Load() != 0 }

// expired reports whether the deadline has passed.
func (c *attemptCtx) expired() bool { return time.Since(c.base) >= c.deadline() }

// Deadline implements context.Context.
func (c *attemptCtx) Deadline() (time.Time, bool) {
	deadline := c.base.Add(c.deadline())
	if d, ok := c.parent.Deadline(); ok && d.Before(deadline) {
		return d, true
	}
	return deadline, true
}

// Value implements context.Context.
func (c *attemptCtx) Value(key any) any { return c.parent.Value(key) }

// arm returns the armed part, making it on the first call; nil if the attempt ended
// before anyone looked (then the context is canceled, for good).
func (c *attemptCtx) arm() *armedCtx {
	if !c.state.CompareAndSwap(ctxLive, ctxArmed) && c.state.Load() == ctxEnded {
		return nil
	}
	if a := c.armed.Load(); a != nil {
		return a
	}
	c.armed.CompareAndSwap(nil, new(armedCtx))
	return c.armed.Load()
}

// Done implements context.Context: the channel (and the timer that closes it) is made on
// the first call.
func (c *attemptCtx) Done() <-chan struct{} {
	a := c.arm()
	if a == nil {
		return closedChan
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done != nil {
		return a.done
	}
	a.done = make(chan struct{})
	if c.expireLocked(a); a.err != nil { // closed it
		return a.done
	}
	a.timer = time.AfterFunc(c.deadline()-time.Since(c.base), func() { c.cancel(a, context.DeadlineExceeded) })
	a.stopParent = context.AfterFunc(c.parent, func() { c.cancel(a, c.parent.Err()) })
	return a.done
}

// Err implements context.Context.
func (c *attemptCtx) Err() error {
	a := c.arm()
	if a == nil {
		return context.Canceled
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c.expireLocked(a)
	return a.err
}

// expireLocked sets a.err if the parent is done or the deadline has passed, and then
// closes Done's channel if it was made: Err is non-nil only once Done is closed.
func (c *attemptCtx) expireLocked(a *armedCtx) {
	if a.err == nil {
		if err := c.parent.Err(); err != nil {
			a.err = err
		} else if c.expired() {
			a.err = context.DeadlineExceeded
		}
	}
	if a.err != nil && a.done != nil {
		select {
		case <-a.done:
		default:
			close(a.done)
		}
	}
}

func (c *attemptCtx) cancel(a *armedCtx, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil {
		a.err = err
	}
	c.expireLocked(a)
}

// end cancels the context when its attempt returns and stops its timer, if any. A
// context nobody looked at ends without a lock.
func (c *attemptCtx) end() {
	if c.state.CompareAndSwap(ctxLive, ctxEnded) {
		return
	}
	a := c.arm()
	c.cancel(a, context.Canceled)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.stopParent != nil {
		a.stopParent()
	}
}

// timedOut reports whether the attempt's deadline had passed while its parent was not
// done: the attempt's error is then a timeout. A function that never looked at its
// context (Done, Err, Deadline) did not see the deadline: its error is its own.
func (c *attemptCtx) timedOut() bool {
	return c.looked() && c.parent.Err() == nil && c.expired()
}

// process runs every attempt of one item and settles its outcome: delivered, dead-
// lettered, or failed (returning the error that stops the worker).
func (w *worker[In, Out]) process(ctx context.Context, v In) error {
	var first error
	cl := w.cl // client.go: breaker, rate limits, adaptive limit; nil without them
	for attempt := 1; ; attempt++ {
		if cl != nil {
			var err error
			if cl.brk != nil && !cl.brk.closed.Load() { // it may hold the attempt: what the run finished goes on first
				if err := w.hold(ctx); err != nil {
					w.t.failed++
					return err
				}
			}
			if w.tk, err = cl.acquire(ctx, v); err != nil {
				if ctx.Err() != nil {
					w.t.failed++
					return context.Cause(ctx)
				}
				return w.fail(err, attempt-1, false)
			}
			w.tick() // it may have waited for a token
		}
		out, err := w.attempt(ctx, v)
		if err == nil {
			if cl != nil {
				cl.settle(w.tk, nil, ClassItem)
			}
			// Counted after delivery: a panic downstream (in an inline operator) leaves
			// the item failed, not both succeeded and failed.
			handed, derr := w.deliver(ctx, out)
			switch {
			case !w.busy: // an ordered stage counted it when it entered the window
			case handed:
				w.t.succeeded++
			default:
				w.t.failed++ // the run stopped before it could be handed on
			}
			if derr != nil {
				return derr
			}
			return w.record(false)
		}
		if ctx.Err() != nil {
			w.t.failed++ // interrupted: the run is stopping
			return context.Cause(ctx)
		}
		class, err := w.classOf(err)
		if cl != nil && cl.settle(w.tk, err, class) {
			attempt-- // held by the breaker: not one of the item's attempts (breaker.go)
			continue
		}
		if class == ClassFatal {
			return w.fail(err, attempt, false)
		}
		if first == nil {
			first = err
		}
		if class == ClassTransient && attempt < w.st.cfg.attempts {
			w.t.retried++
			w.row.addError(errTypeName(err), func(e *ErrorCount) { e.Retried++ })
			w.r.emit(Event{Kind: EventRetry, Stage: w.st.name, Attempt: attempt, Err: err})
			if err := w.hold(ctx); err != nil { // what the run finished goes on first
				w.t.failed++
				return err
			}
			if err := sleep(ctx, w.st.cfg.backoff, attempt, err); err != nil {
				w.t.failed++
				return err
			}
			w.tick()
			continue
		}
		return w.deadLetter(ctx, v, attempt, class, first, err)
	}
}

// classOf decides an error's class: a marker first, then the stage's classifier (which
// sees timeouts too), then a timeout is an item error, and anything else is fatal. A
// classifier's undefined class is fatal, with an error that says so.
func (w *worker[In, Out]) classOf(err error) (Class, error) {
	if c, ok := ClassOf(err); ok {
		return c, err
	}
	if w.classify != nil {
		c := w.classify(err)
		if !c.valid() {
			return ClassFatal, fmt.Errorf("pipeline: the classifier returned an undefined %v for: %w", c, err)
		}
		return c, err
	}
	if errors.Is(err, ErrTimeout) {
		return ClassItem, err
	}
	return ClassFatal, err
}
