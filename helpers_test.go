package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
)

// awaitClose waits for ch to be closed or for ctx to be done (its error).
var awaitClose = scenario.Await

// runAsync runs p in a goroutine; the channel gives Run's error.
var runAsync = scenario.Start

// errBoom is the error the tests inject.
var errBoom = errors.New("boom")

// ints returns 0, 1, ..., n-1.
func ints(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// emitInts emits 0, 1, ..., n-1 through a Generate's emit, and returns emit's first
// error.
func emitInts(emit func(int) error, n int) error {
	for i := range n {
		if err := emit(i); err != nil {
			return err
		}
	}
	return nil
}

// assertPanicsPipeline checks that f panics with a string that starts with "pipeline:"
// and returns that string.
func assertPanicsPipeline(t *testing.T, f func()) string {
	t.Helper()
	var v any
	func() {
		defer func() { v = recover() }()
		f()
	}()
	msg, ok := v.(string)
	if !assert.Truef(t, ok, "want a panic with a string value, got %#v", v) {
		return ""
	}
	assert.Truef(t, strings.HasPrefix(msg, "pipeline:"), "panic %q does not start with \"pipeline:\"", msg)
	return msg
}

// checkAccounting checks the per-row identities of a report: for a stage or a sink,
// In = Succeeded + DeadLettered + Failed + NotStarted; for a source, In = Succeeded +
// Failed + NotStarted (Failed: an inline operator after it panicked on the item); no
// count is negative.
func checkAccounting(t *testing.T, rep pipeline.Report) {
	t.Helper()
	for _, s := range rep.Stages {
		for _, c := range []int64{s.In, s.Succeeded, s.Out, s.Retried, s.DeadLettered, s.Failed, s.NotStarted, s.Filtered} {
			assert.GreaterOrEqualf(t, c, int64(0), "row %q has a negative count\n%v", s.Name, rep)
		}
		switch s.Kind {
		case pipeline.KindStage, pipeline.KindSink, pipeline.KindBatch, pipeline.KindWindow:
			assert.Equalf(t, s.In, s.Succeeded+s.DeadLettered+s.Failed+s.NotStarted,
				"row %q: In != Succeeded+DeadLettered+Failed+NotStarted\n%v", s.Name, rep)
		case pipeline.KindSource:
			assert.Equalf(t, s.In, s.Succeeded+s.Failed+s.NotStarted, "source %q: In != Succeeded+Failed+NotStarted\n%v", s.Name, rep)
			assert.Equalf(t, s.Succeeded, s.Out, "source %q: Out != Succeeded\n%v", s.Name, rep)
		}
	}
}

// checkChain checks the report of a linear chain (one source first, then stages,
// filters and a sink in flow order): each stage's In is what the row before it sent,
// less what a filter in between dropped.
func checkChain(t *testing.T, rep pipeline.Report) {
	t.Helper()
	require.NotEmpty(t, rep.Stages)
	require.Equal(t, pipeline.KindSource, rep.Stages[0].Kind, "the first row of a chain is its source")
	flow := rep.Stages[0].Succeeded
	for _, s := range rep.Stages[1:] {
		switch s.Kind {
		case pipeline.KindFilter:
			flow -= s.Filtered
		case pipeline.KindStage, pipeline.KindSink:
			assert.Equalf(t, flow, s.In, "row %q: In != what its upstream sent\n%v", s.Name, rep)
			flow = s.Out
		default:
			t.Fatalf("unexpected row kind %q in a chain", s.Kind)
		}
	}
}

// checkConservation checks, for a linear chain of one-to-one stages, that every item
// of the source has exactly one outcome: delivered by the last row, dead-lettered,
// failed, not started or filtered, summed over the chain.
func checkConservation(t *testing.T, rep pipeline.Report) {
	t.Helper()
	require.NotEmpty(t, rep.Stages)
	var sum int64
	for _, s := range rep.Stages {
		sum += s.DeadLettered + s.Failed + s.NotStarted + s.Filtered
	}
	sum += rep.Stages[len(rep.Stages)-1].Succeeded
	assert.Equalf(t, rep.Stages[0].In, sum,
		"source items != delivered + dead-lettered + failed + not started + filtered\n%v", rep)
}

// checkReport runs every check that holds for a linear chain of one-to-one stages.
func checkReport(t *testing.T, rep pipeline.Report) {
	t.Helper()
	checkAccounting(t, rep)
	checkChain(t, rep)
	checkConservation(t, rep)
}

// row returns the report row with the given name, failing the test if there is none.
func row(t *testing.T, rep pipeline.Report, name string) pipeline.StageReport {
	t.Helper()
	s, ok := rep.Stage(name)
	require.Truef(t, ok, "no row %q in the report\n%v", name, rep)
	return s
}

// discardDead is a dead-letter destination that keeps nothing: the items are still
// counted as dead-lettered in the report. A stage needs a destination to dead-letter
// at all (without one, an item error stops the run).
func discardDead[T any]() pipeline.StageOption {
	return pipeline.WithDeadLetter(func(context.Context, pipeline.DeadLetter[T]) error { return nil })
}

// runWithin runs p inside a synctest bubble and fails the test if the run takes longer
// than d of virtual time: a hung run that a ticker keeps from looking deadlocked (the
// checkpoint saver's) fails at once instead of at the test binary's timeout.
func runWithin(t *testing.T, p *pipeline.Pipeline, d time.Duration) error {
	t.Helper()
	return runBounded(t, p, d, func(errc <-chan error) {
		t.Fatalf("the run hung for %v (then returned %v)", d, <-errc)
	})
}

// runGuarded runs p outside a synctest bubble (a goroutine waiting on a mutex is not
// durably blocked, so a bubble would not see the hang) and fails the test if the run
// has not ended after a minute: a bound on a hang, not a measure.
func runGuarded(t *testing.T, p *pipeline.Pipeline) error {
	t.Helper()
	return runBounded(t, p, time.Minute, func(<-chan error) {
		t.Fatal("the run hung for a minute") // not waiting for it: what hangs may never return
	})
}

// runBounded runs p and returns its error; if the run has not ended after d, it
// cancels it and calls hung (which fails the test) with the channel of Run's error.
func runBounded(t *testing.T, p *pipeline.Pipeline, d time.Duration, hung func(errc <-chan error)) error {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := runAsync(ctx, p)
	select {
	case err := <-errc:
		return err
	case <-time.After(d):
		cancel()
		hung(errc)
		return nil
	}
}

// requirePanicIn requires err to be a panic with value (a *PanicError) that failed
// stage (a *StageError).
func requirePanicIn(t *testing.T, err error, stage string, value any) {
	t.Helper()
	pe, ok := errors.AsType[*pipeline.PanicError](err)
	require.True(t, ok, "want a *PanicError, got %v", err)
	assert.Equal(t, value, pe.Value)
	se, ok := errors.AsType[*pipeline.StageError](err)
	require.True(t, ok, "want a *StageError, got %v", err)
	assert.Equal(t, stage, se.Stage)
}
