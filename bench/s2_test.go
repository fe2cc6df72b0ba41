package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/pause"
)

// S2: error collection (seed 001). 2,000 items, one stage of 20 workers, 5 ms per item;
// the fixture's fail_2pct or fail_50pct ids fail, after reading a 16 KiB response body
// that their error keeps.

const (
	s2Workers  = 20
	s2Latency  = 5 * time.Millisecond
	s2BodySize = 16 << 10
)

// responseError is the error of a failed call. Like the errors of many clients, it
// keeps the response body for diagnosis, so whoever keeps the error value keeps the
// body too: what the scenario measures with retained-B/failure.
type responseError struct {
	ID     int
	Status int
	Body   []byte
}

func (e *responseError) Error() string {
	// Quote the start of the body, as a client error does.
	return fmt.Sprintf("work item %d: status %d: %.48s", e.ID, e.Status, e.Body)
}

// s2Result is what one run of S2 produced.
type s2Result struct {
	err      error
	rep      pipeline.Report
	ok       int   // items Collect returned
	dead     int   // records in the dead-letter buffer
	deadBad  int   // records of items that should not have failed
	retained int64 // heap bytes still held after the run, after a GC
}

// runS2 builds and runs the S2 pipeline. The timer is stopped while it measures the
// heap before and after the run.
func runS2(b *testing.B, policy string, failing []bool) s2Result {
	b.Helper()
	b.StopTimer()
	// Under policy=failfast the user chose no policy: errors are returned unmarked, so
	// the first one is fatal. The others mark them Permanent: the item is set aside.
	mark := pipeline.Permanent
	if policy == "failfast" {
		mark = func(err error) error { return err }
	}
	work := func(ctx context.Context, id int) (int, error) {
		if err := pause.For(ctx, s2Latency); err != nil {
			return 0, err
		}
		if !failing[id] {
			return id, nil
		}
		// The failing call read the whole response before giving up on it.
		body := make([]byte, s2BodySize)
		n := copy(body, fmt.Sprintf(`{"error":"unprocessable entity","item":%d,"detail":"`, id))
		for i := n; i < len(body)-2; i++ {
			body[i] = 'a' + byte(i%26)
		}
		copy(body[len(body)-2:], `"}`)
		return 0, mark(&responseError{ID: id, Status: 422, Body: body})
	}

	dead := pipeline.NewDeadLetterBuffer[int](len(failing))
	var opts []pipeline.StageOption
	switch policy {
	case "failfast":
	case "collect":
		opts = append(opts, pipeline.WithDeadLetter(dead.Add))
	case "budget10":
		opts = append(opts, pipeline.WithDeadLetter(dead.Add),
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.10, MinSample: 20, Drain: true}))
	default:
		panic("unknown policy " + policy)
	}
	ids := make([]int, len(failing))
	for i := range ids {
		ids[i] = i
	}
	p := pipeline.New()
	out := pipeline.Then(pipeline.FromSlice(p, ids), pipeline.NewStage("work", s2Workers, work, opts...))

	var ms runtime.MemStats
	gc()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	b.StartTimer()

	results, err := pipeline.Collect(b.Context(), out)
	ok := len(results)
	results = nil // only the count is kept: the heap below holds what the run left behind

	b.StopTimer()
	gc()
	runtime.ReadMemStats(&ms)
	after := ms.HeapAlloc
	runtime.KeepAlive(results)
	runtime.KeepAlive(dead) // the collected failures,
	runtime.KeepAlive(err)  // the run's error
	runtime.KeepAlive(p)    // and its report are what a caller keeps after a run

	r := s2Result{err: err, rep: p.Report(), ok: ok, retained: int64(after) - int64(before)}
	for _, dl := range dead.Items() {
		r.dead++
		if !failing[dl.Item] {
			r.deadBad++
		}
	}
	b.StartTimer()
	return r
}

// gc collects garbage twice: objects that the first cycle moves to the sync.Pool victim
// caches (fmt's printers, say) are freed by the second, so that they are not counted as
// retained by the run.
func gc() {
	runtime.GC()
	runtime.GC()
}

func BenchmarkS2Collect(b *testing.B) {
	fx := loadFixture(b)
	s2 := fx.Scenario2
	failSets := map[string][]int{"2pct": s2.Fail2pct, "50pct": s2.Fail50pct}

	for _, c := range []struct{ policy, fail string }{
		{"failfast", "2pct"},
		{"collect", "2pct"},
		{"budget10", "2pct"},
		{"budget10", "50pct"},
	} {
		b.Run(fmt.Sprintf("policy=%s,fail=%s", c.policy, c.fail), func(b *testing.B) {
			failing := make([]bool, s2.NItems)
			for _, id := range failSets[c.fail] {
				failing[id] = true
			}
			nFail := len(failSets[c.fail])

			var f figures
			for b.Loop() {
				r := runS2(b, c.policy, failing)
				o, err := settle(r.rep)
				if err != nil {
					b.Fatal(err)
				}
				all, _ := r.rep.Stage("Collect")
				if int64(r.ok) != all.Succeeded {
					b.Fatalf("Collect returned %d items, the report says %d\n%v", r.ok, all.Succeeded, r.rep)
				}
				failed := o.deadLettered + o.failed
				lost := o.given - int64(r.ok) - failed - o.notStarted
				if o.given != int64(s2.NItems) || lost != 0 || r.deadBad != 0 || int64(r.dead) != o.deadLettered {
					b.Fatalf("given %d (want %d), lost %d (want 0), dead letters %d (report: %d), of items that should not fail: %d\n%v",
						o.given, s2.NItems, lost, r.dead, o.deadLettered, r.deadBad, r.rep)
				}
				aborted := 0
				if r.err != nil {
					aborted = 1
				}
				switch {
				case c.policy == "failfast":
					se, isStage := errors.AsType[*pipeline.StageError](r.err)
					if _, isResp := errors.AsType[*responseError](r.err); !isStage || se.Stage != "work" || !isResp {
						b.Fatalf("Run = %v, want a *StageError of stage work wrapping a *responseError\n%v", r.err, r.rep)
					}
				case c.fail == "2pct": // collect, budget10
					if r.err != nil || r.ok != s2.NItems-nFail || failed != int64(nFail) || o.notStarted != 0 {
						b.Fatalf("Run = %v, ok %d, failed %d, not started %d; want nil, %d, %d, 0\n%v",
							r.err, r.ok, failed, o.notStarted, s2.NItems-nFail, nFail, r.rep)
					}
				default: // budget10 at 50 %
					be, isBudget := errors.AsType[*pipeline.BudgetError](r.err)
					if !errors.Is(r.err, pipeline.ErrBudgetExceeded) || !isBudget || !be.Drained || int64(r.ok)+failed > 100 {
						b.Fatalf("Run = %v, ok %d + failed %d; want a drained budget error and at most 100\n%v", r.err, r.ok, failed, r.rep)
					}
				}

				f.add("ok", float64(r.ok))
				f.add("failed", float64(failed))
				f.add("notstarted", float64(o.notStarted))
				f.add("aborted", float64(aborted))
				f.add("lost", float64(lost))
				if failed > 0 {
					f.add("retained-B/failure", float64(r.retained)/float64(failed))
				} else {
					f.add("retained-B/failure", 0)
				}
			}
			f.report(b)
		})
	}
}
