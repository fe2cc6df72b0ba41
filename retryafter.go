package pipeline

import (
	"fmt"
	"time"

	"github.com/gopipeline/pipeline/internal/retryafter"
)

// RetryAfter marks err as transient, like [Transient], and asks that the item be
// retried no sooner than d from now: the retry waits the longer of its [Backoff] and d
// (with [WithRetry] and no backoff, just d). Use it for the delay a server asked for:
// an HTTP 429 or 503 response's Retry-After header ([ParseRetryAfter] reads one). A
// delay past the stage's cap (10 minutes, or [WithRetryAfterCap]) is not waited for:
// the item is set aside with a [*RetryAfterError]. An item that the stage's circuit
// breaker holds instead (the attempt failed while the breaker was not closed: see
// [WithCircuitBreaker]) is tried again when the breaker lets it, which may be sooner:
// the breaker's OpenFor is the service's delay then. It returns nil for a nil err; a
// negative d counts as 0.
//
// Any error in the chain with a method RetryAfter() time.Duration (an HTTP client's
// error type, say) is honoured the same way, without this marker; the marker is needed
// only to give an error the delay, or the transient class, it lacks.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return mark(&retryAfterError{err: err, d: max(d, 0)}, ClassTransient)
}

// WithRetryAfterCap sets the longest delay a server may ask for with a Retry-After
// ([RetryAfter], or an error with a RetryAfter() time.Duration method) that the stage
// waits for: a retry waits at most d, and so does a circuit breaker that the failure
// opens ([WithCircuitBreaker]). Without it the cap is 10 minutes: a quota's "come back
// in an hour" is not a delay to sleep through with an item in hand.
//
// An attempt whose error asks for more than d is not retried: the item is set aside at
// once as an item error ([ClassItem]) with a [*RetryAfterError] (matching
// [ErrRetryAfterTooLong]) that wraps the attempt's error, so that [WithDeadLetter]
// gets it and the report counts it under "*pipeline.RetryAfterError"; a stage without a
// dead-letter destination fails the run with it, as with any item error. The error is
// not a failure of the service for the breaker (it answered), and an error budget
// counts the item as it counts any dead letter. It panics if d is not positive.
func WithRetryAfterCap(d time.Duration) StageOption {
	if d <= 0 {
		panic(fmt.Sprintf("pipeline: WithRetryAfterCap(%v): the cap must be positive", d))
	}
	return stageOpt(func(c *config) { c.client.retryAfterCap = d })
}

// defaultRetryAfterCap is the cap of a stage without WithRetryAfterCap.
const defaultRetryAfterCap = 10 * time.Minute

// retryAfterCapOf returns the cap of a stage's config.
func (c clientConfig) retryAfterCapOf() time.Duration {
	if c.retryAfterCap > 0 {
		return c.retryAfterCap
	}
	return defaultRetryAfterCap
}

// capRetryAfter checks a failed attempt's class and error against its stage's cap: a
// transient error that asks for a longer delay than limit becomes an item error, a
// *RetryAfterError. It walks err's chain only for a transient error.
func capRetryAfter(stage string, limit time.Duration, class Class, err error) (Class, error) {
	if class != ClassTransient {
		return class, err
	}
	if d := retryafter.Of(err); d > limit {
		return ClassItem, &RetryAfterError{Stage: stage, Delay: d, Cap: limit, Err: err}
	}
	return class, err
}

// ParseRetryAfter reads the value of an HTTP Retry-After header: a number of seconds
// ("120") or an HTTP date ("Wed, 21 Oct 2015 07:28:00 GMT", taken relative to now). It
// returns the delay and true, or 0 and false when the value is neither (an empty
// header, say). A date in the past is a delay of 0.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	return retryafter.Parse(value, now) // internal/retryafter
}
