package pipeline_test

import (
	"context"
	"fmt"
	"testing"

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
