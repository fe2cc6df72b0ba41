package pipeline

import (
	"fmt"
	"math"
	"slices"
	"sync"
)

// Budget is an error budget: the largest share of failed items a stage (or a whole run)
// tolerates before it stops. An item fails when it is dead-lettered; retries that end in
// success do not count.
//
// The budget trips at the first settled item after which at least MinSample items have
// been seen (over the last Window items, when Window > 0) and more than MaxRatio of them
// failed. Then, with Drain false, the run aborts: every stage is canceled and Run returns
// a [*BudgetError]. With Drain true, the run stops taking new items (every source and
// stage stops starting items, but those downstream of the stage that tripped, which
// finish what reached them), lets the items in flight finish, counts the rest as not
// started and then returns the [*BudgetError].
type Budget struct {
	MaxRatio  float64 // in [0, 1): 0.2 tolerates up to 20 % failures
	MinSample int     // at least 1: no verdict before this many items
	Window    int     // 0: all items so far; N: the last N items (N >= MinSample)
	Drain     bool    // finish in-flight items instead of canceling them
}

// WithErrorBudget gives a stage an error budget; given to [New], one budget is shared by
// all the stages of the run (a stage with its own budget uses its own). The counts start
// from zero at each run. It panics if MaxRatio is not in [0, 1), MinSample < 1, or
// Window is neither 0 nor at least MinSample.
//
// A budget takes a mutex per settled item: its cost grows with the stage's workers.
func WithErrorBudget(b Budget) BudgetOption {
	if math.IsNaN(b.MaxRatio) || b.MaxRatio < 0 || b.MaxRatio >= 1 {
		panic(fmt.Sprintf("pipeline: WithErrorBudget: MaxRatio %v is not in [0, 1)", b.MaxRatio))
	}
	if b.MinSample < 1 {
		panic(fmt.Sprintf("pipeline: WithErrorBudget: MinSample %d is less than 1", b.MinSample))
	}
	if b.Window != 0 && b.Window < b.MinSample {
		panic(fmt.Sprintf("pipeline: WithErrorBudget: Window %d is less than MinSample %d", b.Window, b.MinSample))
	}
	return BudgetOption{b}
}

// budgetState is one run's accounting of a Budget.
type budgetState struct {
	cfg Budget

	mu      sync.Mutex
	seen    int64  // items in the sample (capped at Window when it is set)
	failed  int64  // failures in the sample
	ring    []bool // the last Window outcomes, when Window > 0
	pos     int
	tripped bool
}

func newBudgetState(b Budget) *budgetState {
	s := &budgetState{cfg: b}
	if b.Window > 0 {
		s.ring = make([]bool, b.Window)
	}
	return s
}

// record adds one outcome and returns a *BudgetError the first time the budget trips.
func (s *budgetState) record(failed bool) *BudgetError {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tripped {
		return nil
	}
	if s.ring != nil {
		if s.seen == int64(len(s.ring)) {
			if s.ring[s.pos] {
				s.failed--
			}
		} else {
			s.seen++
		}
		s.ring[s.pos] = failed
		s.pos = (s.pos + 1) % len(s.ring)
	} else {
		s.seen++
	}
	if failed {
		s.failed++
	}
	if s.seen < int64(s.cfg.MinSample) || float64(s.failed)/float64(s.seen) <= s.cfg.MaxRatio {
		return nil
	}
	s.tripped = true
	return &BudgetError{Failed: s.failed, Seen: s.seen, MaxRatio: s.cfg.MaxRatio, Window: s.cfg.Window, Drained: s.cfg.Drain}
}

// record tells the budget, if any, about one settled item.
func (w *worker[In, Out]) record(failed bool) error {
	if w.budget == nil {
		return nil
	}
	be := w.budget.record(failed)
	if be == nil {
		return nil
	}
	serr := &StageError{Stage: w.st.name, Err: be}
	if be.Drained {
		// Stop taking new items everywhere but downstream of this stage, before
		// anything else (an observer may be slow): what already passed this stage
		// finishes downstream. Not only upstream: another input of a Merge downstream,
		// or another chain of the pipeline, went on taking items, and an endless one
		// never let the run end. A tracked source waiting for room is woken to stop.
		first := w.r.drained.CompareAndSwap(nil, serr)
		for _, rw := range w.r.rows {
			if !slices.Contains(rw.ups, w.row) {
				rw.drain.Store(true)
			}
		}
		if first {
			close(w.r.drainCh)
		}
		w.r.emit(w.r.ctx, Event{Kind: EventBudget, Stage: w.st.name, Err: serr})
		return nil
	}
	w.r.emit(w.r.ctx, Event{Kind: EventBudget, Stage: w.st.name, Err: serr})
	return serr
}
