package pipeline

import (
	"context"
	"testing"
	"time"
)

// R1: Err() can return non-nil while Done() is still open (context contract: "If Done
// is not yet closed, Err returns nil").
func TestRegressionAttemptCtxErrBeforeDone(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	c := newAttemptCtx(parent, time.Now(), time.Hour)
	done := c.Done() // channel + AfterFunc on parent made here
	cancel()
	if c.Err() == nil {
		t.Skip("Err still nil")
	}
	select {
	case <-done:
	default:
		t.Fatalf("Err() = %v but Done() is not closed", c.Err())
	}
	c.end()
}

// R1b: same for the deadline: Err reports DeadlineExceeded while Done is open.
func TestRegressionAttemptCtxErrBeforeDoneDeadline(t *testing.T) {
	c := newAttemptCtx(context.Background(), time.Now(), time.Millisecond)
	done := c.Done()
	for c.Err() == nil {
	}
	select {
	case <-done:
	default:
		t.Fatalf("Err() = %v but Done() is not closed", c.Err())
	}
	c.end()
}
