package pipeline_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// TestCollectFastRuns repeats short runs whose goroutines can all finish before the
// loop over All starts to receive: every item must still be collected (a race between
// the run ending and the consumer starting once yielded a zero value instead).
func TestCollectFastRuns(t *testing.T) {
	t.Parallel()
	for i := range 500 {
		p := pipeline.New()
		got, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(7)), pipeline.NewStage("x", 1, identity)))
		require.NoError(t, err, "run %d", i)
		require.ElementsMatch(t, ints(7), got, "run %d\n%v", i, p.Report())
		checkReport(t, p.Report())
	}
}

// TestAllBudgetAbortEnds checks that a loop over All ends, with the budget error, when
// an error budget aborts the run (the queue into the loop is then not closed).
func TestAllBudgetAbortEnds(t *testing.T) {
	t.Parallel()
	for range 50 {
		p := pipeline.New(pipeline.WithBuffer(2))
		st := pipeline.NewStage("fail", 2, func(_ context.Context, v int) (int, error) {
			if v%2 == 0 {
				return 0, pipeline.Permanent(errBoom)
			}
			return v, nil
		}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]),
			pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 10}))
		_, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(1000)), st))
		require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
		checkReport(t, p.Report())
	}
}

// A panic in the loop body of All keeps the report whole: the "All" row kept the item in
// neither Succeeded nor Failed (In != Succeeded+DeadLettered+Failed+NotStarted).
func TestAllLoopBodyPanicKeepsAccounting(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, []int{1, 2, 3})
	seq := pipeline.All(context.Background(), src)
	func() {
		defer func() { _ = recover() }()
		for _, err := range seq {
			panic(fmt.Sprint("body ", err))
		}
	}()
	checkAccounting(t, p.Report())
}

// TestAllBreakLeavesItsItemUnsettled checks what breaking out of a loop over All does
// to the item the body broke on: the body may have broken before it handled the item,
// so it is not settled as done. An acknowledged source is told NotProcessed for it (a
// checkpointed run would redo it), and the items before it Committed.
func TestAllBreakLeavesItsItemUnsettled(t *testing.T) {
	var mu sync.Mutex
	got := map[string]pipeline.Outcome{}
	p := pipeline.New()
	src := pipeline.FromAcked(p, func(_ context.Context, emit func(string, func(pipeline.Settlement)) error) error {
		for _, m := range []string{"a", "b", "c"} {
			if err := emit(m, func(s pipeline.Settlement) {
				mu.Lock()
				defer mu.Unlock()
				_, twice := got[m]
				require.False(t, twice, "%s settled twice", m)
				got[m] = s.Outcome
			}); err != nil {
				return err
			}
		}
		return nil
	})
	for v, err := range pipeline.All(t.Context(), src, pipeline.WithBuffer(1)) {
		require.NoError(t, err)
		if v == "b" {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, pipeline.Committed, got["a"])
	require.Equal(t, pipeline.NotProcessed, got["b"], "broken on: not done")
	if o, ok := got["c"]; ok {
		require.Equal(t, pipeline.NotProcessed, o)
	}
	checkAccounting(t, p.Report())
}

// TestAllBreakCountsItsItemAsTheSourceIsTold checks that the report of a run whose loop
// over All broke out agrees with what an acknowledged source was told: the end's row
// counts as succeeded exactly the items the source was told Committed, and the item the
// body broke out on (told NotProcessed) as failed, in flight when the run stopped, as a
// panic in the body counts it. It once counted that item succeeded. The break comes at
// the first, a middle and the last item, behind a stage with and without WithOrdered.
func TestAllBreakCountsItsItemAsTheSourceIsTold(t *testing.T) {
	const n = 10
	for _, ordered := range []bool{false, true} {
		for _, at := range []int{0, n / 2, n - 1} {
			t.Run(fmt.Sprintf("ordered=%v/break=%d", ordered, at), func(t *testing.T) {
				c := newAckCounter()
				var made sync.Map
				p := pipeline.New(pipeline.WithBuffer(2))
				src := pipeline.FromAcked(p, ackBody(n, func(i int) func(pipeline.Settlement) {
					made.Store(i, true)
					return c.settle(i)
				}))
				var opts []pipeline.StageOption
				if ordered {
					opts = append(opts, pipeline.WithOrdered(4))
				}
				s := pipeline.Then(src, pipeline.NewStage("x", 3, identity, opts...))
				seen := 0
				for v, err := range pipeline.All(t.Context(), s) {
					require.NoError(t, err)
					if seen++; seen == at+1 {
						if ordered {
							require.Equal(t, at, v, "an ordered stage keeps the order")
						}
						break
					}
				}
				c.checkMade(t, &made)
				rep := p.Report()
				require.NoError(t, rep.Err)
				checkAccounting(t, rep)
				c.mu.Lock()
				committed, notProcessed := 0, 0
				for _, o := range c.out {
					switch o {
					case pipeline.Committed:
						committed++
					case pipeline.NotProcessed:
						notProcessed++
					}
				}
				c.mu.Unlock()
				require.Equal(t, at, committed, "the items before the one broken on are committed")
				end := row(t, rep, "All")
				assert.Equalf(t, int64(committed), end.Succeeded, "the end counts as succeeded the items the source was told Committed\n%v", rep)
				assert.Equalf(t, int64(1), end.Failed, "the item broken on: in flight when the run stopped\n%v", rep)
				assert.Equalf(t, end.In-end.Succeeded, end.Failed+end.NotStarted, "%v", rep)
				assert.GreaterOrEqualf(t, int64(notProcessed), end.In-end.Succeeded, "every item the end took and did not finish is NotProcessed\n%v", rep)
			})
		}
	}
}
