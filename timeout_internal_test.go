package pipeline

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gopipeline/pipeline/internal/attempt"
)

// TestNextAttemptAgreesWithBegin drives two attempt clocks through the same attempts:
// one begins every attempt with Begin, the other as a worker does, through new clock
// readings (new epochs and slabs), publishes and the watcher's asks. The worker's
// attempts are items' inline ones (nextAttempt, which compares no parent, and Begin
// when it declines; the run's ctx, parents[0]) and now and then a run of attempts'
// (parentAttempt, with either parent), after which items calls keepInline. Every
// attempt's context must show the same deadline and parent on both, be live until its
// attempt is published and canceled after, and the watcher must be told as often on
// both.
func TestNextAttemptAgreesWithBegin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		base := time.Now()
		parents := []context.Context{
			context.WithValue(t.Context(), key{}, 1),
			context.WithValue(t.Context(), key{}, 2),
		}
		ref := attempt.NewClock(runBudget, base, time.Second) // Begin only
		k := attempt.NewClock(runBudget, base, time.Second)   // the worker's way
		rng := rand.New(rand.NewPCG(20, 12))
		var now time.Duration
		var refs, got []*attempt.Ctx
		fast, slow, published, others := 0, 0, 0, 0
		retries := 0 // attempts left in a run of attempts' (a retried item's)
		for i := range 5000 {
			switch rng.IntN(16) {
			case 0, 1: // a new clock reading: within the epoch's span, or past it
				now += time.Duration(rng.IntN(3)) * runBudget / 2
			case 2, 3: // the end of a run
				ref.Publish()
				k.Publish()
				published = i
			case 4:
				ref.Ask.Store(true)
				k.Ask.Store(true)
			case 5:
				if retries == 0 {
					retries = 1 + rng.IntN(3)
				}
			}
			parent := parents[0]
			var c *attempt.Ctx
			if retries > 0 { // attempts' (timeoutCall): any parent
				if rng.IntN(2) == 0 {
					parent = parents[1]
					others++
				}
				c = parentAttempt(k, parent, now)
				if retries--; retries == 0 {
					keepInline(k, parents[0]) // items, after attempts returns
				}
			} else if c = nextAttempt(k, now); c != nil { // items' inline path
				fast++
			} else {
				slow++
				c = k.Begin(parent, now)
			}
			r := ref.Begin(parent, now)
			if ref.Ask.Load() != k.Ask.Load() {
				t.Fatalf("attempt %d: the watcher's ask answered on one clock only", i)
			}
			refs, got = append(refs, r), append(got, c)
			if c.Value(key{}) != parent.Value(key{}) {
				t.Fatalf("attempt %d: parent value %v, want %v", i, c.Value(key{}), parent.Value(key{}))
			}
			if i%13 == 0 { // looked at during its attempt on both
				rd, _ := r.Deadline()
				cd, _ := c.Deadline()
				if rd != cd || r.Err() != nil || c.Err() != nil {
					t.Fatalf("attempt %d (after the publish at %d): deadline %v and %v, Err %v and %v",
						i, published, rd.Sub(base), cd.Sub(base), r.Err(), c.Err())
				}
				r.Finish()
				c.Finish()
			}
		}
		if fast == 0 || slow == 0 || others == 0 {
			t.Fatalf("%d attempts on the fast path, %d through Begin, %d of another parent: want all", fast, slow, others)
		}
		ref.Publish()
		k.Publish()
		for i := range refs {
			rd, _ := refs[i].Deadline()
			cd, _ := got[i].Deadline()
			if rd != cd || got[i].Value(key{}) != refs[i].Value(key{}) {
				t.Fatalf("attempt %d: deadline %v and %v, value %v and %v", i, rd.Sub(base), cd.Sub(base), refs[i].Value(key{}), got[i].Value(key{}))
			}
			if !errors.Is(got[i].Err(), context.Canceled) || !errors.Is(refs[i].Err(), context.Canceled) {
				t.Fatalf("attempt %d: Err %v and %v after the last publish", i, refs[i].Err(), got[i].Err())
			}
		}
	})
}
