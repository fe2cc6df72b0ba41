package pipeline

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestAttemptCtx checks the lazy per-attempt context against the context contract, in
// virtual time: its deadline, Done closing at the deadline or when the parent is
// canceled, Err staying set once set, values and causes from the parent, and reuse only
// when the attempt never looked at it.
func TestAttemptCtx(t *testing.T) {
	type key struct{}
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
		defer cancel(nil)
		c := new(attemptCtx)
		start := time.Now()
		c.start(parent, start, time.Second)

		if d, ok := c.Deadline(); !ok || d != start.Add(time.Second) {
			t.Fatalf("Deadline = %v, %v", d, ok)
		}
		if c.Value(key{}) != "v" {
			t.Fatal("Value does not reach the parent")
		}
		if c.Err() != nil {
			t.Fatal("Err before the deadline")
		}
		done := c.Done()
		if c.Done() != done {
			t.Fatal("Done returns another channel")
		}
		<-done
		if got := time.Since(start); got != time.Second {
			t.Fatalf("Done closed after %v, want exactly 1s", got)
		}
		if !errors.Is(c.Err(), context.DeadlineExceeded) || !c.timedOut() {
			t.Fatalf("Err = %v after the deadline", c.Err())
		}
		c.end()
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatal("Err changed after the end")
		}

		// Untouched until it ended: a late look finds it canceled, its Done closed.
		u := new(attemptCtx)
		u.start(parent, start, time.Second)
		u.end()
		if !errors.Is(u.Err(), context.Canceled) {
			t.Fatalf("Err = %v after the end", u.Err())
		}
		<-u.Done()

		// The parent's cancellation reaches Done, with the parent's cause.
		p := new(attemptCtx)
		p.start(parent, start, time.Hour)
		pd := p.Done()
		cause := errors.New("stop")
		cancel(cause)
		<-pd
		if !errors.Is(p.Err(), context.Canceled) || !errors.Is(context.Cause(p), cause) {
			t.Fatalf("Err = %v, Cause = %v", p.Err(), context.Cause(p))
		}
		if p.timedOut() {
			t.Fatal("a canceled parent is not a timeout")
		}
		p.end()

		// Ended before its deadline: Done is closed, Err is Canceled.
		parent2, cancel2 := context.WithCancel(context.Background())
		defer cancel2()
		e := new(attemptCtx)
		e.start(parent2, start, time.Hour)
		ed := e.Done()
		e.end()
		select {
		case <-ed:
		default:
			t.Fatal("Done is open after the attempt ended")
		}
		if !errors.Is(e.Err(), context.Canceled) {
			t.Fatalf("Err = %v after the end", e.Err())
		}
	})
}
