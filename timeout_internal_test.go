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
// one begins every attempt with Begin, the other as a worker does (nextAttempt, inline,
// and Begin when it declines), through new clock readings (new epochs and slabs),
// other parents, publishes and the watcher's asks. Every attempt's context must show
// the same deadline and parent on both, be live until its attempt is published and
// canceled after, and the watcher must be told as often on both.
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
		fast, slow, published := 0, 0, 0
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
			}
			parent := parents[0]
			if rng.IntN(10) == 0 {
				parent = parents[1]
			}
			r := ref.Begin(parent, now)
			c := nextAttempt(k, parent, now)
			if c != nil {
				fast++
			} else {
				slow++
				c = k.Begin(parent, now)
			}
			if ref.Ask.Load() != k.Ask.Load() {
				t.Fatalf("attempt %d: the watcher's ask answered on one clock only", i)
			}
			refs, got = append(refs, r), append(got, c)
			if i%13 == 0 { // looked at during its attempt on both
				rd, _ := r.Deadline()
				cd, _ := c.Deadline()
				if rd != cd || c.Value(key{}) != parent.Value(key{}) || r.Err() != nil || c.Err() != nil {
					t.Fatalf("attempt %d (after the publish at %d): deadline %v and %v, value %v, Err %v and %v",
						i, published, rd.Sub(base), cd.Sub(base), c.Value(key{}), r.Err(), c.Err())
				}
				r.Finish()
				c.Finish()
			}
		}
		if fast == 0 || slow == 0 {
			t.Fatalf("%d attempts on the fast path, %d through Begin: want both", fast, slow)
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
