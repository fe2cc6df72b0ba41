package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// TestForEachSeesAnOrderedStageInOrder: after an ordered stage whose workers finish
// out of order, ForEach's calls come in input order and never overlap (fn appends to a
// slice without a lock: -race sees an overlap).
func TestForEachSeesAnOrderedStageInOrder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 200
		p := pipeline.New(pipeline.WithBuffer(4))
		s := pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("jitter", 4, func(_ context.Context, i int) (int, error) {
			time.Sleep(time.Duration(i*7%5) * time.Millisecond) // later items often finish first
			return i, nil
		}, pipeline.WithOrdered(8)))
		var got []int
		pipeline.ForEach(s, func(i int) error { got = append(got, i); return nil })
		require.NoError(t, p.Run(t.Context()))
		assert.Equal(t, ints(n), got)
		rep := p.Report()
		checkReport(t, rep)
		fe := row(t, rep, "ForEach")
		assert.Equal(t, pipeline.KindSink, fe.Kind)
		assert.Equal(t, int64(n), fe.In)
		assert.Equal(t, int64(n), fe.Succeeded)
		assert.Equal(t, 1, fe.Workers)
		assert.Zero(t, fe.QueueCap)
	})
}

// TestForEachCallsNeverOverlap: several goroutines send into ForEach at once (the
// workers of an unordered stage; the workers of a Window, one row though it is), and
// its calls still never overlap.
func TestForEachCallsNeverOverlap(t *testing.T) {
	t.Parallel()
	const n = 2000
	base := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		wire  func(p *pipeline.Pipeline) *pipeline.Stream[int]
		chain bool // the report is a chain of stages (checkReport)
	}{
		{"stage workers", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("work", 4, func(_ context.Context, i int) (int, error) {
				runtime.Gosched()
				return i, nil
			}))
		}, true},
		{"window workers", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			w := pipeline.Window(pipeline.FromSlice(p, ints(n)), pipeline.Tumbling(time.Hour),
				func(i int) int { return i }, // a window per item: every worker has results to send
				func(i int) time.Time { return base.Add(time.Duration(i) * time.Millisecond) },
				pipeline.Fold(0, func(acc, i int) int { return acc + i }),
				pipeline.WithWindowWorkers(3))
			return pipeline.Map(w, func(r pipeline.WindowResult[int, int]) int { return r.Value })
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			var inside, overlaps atomic.Int32
			sum, calls := 0, 0 // no lock: -race sees an overlap
			pipeline.ForEach(tc.wire(p), func(i int) error {
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				runtime.Gosched() // another producer's call would come in now
				sum += i
				calls++
				inside.Add(-1)
				return nil
			}, pipeline.WithName("sum"))
			require.NoError(t, runGuarded(t, p))
			assert.Zero(t, overlaps.Load(), "calls of fn at once")
			assert.Equal(t, n, calls)
			assert.Equal(t, n*(n-1)/2, sum)
			rep := p.Report()
			if tc.chain {
				checkReport(t, rep)
			} else {
				checkAccounting(t, rep)
			}
			assert.Equal(t, int64(n), row(t, rep, "sum").Succeeded)
		})
	}
}

// TestForEachErrorFailsTheRun: an error from fn fails the run with a *StageError
// naming the ForEach; the item counts as failed there, and every item adds up.
func TestForEachErrorFailsTheRun(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 3} {
		t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				p := pipeline.New(pipeline.WithBuffer(2))
				s := pipeline.Then(pipeline.FromSlice(p, ints(100)), pipeline.NewStage("id", workers, identity))
				calls := 0
				pipeline.ForEach(s, func(i int) error {
					calls++
					if i == 40 {
						return errBoom
					}
					return nil
				}, pipeline.WithName("end"))
				err := p.Run(t.Context())
				require.ErrorIs(t, err, errBoom)
				se, ok := errors.AsType[*pipeline.StageError](err)
				require.True(t, ok, "want a *StageError, got %T %v", err, err)
				assert.Equal(t, "end", se.Stage)
				rep := p.Report()
				checkReport(t, rep)
				end := row(t, rep, "end")
				assert.Equal(t, int64(1), end.Failed)
				assert.Equal(t, int64(calls), end.Succeeded+end.Failed, "fn's calls")
				require.Len(t, end.Errors, 1)
				assert.Equal(t, int64(1), end.Errors[0].Failed)
			})
		})
	}
}

// TestForEachPanicFailsTheRunUnderItsProducer: a panic in fn fails the run like a
// panic in Map, under the name of the row whose goroutine ran it; the item counts as
// failed there, and a producer waiting for fn's lock is not left behind (goleak).
func TestForEachPanicFailsTheRunUnderItsProducer(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	s := pipeline.Then(pipeline.FromSlice(p, ints(500)), pipeline.NewStage("work", 4, identity))
	pipeline.ForEach(s, func(i int) error {
		if i == 77 {
			panic("each")
		}
		return nil
	})
	err := runGuarded(t, p) // a producer left waiting for fn's lock hangs the run
	requirePanicIn(t, err, "work", "each")
	rep := p.Report()
	checkAccounting(t, rep)
	checkConservation(t, rep)
}

// TestForEachEndsARunHandedWholeAsItemByItem: an ordered stage's window and a slice
// source hand ForEach whole runs of items; an error, a panic or the run stopping in
// the middle of one ends it exactly as item by item: fn is called for no item after,
// the item it failed or panicked on counts once, and every row adds up.
func TestForEachEndsARunHandedWholeAsItemByItem(t *testing.T) {
	t.Parallel()
	const n, at = 1000, 150
	producers := []struct {
		name string
		wire func(p *pipeline.Pipeline) *pipeline.Stream[int]
	}{
		{"ordered", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.Then(pipeline.FromSlice(p, ints(n)), pipeline.NewStage("id", 3, identity, pipeline.WithOrdered(0)))
		}},
		{"slice", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.FromSlice(p, ints(n), pipeline.WithName("id"))
		}},
	}
	for _, pr := range producers {
		for _, ending := range []string{"error", "panic", "stop"} {
			t.Run(pr.name+"/"+ending, func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					ctx, cancel := context.WithCancel(t.Context())
					defer cancel()
					p := pipeline.New()
					calls, nils := 0, 0
					pipeline.ForEach(pr.wire(p), func(i int) error {
						calls++
						if i == at {
							switch ending {
							case "error":
								return errBoom
							case "panic":
								panic("each")
							default:
								cancel()
							}
						}
						nils++
						return nil
					}, pipeline.WithName("end"))
					err := p.Run(ctx)
					assert.Equal(t, at+1, calls, "fn's calls: none after the item it ended on")
					rep := p.Report()
					checkReport(t, rep)
					end := row(t, rep, "end")
					assert.Equal(t, int64(nils), end.Succeeded)
					switch ending {
					case "error":
						require.ErrorIs(t, err, errBoom)
						assert.Equal(t, int64(1), end.Failed)
					case "panic":
						requirePanicIn(t, err, "id", "each")
						assert.Equal(t, int64(at), end.In, "the item fn panicked on never arrived")
					default:
						require.ErrorIs(t, err, context.Canceled)
						assert.Zero(t, end.Failed)
					}
				})
			})
		}
	}
}

// TestForEachSettlesPositions: in a checkpointed run an item's position settles when fn
// returns nil, so the run saves the end; a failed item holds the checkpoint at or
// before it, and a resumed run redoes it.
func TestForEachSettlesPositions(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 300
		store := &memStore{}
		run := func(failAt int) (seen []int, err error) {
			p := pipeline.New(pipeline.WithBuffer(4))
			src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(10))
			s := pipeline.Then(src, pipeline.NewStage("id", 3, identity, pipeline.WithOrdered(0)))
			pipeline.ForEach(s, func(i int) error {
				if i == failAt {
					return errBoom
				}
				seen = append(seen, i)
				return nil
			})
			err = runWithin(t, p, time.Minute) // a position never settled: the source waits for a save
			checkAccounting(t, p.Report())
			return seen, err
		}
		first, err := run(150)
		require.ErrorIs(t, err, errBoom)
		require.Equal(t, ints(150), first, "in order, up to the failed item")
		assert.Equal(t, int64(150), store.pos, "every item before the failed one settled, and none after")
		resumed := store.pos
		second, err := run(-1)
		require.NoError(t, err)
		assert.Equal(t, int64(n), store.pos)
		require.NotEmpty(t, second)
		assert.Equal(t, int(resumed), second[0], "the resumed run starts at the checkpoint")
		assert.Equal(t, n-1, second[len(second)-1])
	})
}

// TestForEachTellsAnAcknowledgedSource: fn's nil commits an acknowledged item; an
// item after fn failed is not processed, and each is told once.
func TestForEachTellsAnAcknowledgedSource(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 50
		var mu sync.Mutex
		got := map[int][]pipeline.Outcome{}
		p := pipeline.New(pipeline.WithBuffer(2))
		src := pipeline.FromAcked(p, ackBody(n, func(i int) func(pipeline.Settlement) {
			return func(s pipeline.Settlement) {
				mu.Lock()
				got[i] = append(got[i], s.Outcome)
				mu.Unlock()
			}
		}))
		pipeline.ForEach(src, func(i int) error {
			if i == 30 {
				return errBoom
			}
			return nil
		})
		require.ErrorIs(t, runWithin(t, p, time.Minute), errBoom) // an item never settled: the run waits for it
		checkAccounting(t, p.Report())
		mu.Lock()
		defer mu.Unlock()
		for i := range n {
			if _, told := got[i]; !told && i > 30 {
				continue // never emitted: the source stopped first
			}
			require.Lenf(t, got[i], 1, "item %d told %v", i, got[i])
			want := pipeline.Committed
			if i >= 30 {
				want = pipeline.NotProcessed
			}
			assert.Equalf(t, want, got[i][0], "item %d", i)
		}
	})
}

// TestForEachMisuse: ForEach panics on a nil stream or function, a consumed stream, and
// a name taken.
func TestForEachMisuse(t *testing.T) {
	t.Parallel()
	assertPanicsPipeline(t, func() { pipeline.ForEach[int](nil, func(int) error { return nil }) })
	p := pipeline.New()
	s := pipeline.FromSlice(p, ints(3))
	assertPanicsPipeline(t, func() { pipeline.ForEach(s, nil) })
	assertPanicsPipeline(t, func() { pipeline.ForEach(s, func(int) error { return nil }, nil) })
	pipeline.ForEach(s, func(int) error { return nil }, pipeline.WithName("end"))
	assertPanicsPipeline(t, func() { pipeline.ForEach(s, func(int) error { return nil }) })
	q := pipeline.New()
	pipeline.ForEach(pipeline.FromSlice(q, ints(3)), func(int) error { return nil }, pipeline.WithName("FromSlice#9"))
	msg := assertPanicsPipeline(t, func() {
		pipeline.ForEach(pipeline.FromSlice(q, ints(3), pipeline.WithName("x")), func(int) error { return nil }, pipeline.WithName("FromSlice#9"))
	})
	assert.Contains(t, msg, "FromSlice#9")
}
