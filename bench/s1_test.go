package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/pause"
)

// S1: per-item errors (seed 000). source → enrich (20 workers) → sink, buffers of 100;
// enrich sleeps 1 ms, then fails the fixture's permanent ids for good, its transient
// ids on their first attempt only, and blocks on its hang ids until its context is done.

type s1Role uint8

const (
	s1OK s1Role = iota
	s1Permanent
	s1Transient
	s1Hang
)

// The errors of the enrich stage. A stage function wraps them with the item's id, as
// Go code does ("enrich item 42: invalid record").
var (
	errInvalidRecord = errors.New("invalid record")       // permanent ids
	errUnavailable   = errors.New("upstream unavailable") // transient ids
	errUpstreamDown  = errors.New("upstream down")        // every id, under policy=budget
)

const (
	s1Workers = 20
	s1Buffer  = 100
	s1Timeout = time.Second
)

// s1Result is what one run of S1 produced.
type s1Result struct {
	err        error
	rep        pipeline.Report
	sunk       int64                      // counted by the sink itself
	dead       []pipeline.DeadLetter[int] // what reached the dead-letter buffer
	wall       time.Duration              // Run's duration
	hangStarts []time.Duration            // when each hanging item's attempt began, from the start of Run
}

// runS1 builds and runs the S1 pipeline under one policy, as a user would write it.
//
// Under policy=failfast the user has chosen no error policy, so the stage function
// returns its errors as they are; the other policies mark them with pipeline.Permanent
// and pipeline.Transient. (A marked error is never fatal: with the markers, failfast
// would set the failing items aside instead of stopping, and then wait for ever on the
// first hanging item, since it has no timeout.)
func runS1(ctx context.Context, policy string, roles []s1Role) s1Result {
	permanent, transient := pipeline.Permanent, pipeline.Transient
	if policy == "failfast" {
		unmarked := func(err error) error { return err }
		permanent, transient = unmarked, unmarked
	}

	attempts := make([]atomic.Int32, len(roles))
	var (
		start      time.Time
		mu         sync.Mutex
		hangStarts []time.Duration
	)
	enrich := func(ctx context.Context, id int) (int, error) {
		role := roles[id]
		if role == s1Hang {
			began := time.Since(start)
			mu.Lock()
			hangStarts = append(hangStarts, began)
			mu.Unlock()
		}
		if err := pause.For(ctx, time.Millisecond); err != nil {
			return 0, err
		}
		if policy == "budget" {
			return 0, pipeline.Permanent(fmt.Errorf("enrich item %d: %w", id, errUpstreamDown))
		}
		switch role {
		case s1Permanent:
			return 0, permanent(fmt.Errorf("enrich item %d: %w", id, errInvalidRecord))
		case s1Transient:
			if attempts[id].Add(1) == 1 {
				return 0, transient(fmt.Errorf("enrich item %d: %w", id, errUnavailable))
			}
		case s1Hang:
			<-ctx.Done()
			return 0, ctx.Err()
		}
		return id, nil
	}

	dead := pipeline.NewDeadLetterBuffer[int](len(roles))
	var opts []pipeline.StageOption
	switch policy {
	case "failfast":
	case "deadletter":
		opts = append(opts, pipeline.WithTimeout(s1Timeout), pipeline.WithDeadLetter(dead.Add))
	case "retry":
		// ConstantBackoff: the scenario's "~10 ms backoff". A transient id succeeds on its
		// second attempt, so only the first wait is ever used.
		opts = append(opts, pipeline.WithTimeout(s1Timeout), pipeline.WithDeadLetter(dead.Add),
			pipeline.WithRetry(3, pipeline.ConstantBackoff(10*time.Millisecond)))
	case "budget":
		opts = append(opts, pipeline.WithTimeout(s1Timeout), pipeline.WithDeadLetter(dead.Add),
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.2, MinSample: 200}))
	default:
		panic("unknown policy " + policy)
	}

	var sunk atomic.Int64
	ids := make([]int, len(roles))
	for i := range ids {
		ids[i] = i
	}
	p := pipeline.New(pipeline.WithBuffer(s1Buffer))
	enriched := pipeline.Then(pipeline.FromSlice(p, ids), pipeline.NewStage("enrich", s1Workers, enrich, opts...))
	pipeline.To(enriched, pipeline.NewSink("sink", 1, func(context.Context, int) error {
		sunk.Add(1)
		return nil
	}))

	start = time.Now()
	err := p.Run(ctx)
	wall := time.Since(start)

	mu.Lock()
	defer mu.Unlock()
	return s1Result{
		err: err, rep: p.Report(), sunk: sunk.Load(), dead: dead.Items(),
		wall: wall, hangStarts: slices.Clone(hangStarts),
	}
}

func BenchmarkS1ItemErrors(b *testing.B) {
	fx := loadFixture(b)
	s1 := fx.Scenario1
	roles := make([]s1Role, s1.NItems)
	for role, ids := range map[s1Role][]int{s1Permanent: s1.Permanent, s1Transient: s1.Transient, s1Hang: s1.Hang} {
		for _, id := range ids {
			roles[id] = role
		}
	}

	for _, policy := range []string{"failfast", "deadletter", "retry", "budget"} {
		b.Run("policy="+policy, func(b *testing.B) {
			var f figures
			for b.Loop() {
				r := runS1(b.Context(), policy, roles)
				o, err := settle(r.rep)
				if err != nil {
					b.Fatal(err)
				}
				sink, _ := r.rep.Stage("sink")
				if r.sunk != sink.Succeeded {
					b.Fatalf("the sink counted %d items, its report says %d\n%v", r.sunk, sink.Succeeded, r.rep)
				}
				// processed: the items whose processing ended other than by being set aside
				// or left unstarted: those that reached the sink, and those that failed (the
				// fatal one and the ones in flight when the run stopped).
				processed := r.sunk + o.failed
				lost := o.given - processed - o.deadLettered - o.notStarted
				if o.given != int64(s1.NItems) || lost != 0 {
					b.Fatalf("given %d (want %d), lost %d (want 0)\n%v", o.given, s1.NItems, lost, r.rep)
				}
				checkS1(b, policy, r, o, roles)

				var floor time.Duration
				if len(r.hangStarts) > 0 {
					floor = slices.Max(r.hangStarts) + s1Timeout
				}
				f.add("processed", float64(processed))
				f.add("deadlettered", float64(o.deadLettered))
				f.add("lost", float64(lost))
				f.add("sunk", float64(r.sunk))
				f.add("wall-s", r.wall.Seconds())
				f.add("floor-s", floor.Seconds())
			}
			f.report(b)
		})
	}
}

// checkS1 asserts the counts that scenarios.md fixes for each policy.
func checkS1(b *testing.B, policy string, r s1Result, o outcome, roles []s1Role) {
	b.Helper()
	switch policy {
	case "failfast":
		se, ok := errors.AsType[*pipeline.StageError](r.err)
		itemErr := errors.Is(r.err, errUnavailable) || errors.Is(r.err, errInvalidRecord)
		if !ok || se.Stage != "enrich" || !itemErr {
			b.Fatalf("Run = %v, want a *StageError of stage enrich wrapping the first item error\n%v", r.err, r.rep)
		}
		if o.deadLettered != 0 {
			b.Fatalf("dead-lettered %d items with no policy, want 0\n%v", o.deadLettered, r.rep)
		}
	case "deadletter", "retry":
		if r.err != nil {
			b.Fatalf("Run = %v, want nil\n%v", r.err, r.rep)
		}
		want := map[string]int{"permanent": 100, "transient": 200, "timeout": 5}
		wantProcessed := int64(9_695)
		if policy == "retry" {
			delete(want, "transient")
			wantProcessed = 9_895
		}
		got := map[string]int{}
		for _, dl := range r.dead {
			switch {
			case dl.ErrType == "timeout" && roles[dl.Item] == s1Hang:
				got["timeout"]++
			case roles[dl.Item] == s1Permanent && dl.Attempts == 1:
				got["permanent"]++
			case roles[dl.Item] == s1Transient:
				got["transient"]++
			default:
				got[fmt.Sprintf("unexpected: item %d, %s after %d attempts", dl.Item, dl.LastError, dl.Attempts)]++
			}
		}
		wantDead := int64(want["permanent"] + want["transient"] + want["timeout"])
		if r.sunk != wantProcessed || o.failed != 0 || o.deadLettered != wantDead || o.notStarted != 0 ||
			int64(len(r.dead)) != wantDead || !maps.Equal(got, want) {
			b.Fatalf("sunk %d (want %d), failed %d (want 0), dead-lettered %d (want %d), not started %d (want 0), dead letters by kind %v (want %v)\n%v",
				r.sunk, wantProcessed, o.failed, o.deadLettered, wantDead, o.notStarted, got, want, r.rep)
		}
		if enrich, _ := r.rep.Stage("enrich"); policy == "retry" && enrich.Retried != 200 {
			b.Fatalf("retried %d times, want 200 (one per transient id)\n%v", enrich.Retried, r.rep)
		}
	case "budget":
		be, ok := errors.AsType[*pipeline.BudgetError](r.err)
		if !errors.Is(r.err, pipeline.ErrBudgetExceeded) || !ok || be.Seen != 200 || be.Failed != 200 {
			b.Fatalf("Run = %v, want the budget error at 200 failed of 200 seen\n%v", r.err, r.rep)
		}
		// The budget trips at the 200th dead letter; the other workers may set aside the
		// items they were finishing before they see the cancellation.
		if o.deadLettered < 200 || o.deadLettered >= 200+s1Workers || r.sunk != 0 {
			b.Fatalf("dead-lettered %d (want 200 to %d), sunk %d (want 0)\n%v", o.deadLettered, 200+s1Workers-1, r.sunk, r.rep)
		}
	}
}
