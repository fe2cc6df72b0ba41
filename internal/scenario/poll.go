package scenario

import (
	"testing"
	"time"
)

// Eventually polls cond at each tick of every until it holds, and fails tb if it does not
// within limit. It is for tests against a server outside the test's control (an
// embedded NATS or Kafka cluster), whose goroutines a synctest bubble cannot hold;
// limit bounds a failure, it does not measure anything.
func Eventually(tb testing.TB, every, limit time.Duration, what string, cond func() bool) {
	tb.Helper()
	tick := time.NewTicker(every)
	defer tick.Stop()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			tb.Fatalf("gave up waiting for %s after %v", what, limit)
		}
	}
}
