package pipeline

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// WithTimeout bounds each attempt of the stage function at d: the function's context is
// canceled after d, and an error it returns after that is an item error matching
// [ErrTimeout] (dead-lettered, not retried, unless the function marks it [Transient]).
// Waiting for room in the next queue happens after the attempt and never counts against
// d. It panics if d <= 0.
//
// An attempt whose function never calls Done costs a clock read and one small
// allocation; one that does costs a timer, as [context.WithTimeout] does.
func WithTimeout(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("pipeline: WithTimeout(%v): the timeout must be positive", d))
	}
	return optionFunc(func(c *config) { c.timeout = d; c.stageOnly = firstOf(c.stageOnly, "WithTimeout") })
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
func WithRetry(attempts int, backoff Backoff) Option {
	if attempts < 1 {
		panic(fmt.Sprintf("pipeline: WithRetry(%d): attempts must be at least 1", attempts))
	}
	return optionFunc(func(c *config) {
		c.attempts, c.backoff = attempts, backoff
		c.stageOnly = firstOf(c.stageOnly, "WithRetry")
	})
}

// WithClassifier sets the function that classifies the errors of a stage's function
// that carry no marker ([Transient], [Permanent], [Fatal]) and are not timeouts. Given
// to [New], it is the default for every stage that has none. Build it on [errors.Is] and
// [errors.As]; return [ClassFatal] for anything unexpected. It panics if fn is nil.
func WithClassifier(fn func(error) Class) Option {
	if fn == nil {
		panic("pipeline: WithClassifier(nil)")
	}
	return optionFunc(func(c *config) { c.classify = fn })
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// sleep waits backoff(attempt), or until ctx is done (returning its cause).
func sleep(ctx context.Context, backoff Backoff, attempt int) error {
	if backoff == nil {
		return nil
	}
	d := backoff(attempt)
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
// looks at its context; this one costs one small allocation and a clock read. Its
// channel and timer are made only when Done is called. Each attempt gets its own: a
// function may hand its context to a goroutine that outlives the attempt, which must
// then see it canceled, and nothing of a later attempt.
type attemptCtx struct {
	parent   context.Context
	deadline time.Time
	after    time.Duration
	touched  atomic.Bool // Done, Err or Deadline was called: there may be something to stop

	mu         sync.Mutex
	done       chan struct{}
	err        error
	timer      *time.Timer
	stopParent func() bool
}

func (c *attemptCtx) start(parent context.Context, d time.Duration) {
	c.parent, c.after, c.deadline = parent, d, time.Now().Add(d)
}

// Deadline implements context.Context.
func (c *attemptCtx) Deadline() (time.Time, bool) {
	c.touched.Store(true)
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

// Value implements context.Context.
func (c *attemptCtx) Value(key any) any { return c.parent.Value(key) }

// Done implements context.Context: the channel (and the timer that closes it) is made on
// the first call.
func (c *attemptCtx) Done() <-chan struct{} {
	c.touched.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if c.err != nil {
		close(c.done)
		return c.done
	}
	if c.expireLocked(); c.err != nil { // closed it
		return c.done
	}
	c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.cancel(context.DeadlineExceeded) })
	c.stopParent = context.AfterFunc(c.parent, func() { c.cancel(c.parent.Err()) })
	return c.done
}

// Err implements context.Context.
func (c *attemptCtx) Err() error {
	c.touched.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.expireLocked()
	}
	return c.err
}

// expireLocked sets err if the parent is done or the deadline has passed, and then
// closes Done's channel if it was made: Err is non-nil only once Done is closed.
func (c *attemptCtx) expireLocked() {
	if err := c.parent.Err(); err != nil {
		c.err = err
	} else if !time.Now().Before(c.deadline) {
		c.err = context.DeadlineExceeded
	}
	if c.err != nil && c.done != nil {
		select {
		case <-c.done:
		default:
			close(c.done)
		}
	}
}

func (c *attemptCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
	if c.done != nil {
		select {
		case <-c.done:
		default:
			close(c.done)
		}
	}
}

// end cancels the context when its attempt returns, and stops its timer, if any.
func (c *attemptCtx) end() {
	c.cancel(context.Canceled)
	if !c.touched.Load() {
		return // no timer: Done was never called (a later call finds err set)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.stopParent != nil {
		c.stopParent()
	}
}

// timedOut reports whether the attempt's deadline had passed while its parent was not
// done: the attempt's error is then a timeout.
func (c *attemptCtx) timedOut() bool {
	return c.parent.Err() == nil && !time.Now().Before(c.deadline)
}
