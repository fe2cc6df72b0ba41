package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/gopipeline/pipeline/internal/pause"
	"github.com/gopipeline/pipeline/internal/retryafter"
)

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
// [RetryAfter]), or until ctx is done (returning its cause). A delay past the stage's
// cap never reaches it: capRetryAfter made that error an item error, not retried.
func sleep(ctx context.Context, backoff Backoff, attempt int, err error) error {
	var d time.Duration
	if backoff != nil {
		d = backoff(attempt)
	}
	d = max(d, retryafter.Of(err)) // internal/retryafter
	if d <= 0 {
		return nil
	}
	return pause.For(ctx, d)
}

// attempts makes the attempts of the item in hand, v, until its fate is known, and
// returns it for end, with the item's error (the output of a success is in *out).
// made, when not nil, is the error of the item's first attempt, made already (a
// plain worker's, in items); the attempts go on from there. Retries, the client's
// acquire and settle around each attempt, and setting the item aside happen here;
// counting happens in end.
func (w *worker[In, Out]) attempts(ctx context.Context, v In, out *Out, made error) (outcome, error) {
	var first error
	cl := w.cl // client.go: breaker, rate limits, adaptive limit; nil without them
	for attempt := 1; ; attempt++ {
		err := made
		made = nil
		if err == nil {
			if attempt > 1 && ctx.Err() != nil { // a retry, not begun once the run stops: the wait before it may have ended as the run stopped, or had no delay
				return interrupted, context.Cause(ctx)
			}
			if cl != nil {
				from := ticket{back: w.again} // a held item taken back: its key's other held items do not hold it (breaker.go)
				if w.ticketed {
					from = w.tk // its first attempt, let through by its key's breaker as it was taken back (worker.resume)
				}
				w.ticketed = true // a policy's key function may panic: what the ones before it took is released
				if err = cl.acquire(ctx, v, from, &w.tk, w.holdFn); err != nil {
					w.ticketed = false                // given back by acquire
					if err := w.holdErr; err != nil { // a policy that would wait had the worker hold first (holdFn)
						w.holdErr = nil
						return interrupted, err
					}
					if ctx.Err() != nil {
						return interrupted, context.Cause(ctx)
					}
					if errors.Is(err, errHeld) { // its key's breaker holds it (breaker.go)
						return w.park(ctx, v, attempt-1, first)
					}
					if errors.Is(err, ErrThrottled) { // shed: no token within WithMaxTokenWait (ratelimit.go)
						return w.setAside(ctx, v, attempt-1, ClassItem, cmp.Or(first, err), err) // deadletter.go
					}
					w.f = fate{attempts: attempt - 1}
					return failed, err
				}
				w.tick() // it may have waited for a token
			}
			if *out, err = w.attempt(ctx, v); err == nil {
				if cl != nil {
					w.ticketed = false
					cl.settle(w.tk, nil, ClassItem)
				}
				return succeeded, nil
			}
		}
		if ctx.Err() != nil {
			w.release() // the run is stopping: its outcome says nothing of the service
			return interrupted, context.Cause(ctx)
		}
		class, err := w.classOf(err)
		class, err = capRetryAfter(w.st.name, w.st.cfg.client.retryAfterCapOf(), class, err) // retryafter.go: Retry-After past the cap
		if cl != nil {
			w.ticketed = false
			if cl.settle(w.tk, err, class) {
				attempt-- // held by the breaker: not one of the item's attempts (breaker.go)
				continue
			}
		}
		if class == ClassFatal {
			w.f = fate{attempts: attempt}
			return failed, err
		}
		if first == nil {
			first = err
		}
		if class == ClassTransient && attempt < w.st.cfg.attempts {
			w.f = fate{attempts: attempt}
			_ = w.end(retried, nil, 0, err)
			if err := w.hold(ctx); err != nil { // what the run finished goes on first
				return interrupted, err
			}
			if err := sleep(ctx, w.st.cfg.backoff, attempt, err); err != nil {
				return interrupted, err
			}
			w.tick()
			continue
		}
		return w.setAside(ctx, v, attempt, class, first, err) // deadletter.go
	}
}

// release gives back what the client's acquire took for the attempt in hand, if it
// did and the attempt's outcome was not settled: the run stopped under the attempt, or
// its function panicked. A breaker's probe left taken would keep a shared breaker
// half-open for good, every later run's attempt waiting for it.
func (w *worker[In, Out]) release() {
	if w.ticketed {
		w.ticketed = false
		w.cl.release(w.tk)
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
