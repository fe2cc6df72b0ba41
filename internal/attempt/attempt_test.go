package attempt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// span is the epoch span of the tests' clocks: the root package's runBudget.
const span = 16 * time.Microsecond

// TestAttemptCtx checks the lazy per-attempt context against the context contract, in
// virtual time: its deadline, Done closing at the deadline or when the parent is
// canceled, Err staying set once set, values and causes from the parent, and reuse only
// when the attempt never looked at it.
func TestAttemptCtx(t *testing.T) {
	type key struct{}
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
		defer cancel(nil)
		start := time.Now()
		c := New(parent, start, time.Second)

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
		if !errors.Is(c.Err(), context.DeadlineExceeded) || !c.TimedOut() {
			t.Fatalf("Err = %v after the deadline", c.Err())
		}
		c.End()
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatal("Err changed after the end")
		}

		// Untouched until it ended: a late look finds it canceled, its Done closed.
		u := New(parent, start, time.Second)
		u.End()
		if !errors.Is(u.Err(), context.Canceled) {
			t.Fatalf("Err = %v after the end", u.Err())
		}
		<-u.Done()

		// The parent's cancellation reaches Done, with the parent's cause.
		p := New(parent, start, time.Hour)
		pd := p.Done()
		cause := errors.New("stop")
		cancel(cause)
		<-pd
		if !errors.Is(p.Err(), context.Canceled) || !errors.Is(context.Cause(p), cause) {
			t.Fatalf("Err = %v, Cause = %v", p.Err(), context.Cause(p))
		}
		if p.TimedOut() {
			t.Fatal("a canceled parent is not a timeout")
		}
		p.End()

		// Ended before its deadline: Done is closed, Err is Canceled.
		parent2, cancel2 := context.WithCancel(context.Background())
		defer cancel2()
		e := New(parent2, start, time.Hour)
		ed := e.Done()
		e.End()
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

// TestAttemptClock checks a worker's attempt contexts across slabs and epochs: each
// finds its own slab and epoch, one first looked at after its attempt returned is
// canceled once the worker publishes (and never shows a later attempt's deadline),
// while the attempt in progress stays live.
func TestAttemptClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent := context.Background()
		base := time.Now()
		k := NewClock(span, base, time.Second)
		var ctxs []*Ctx
		var dues []time.Duration
		for i := range 300 {
			// A new clock reading now and then: a new epoch, and a new slab when a slab's
			// epochs run out.
			now := time.Duration(i/7) * 10 * span
			c := k.Begin(parent, now)
			if s := c.slab(); s != k.slab || &s.slots[c.i] != c {
				t.Fatalf("attempt %d: slab() does not find its slab", i)
			}
			ctxs, dues = append(ctxs, c), append(dues, now+time.Second)
			if c.over() || c.Err() != nil && i%3 == 0 {
				t.Fatalf("attempt %d: over before it returned", i)
			}
			c.Finish()
			if i%5 == 4 {
				k.Publish() // the end of a run
			}
		}
		k.Publish()
		last := k.Begin(parent, 43*10*span) // in progress: a reading later than every other, so an epoch of its own
		for i, c := range ctxs {
			if !c.over() {
				t.Fatalf("attempt %d: not over after publish", i)
			}
			if !errors.Is(c.Err(), context.Canceled) {
				t.Fatalf("attempt %d: Err = %v after it returned", i, c.Err())
			}
			<-c.Done()
			if d, _ := c.Deadline(); i%3 != 0 && d != base.Add(dues[i]) {
				t.Fatalf("attempt %d: Deadline %v, want %v", i, d.Sub(base), dues[i])
			}
		}
		if last.over() || last.Err() != nil {
			t.Fatal("the attempt in progress is canceled")
		}
		last.Finish()
		k.Publish()
		if !errors.Is(last.Err(), context.Canceled) {
			t.Fatalf("Err = %v after the last attempt", last.Err())
		}
	})
}

// TestAttemptClockLateLooks races goroutines that first look at attempt contexts after
// their attempts returned with the worker publishing: once both are done, every context
// is canceled (Done closed), whichever side saw the other.
func TestAttemptClockLateLooks(t *testing.T) {
	base := time.Now()
	k := NewClock(span, base, time.Hour)
	looks := make(chan *Ctx, 1000)
	done := make(chan struct{})
	var seen []<-chan struct{}
	go func() {
		defer close(done)
		for c := range looks {
			seen = append(seen, c.Done())
		}
	}()
	var early []<-chan struct{} // looked at after the attempt, before the publish
	for i := range 1000 {
		c := k.Begin(context.Background(), time.Since(base))
		c.Finish()
		if i%2 == 0 {
			early = append(early, c.Done())
		} else {
			looks <- c // handed to a goroutine that looks when it gets to it
		}
		if i%3 == 0 {
			k.Publish()
		}
	}
	k.Publish()
	close(looks)
	<-done
	for i, d := range append(seen, early...) {
		select {
		case <-d:
		default:
			t.Fatalf("context %d: Done still open after its attempt returned and was published", i)
		}
	}
}

// TestAttemptCtxLateLooksAgree races two first looks at a context whose attempt just
// returned with the worker publishing its end: whichever look comes first, both see one
// Done channel, one deadline and a canceled context, now and on every later call.
func TestAttemptCtxLateLooksAgree(t *testing.T) {
	base := time.Now()
	k := NewClock(span, base, time.Hour)
	for i := range 20000 {
		c := k.Begin(context.Background(), time.Since(base))
		c.Finish()
		type look struct {
			done <-chan struct{}
			dl   time.Time
		}
		var looks [2]look
		var wg sync.WaitGroup
		for g := range looks {
			wg.Go(func() {
				d, _ := c.Deadline()
				looks[g] = look{c.Done(), d}
			})
		}
		k.Publish()
		wg.Wait()
		<-looks[0].done
		for g, l := range looks {
			d, _ := c.Deadline()
			if l.done != c.Done() || l.done != looks[0].done || !l.dl.Equal(d) || !d.Equal(looks[0].dl) {
				t.Fatalf("attempt %d, look %d: Done or Deadline changed between calls", i, g)
			}
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("attempt %d: Err = %v after its end", i, c.Err())
		}
	}
}

// requireClosedWithErr fails the test unless done, c's Done channel, is closed: the
// caller saw c's Err non-nil.
func requireClosedWithErr(t *testing.T, c *Ctx, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	default:
		t.Fatalf("Err() = %v but Done() is not closed", c.Err())
	}
}

// Err() could return non-nil while Done() was still open, against the context contract
// ("If Done is not yet closed, Err returns nil"): after the parent's cancel, Done is
// closed by the time Err is non-nil.
func TestAttemptCtxErrOnlyOnceDoneIsClosed(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	c := New(parent, time.Now(), time.Hour)
	done := c.Done() // channel + AfterFunc on parent made here
	cancel()
	if c.Err() == nil {
		t.Skip("Err still nil")
	}
	requireClosedWithErr(t, c, done)
	c.End()
}

// The same for the deadline: Err reported DeadlineExceeded while Done was open.
func TestAttemptCtxDeadlineErrOnlyOnceDoneIsClosed(t *testing.T) {
	c := New(context.Background(), time.Now(), time.Millisecond)
	done := c.Done()
	for c.Err() == nil {
	}
	requireClosedWithErr(t, c, done)
	c.End()
}

// TestSlabEpochs checks that a context finds its slab and the epoch its attempt was
// begun in (epoch, from the epochs' starts; no slot holds its epoch), through slabs
// that fill up and slabs whose epochs run out, new epochs at every slot and none for
// a whole slab, while a goroutine looks at each context as soon as it is handed out
// (under -race: the worker's later epochs race with nothing the look reads).
func TestSlabEpochs(t *testing.T) {
	base := time.Now()
	k := NewClock(span, base, time.Hour)
	type key struct{}
	parents := []context.Context{
		context.WithValue(context.Background(), key{}, 0),
		context.WithValue(context.Background(), key{}, 1),
	}
	type begun struct {
		c      *Ctx
		parent int
		due    time.Duration
	}
	looks := make(chan begun, 64)
	done := make(chan error)
	go func() {
		var err error
		for b := range looks {
			if v := b.c.Value(key{}); err == nil && v != b.parent {
				err = fmt.Errorf("a context handed out with parent %d shows %v", b.parent, v)
			}
			if d := b.c.epoch().due; err == nil && d != b.due {
				err = fmt.Errorf("a context handed out with the deadline %v shows %v", b.due, d)
			}
		}
		done <- err
	}()
	var all []begun
	var now time.Duration
	parent := 0
	for i := range 5 * slabSlots {
		switch {
		case i < slabSlots: // one epoch for a whole slab
		case i < 2*slabSlots: // an epoch per slot: a new slab every slabEpochs slots
			now += 2 * span
		case i%7 == 0:
			now += 2 * span
		case i%11 == 0:
			parent = 1 - parent
		}
		c := k.Begin(parents[parent], now)
		if s := c.slab(); s != k.slab || &s.slots[c.i] != c {
			t.Fatalf("attempt %d: slab() does not find its slab", i)
		}
		b := begun{c, parent, now + time.Hour}
		looks <- b
		all = append(all, b)
	}
	close(looks)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i, b := range all {
		if got := b.c.epoch(); got.due != b.due || got.parent != parents[b.parent] {
			t.Fatalf("attempt %d: epoch with deadline %v and parent %v, want %v and %d", i, got.due, got.parent.Value(key{}), b.due, b.parent)
		}
	}
}
