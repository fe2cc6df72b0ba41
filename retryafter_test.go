package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// TestRetryAfterCap checks the cap on a server's Retry-After: a delay up to the cap is
// waited for exactly; a longer one is not waited for at all, and the item is set aside
// at once with a *RetryAfterError that the dead letter and the report name.
func TestRetryAfterCap(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		after time.Duration
		opts  []pipeline.StageOption
		wait  time.Duration // the retry's wait, when it is retried
		set   bool          // set aside instead
		cap   time.Duration // the cap the error names
	}{
		{name: "an hour, the default cap", after: time.Hour, set: true, cap: 10 * time.Minute},
		{name: "5 minutes, the default cap", after: 5 * time.Minute, wait: 5 * time.Minute},
		{name: "the default cap exactly", after: 10 * time.Minute, wait: 10 * time.Minute},
		{name: "a minute, a cap of 30 s", after: time.Minute, opts: []pipeline.StageOption{pipeline.WithRetryAfterCap(30 * time.Second)}, set: true, cap: 30 * time.Second},
		{name: "30 s, a cap of 30 s", after: 30 * time.Second, opts: []pipeline.StageOption{pipeline.WithRetryAfterCap(30 * time.Second)}, wait: 30 * time.Second},
		{name: "an hour, a cap of 2 h", after: time.Hour, opts: []pipeline.StageOption{pipeline.WithRetryAfterCap(2 * time.Hour)}, wait: time.Hour},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var at []time.Time
				dead := pipeline.NewDeadLetterBuffer[int](10)
				opts := append([]pipeline.StageOption{pipeline.WithRetry(3, nil), pipeline.WithDeadLetter(dead.Add)}, c.opts...)
				st := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
					at = append(at, time.Now())
					if len(at) == 1 {
						return 0, pipeline.RetryAfter(errBoom, c.after)
					}
					return v, nil
				}, opts...)
				p := pipeline.New()
				pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{1, 2}), st), nopSink())
				t0 := time.Now()
				require.NoError(t, p.Run(t.Context()))
				rep := p.Report()
				checkReport(t, rep)
				call := row(t, rep, "call")
				if !c.set {
					require.Len(t, at, 3)
					assert.Equal(t, c.wait, at[1].Sub(at[0]))
					assert.Empty(t, dead.Items())
					assert.Equal(t, int64(2), call.Succeeded)
					return
				}
				assert.Zero(t, time.Since(t0), "no worker waits for a Retry-After past the cap")
				require.Len(t, at, 2, "not retried: item 2 follows at once")
				require.Len(t, dead.Items(), 1)
				dl := dead.Items()[0]
				assert.Equal(t, 1, dl.Item)
				assert.Equal(t, 1, dl.Attempts)
				assert.Equal(t, pipeline.ClassItem, dl.Class)
				assert.Equal(t, "*pipeline.RetryAfterError", dl.ErrType)
				assert.Contains(t, dl.LastError, "past the cap of "+c.cap.String())
				assert.Equal(t, int64(1), call.DeadLettered)
				assert.Equal(t, int64(1), call.Succeeded)
				require.Len(t, rep.Causes(), 1)
				assert.Equal(t, "*pipeline.RetryAfterError", rep.Causes()[0].Type)
			})
		})
	}
}

// TestRetryAfterCapFails checks that a stage without a dead-letter destination fails
// the run with the *RetryAfterError, at once.
func TestRetryAfterCapFails(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		st := pipeline.NewStage("call", 1, func(context.Context, int) (int, error) {
			return 0, pipeline.RetryAfter(errBoom, time.Hour)
		}, pipeline.WithRetry(3, nil))
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{1}), st), nopSink())
		t0 := time.Now()
		err := p.Run(t.Context())
		require.ErrorIs(t, err, pipeline.ErrRetryAfterTooLong)
		require.ErrorIs(t, err, errBoom)
		rae, ok := errors.AsType[*pipeline.RetryAfterError](err)
		require.True(t, ok)
		assert.Equal(t, pipeline.RetryAfterError{Stage: "call", Delay: time.Hour, Cap: 10 * time.Minute, Err: rae.Err}, *rae)
		assert.Zero(t, time.Since(t0))
		checkReport(t, p.Report())
	})
}

// TestRetryAfterCapBreaker checks that a Retry-After past the cap neither opens a
// breaker nor holds it open: the service answered, and the item is set aside. Below
// the cap, the breaker it opens stays open for the delay asked.
func TestRetryAfterCapBreaker(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var calls int
		dead := pipeline.NewDeadLetterBuffer[int](10)
		st := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
			calls++
			if calls == 1 {
				return 0, pipeline.RetryAfter(errBoom, 3600*time.Second)
			}
			return v, nil
		}, pipeline.WithRetry(3, nil), pipeline.WithDeadLetter(dead.Add),
			pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 1, OpenFor: time.Second}))
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, []int{1, 2, 3}), st), nopSink())
		t0 := time.Now()
		require.NoError(t, p.Run(t.Context()))
		assert.Zero(t, time.Since(t0))
		call := row(t, p.Report(), "call")
		require.NotNil(t, call.Breaker)
		assert.Zero(t, call.Breaker.Opened)
		assert.Equal(t, int64(1), call.DeadLettered)
		assert.Equal(t, int64(2), call.Succeeded)
	})
}

// TestRetryAfterCapPanics checks the option's misuse.
func TestRetryAfterCapPanics(t *testing.T) {
	t.Parallel()
	assert.PanicsWithValue(t, "pipeline: WithRetryAfterCap(0s): the cap must be positive", func() { pipeline.WithRetryAfterCap(0) })
	assert.PanicsWithValue(t, "pipeline: WithRetryAfterCap(-1s): the cap must be positive", func() { pipeline.WithRetryAfterCap(-time.Second) })
}
