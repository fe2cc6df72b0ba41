package pipeline

import (
	"strconv"
	"strings"
	"time"
)

// RetryAfter marks err as transient, like [Transient], and asks that the item be
// retried no sooner than d from now: the retry waits the longer of its [Backoff] and d
// (with [WithRetry] and no backoff, just d). Use it for the delay a server asked for:
// an HTTP 429 or 503 response's Retry-After header ([ParseRetryAfter] reads one). It
// returns nil for a nil err; a negative d counts as 0.
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

// retryAfterOf returns the longest delay asked for by an error of err's chain.
func retryAfterOf(err error) time.Duration {
	var d time.Duration
	walk(err, func(e error) {
		if ra, ok := e.(interface{ RetryAfter() time.Duration }); ok {
			d = max(d, ra.RetryAfter())
		}
	})
	return d
}

// walk calls fn for every error of err's tree, depth first.
func walk(err error, fn func(error)) {
	for err != nil {
		fn(err)
		switch u := err.(type) { //nolint:errorlint // walking the chain by hand, as errors.As does
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e, fn)
			}
			return
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		default:
			return
		}
	}
}

// ParseRetryAfter reads the value of an HTTP Retry-After header: a number of seconds
// ("120") or an HTTP date ("Wed, 21 Oct 2015 07:28:00 GMT", taken relative to now). It
// returns the delay and true, or 0 and false when the value is neither (an empty
// header, say). A date in the past is a delay of 0.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(value, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		if secs > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := parseHTTPDate(value)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// maxRetryAfter caps a Retry-After in seconds so that it cannot overflow a Duration.
const maxRetryAfter = 100 * 365 * 24 * time.Hour

// httpDates are the date formats HTTP/1.1 accepts, the preferred one first (as
// net/http's ParseTime; not imported, so that the package does not pull net/http into
// every binary).
var httpDates = []string{
	"Mon, 02 Jan 2006 15:04:05 GMT",
	"Monday, 02-Jan-06 15:04:05 GMT",
	"Mon Jan _2 15:04:05 2006",
}

func parseHTTPDate(v string) (time.Time, error) {
	var err error
	for _, layout := range httpDates {
		var t time.Time
		if t, err = time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, err
}
