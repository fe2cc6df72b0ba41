package pipeline

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// WithTimeout bounds each attempt of the stage function at d: the function's context is
// canceled after d, and an error it returns after that is an item error matching
// [ErrTimeout] (dead-lettered, not retried, unless the function marks it [Transient]).
// Waiting for room in the next queue happens after the attempt and never counts against
// d. It panics if d <= 0.
//
// The timer costs one [context.WithTimeout] per attempt (a few allocations).
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
