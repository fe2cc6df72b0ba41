// Package retryafter holds the machinery of the root package's Retry-After support:
// finding the delay an error's chain asks for, and reading an HTTP Retry-After header
// (the root's ParseRetryAfter).
package retryafter

import (
	"strconv"
	"strings"
	"time"
)

// Of returns the longest delay asked for by an error of err's chain: any error in it
// with a method RetryAfter() time.Duration (the root package's RetryAfter marker, or
// an HTTP client's error type).
func Of(err error) time.Duration {
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

// Parse reads the value of an HTTP Retry-After header: a number of seconds ("120") or
// an HTTP date ("Wed, 21 Oct 2015 07:28:00 GMT", taken relative to now). It returns
// the delay and true, or 0 and false when the value is neither. A date in the past is
// a delay of 0; a number of seconds past about a century is capped there.
func Parse(value string, now time.Time) (time.Duration, bool) {
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
