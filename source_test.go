package pipeline_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// TestSliceItemsTakenInPlaceAddUp: a FromSlice straight into a stage has its items
// taken by the stage's workers in place, with no goroutine of its own. However the run
// ends (it completes, the stage fails, the caller cancels, a budget drains), the
// source sends exactly what the stage takes, the rest counts as not started in the
// source, and every row adds up; with a Merge, a rendezvous queue or a keyed stage in
// between, the source sends through the queue as before, and the counts add up too.
func TestSliceItemsTakenInPlaceAddUp(t *testing.T) {
	t.Parallel()
	const n, at = 1000, 300
	type wiring struct {
		name string
		wire func(p *pipeline.Pipeline, fn func(context.Context, int) (int, error), opts ...pipeline.StageOption) *pipeline.Stream[int]
	}
	wirings := []wiring{
		{"plain", func(p *pipeline.Pipeline, fn func(context.Context, int) (int, error), opts ...pipeline.StageOption) *pipeline.Stream[int] {
			return pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("work", 3, fn, opts...))
		}},
		{"ordered", func(p *pipeline.Pipeline, fn func(context.Context, int) (int, error), opts ...pipeline.StageOption) *pipeline.Stream[int] {
			return pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("work", 3, fn, append(opts, pipeline.WithOrdered(0))...))
		}},
		{"rendezvous", func(p *pipeline.Pipeline, fn func(context.Context, int) (int, error), opts ...pipeline.StageOption) *pipeline.Stream[int] {
			return pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("work", 3, fn, append(opts, pipeline.WithBuffer(0))...))
		}},
		{"keyed", func(p *pipeline.Pipeline, fn func(context.Context, int) (int, error), opts ...pipeline.StageOption) *pipeline.Stream[int] {
			return pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("work", 3, fn, append(opts, pipeline.WithKey(func(i int) int { return i % 5 }))...))
		}},
		{"merged", func(p *pipeline.Pipeline, fn func(context.Context, int) (int, error), opts ...pipeline.StageOption) *pipeline.Stream[int] {
			in := pipeline.Merge(pipeline.FromSlice(p, ints(n/2)), pipeline.FromSlice(p, ints(n/2), pipeline.WithName("second")))
			return pipeline.Then(in, pipeline.NewStage("work", 3, fn, opts...))
		}},
	}
	for _, w := range wirings {
		for _, ending := range []string{"complete", "fail", "cancel", "drain"} {
			t.Run(w.name+"/"+ending, func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					ctx, cancel := context.WithCancel(t.Context())
					defer cancel()
					p := pipeline.New(pipeline.WithBuffer(16))
					var opts []pipeline.StageOption
					if ending == "drain" {
						opts = append(opts, pipeline.WithErrorBudget(pipeline.Budget{MinSample: 1, Drain: true}), discardDead[int]())
					}
					fn := func(_ context.Context, i int) (int, error) {
						if i == at {
							switch ending {
							case "fail":
								return 0, pipeline.Fatal(errBoom)
							case "cancel":
								cancel()
							case "drain":
								return 0, pipeline.Permanent(errBoom)
							}
						}
						return i, nil
					}
					var c collector[int]
					pipeline.To(w.wire(p, fn, opts...), pipeline.NewSink("sink", 1, c.add))
					err := p.Run(ctx)
					switch ending {
					case "complete":
						require.NoError(t, err)
					case "drain":
						require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
					case "fail":
						require.ErrorIs(t, err, errBoom)
					case "cancel":
						require.ErrorIs(t, err, context.Canceled)
					}
					rep := p.Report()
					checkAccounting(t, rep)
					// Conservation over the sources (a Merge has two): every item has
					// one outcome.
					var given, sent, ends int64
					for _, s := range rep.Stages {
						if s.Kind == pipeline.KindSource {
							given += s.In
							sent += s.Out
							assert.Equal(t, s.In, s.Out+s.NotStarted, "source %q: what it did not send is not started", s.Name)
						}
						ends += s.DeadLettered + s.Failed + s.NotStarted + s.Filtered
					}
					ends += row(t, rep, "sink").Succeeded
					assert.Equal(t, int64(n), given)
					assert.Equal(t, given, ends, "every item has one outcome\n%v", rep)
					work := row(t, rep, "work")
					assert.Equal(t, sent, work.In, "the stage took what the sources sent\n%v", rep)
					if ending == "complete" {
						assert.Equal(t, int64(n), work.Succeeded)
						assert.Len(t, c.got(), n)
					}
					assert.Equal(t, int64(len(c.got())), row(t, rep, "sink").Succeeded, fmt.Sprint(rep))
				})
			})
		}
	}
}

// TestSliceItemsTakenInPlaceKeepTheQueueFull: while a FromSlice's items wait to be
// taken in place, its stage's queue reads as full, as it did when the source kept it
// so (the stage is the bottleneck, and its input shows it), and the workers hold no
// more of them taken and not started than the queue has room for.
func TestSliceItemsTakenInPlaceKeepTheQueueFull(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n, buf = 2000, 16
		p := pipeline.New(pipeline.WithBuffer(buf))
		var mu sync.Mutex
		var queued []int
		var waiting int64 // the most items taken and not started seen
		s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("work", 2, func(_ context.Context, i int) (int, error) {
			snap := row(t, p.Snapshot(), "work")
			mu.Lock()
			defer mu.Unlock()
			if i == n/2 {
				queued = append(queued, snap.QueueLen)
			}
			waiting = max(waiting, snap.NotStarted)
			return i, nil
		}))
		pipeline.To(s, nopSink())
		require.NoError(t, p.Run(t.Context()))
		assert.Equal(t, []int{buf}, queued, "the queue mid-run")
		assert.LessOrEqual(t, waiting, int64(buf), "items taken and not started")
		rep := p.Report()
		checkReport(t, rep)
		assert.Zero(t, row(t, rep, "work").QueueLen, "the queue at the end")
	})
}
