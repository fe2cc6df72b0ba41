package pipeline_test

// Regression tests from a second review, of the seams between the checkpoint tracker, acknowledged
// sources, Commit, budgets and the breaker.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// ackCounter counts settle calls per item.
type ackCounter struct {
	mu  sync.Mutex
	n   map[int]int
	out map[int]pipeline.Outcome
}

func newAckCounter() *ackCounter {
	return &ackCounter{n: map[int]int{}, out: map[int]pipeline.Outcome{}}
}

func (c *ackCounter) settle(i int) func(pipeline.Settlement) {
	return func(s pipeline.Settlement) {
		c.mu.Lock()
		c.n[i]++
		c.out[i] = s.Outcome
		c.mu.Unlock()
	}
}

// checkMade checks that every item whose callback the body made (the items it emitted,
// or tried to) settled once: after a failure the body stops emitting.
func (c *ackCounter) checkMade(t *testing.T, made *sync.Map) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	made.Range(func(k, _ any) bool {
		if i := k.(int); c.n[i] != 1 {
			t.Errorf("item %d settled %d times", i, c.n[i])
		}
		return true
	})
}

func (c *ackCounter) check(t *testing.T, n int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range n {
		if c.n[i] != 1 {
			t.Errorf("item %d settled %d times", i, c.n[i])
		}
	}
}

func runWatch(t *testing.T, p *pipeline.Pipeline) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	select {
	case err := <-errc:
		return err
	case <-time.After(time.Hour):
		t.Fatal("hang")
		return nil
	}
}

func TestR2AckBatchMaxPending(t *testing.T) {
	for _, pend := range []int{1, 2, 3, 7} {
		synctest.Test(t, func(t *testing.T) {
			const n = 50
			c := newAckCounter()
			p := pipeline.New()
			src := pipeline.FromAcked(p, ackBody(n, c.settle), pipeline.WithMaxPending(pend))
			pipeline.ToBatches(src, 5, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
			require.NoError(t, runWatch(t, p))
			c.check(t, n)
			checkAccounting(t, p.Report())
		})
	}
}

func TestR2AckFilterDLBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 60
		c := newAckCounter()
		p := pipeline.New()
		src := pipeline.FromAcked(p, ackBody(n, c.settle), pipeline.WithMaxPending(3))
		f := pipeline.Filter(src, func(i int) bool { return i%3 != 0 })
		s := pipeline.Then(f, pipeline.NewStage("dl", 2, func(_ context.Context, i int) (int, error) {
			if i%5 == 0 {
				return 0, pipeline.Permanent(errBoom)
			}
			return i, nil
		}, discardDead[int]()))
		pipeline.ToBatches(s, 4, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
		require.NoError(t, runWatch(t, p))
		c.check(t, n)
		checkAccounting(t, p.Report())
	})
}

func TestR2AckTeeDL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		c := newAckCounter()
		p := pipeline.New()
		src := pipeline.FromAcked(p, ackBody(n, c.settle), pipeline.WithMaxPending(2))
		br := pipeline.Tee(src, 2)
		pipeline.To(pipeline.Then(br[0], pipeline.NewStage("dl", 1, func(_ context.Context, i int) (int, error) {
			if i%2 == 0 {
				return 0, pipeline.Permanent(errBoom)
			}
			return i, nil
		}, discardDead[int]())), pipeline.NewSink("s0", 1, func(context.Context, int) error { return nil }))
		pipeline.ToBatches(br[1], 8, pipeline.NewSink("s1", 1, func(context.Context, []int) error { return nil }))
		require.NoError(t, runWatch(t, p))
		c.check(t, n)
		c.mu.Lock()
		for i := range n {
			want := pipeline.Committed
			if i%2 == 0 {
				want = pipeline.DeadLettered
			}
			assert.Equal(t, want, c.out[i], "item %d", i)
		}
		c.mu.Unlock()
		checkAccounting(t, p.Report())
	})
}

func TestR2AckHandBackBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 30
		c := newAckCounter()
		p := pipeline.New()
		src := pipeline.FromAcked(p, ackBody(n, c.settle), pipeline.WithMaxPending(2))
		b := pipeline.Batch(src, 4)
		pipeline.To(b, pipeline.NewSink("s", 1, func(_ context.Context, v []int) error {
			if v[0]%2 == 0 {
				return pipeline.Transient(errBoom)
			}
			return nil
		}, pipeline.WithHandBack()))
		require.NoError(t, runWatch(t, p))
		c.check(t, n)
		checkAccounting(t, p.Report())
	})
}

func TestR2CheckpointFilterBatchCommit(t *testing.T) {
	for _, redo := range []int{2, 3, 5} {
		synctest.Test(t, func(t *testing.T) {
			const n = 50
			st := &memStore{}
			p := pipeline.New()
			src := pipeline.FromCheckpoint(p, st, from(n), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(redo))
			f := pipeline.Filter(src, func(i int) bool { return i%4 != 1 })
			var commits atomic.Int64
			pipeline.ToBatches(f, 6, pipeline.NewSink("s", 1, func(ctx context.Context, _ []int) error {
				return pipeline.Commit(ctx, func(ctx context.Context, pr pipeline.Progress) error {
					commits.Add(1)
					return nil
				})
			}))
			require.NoError(t, runWatch(t, p))
			assert.Equal(t, int64(n), st.pos)
			checkAccounting(t, p.Report())
		})
	}
}

func TestR2CheckpointBreakerBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		st := &memStore{}
		p := pipeline.New()
		src := pipeline.FromCheckpoint(p, st, from(n), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(3))
		var calls atomic.Int64
		s := pipeline.Then(src, pipeline.NewStage("svc", 2, func(_ context.Context, i int) (int, error) {
			if k := calls.Add(1); k > 5 && k < 15 {
				return 0, pipeline.Transient(errBoom)
			}
			return i, nil
		}, pipeline.WithRetry(3, nil), pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 2, OpenFor: time.Second}), discardDead[int]()))
		pipeline.ToBatches(s, 10, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
		require.NoError(t, runWatch(t, p))
		assert.Equal(t, int64(n), st.pos)
		checkAccounting(t, p.Report())
	})
}

func TestR2CheckpointHeadDLBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		st := &memStore{}
		p := pipeline.New()
		src := pipeline.FromCheckpoint(p, st, from(n), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(2))
		s := pipeline.Then(src, pipeline.NewStage("dl", 3, func(_ context.Context, i int) (int, error) {
			if i%3 == 0 {
				time.Sleep(time.Millisecond)
				return 0, pipeline.Permanent(errBoom)
			}
			return i, nil
		}, discardDead[int]()))
		pipeline.ToBatches(s, 10, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
		require.NoError(t, runWatch(t, p))
		assert.Equal(t, int64(n), st.pos)
		checkAccounting(t, p.Report())
	})
}

func TestR2AdaptiveOrdered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 300
		c := newAckCounter()
		p := pipeline.New()
		src := pipeline.FromAcked(p, ackBody(n, c.settle), pipeline.WithMaxPending(4))
		s := pipeline.Then(src, pipeline.NewStage("ad", 8, func(_ context.Context, i int) (int, error) {
			time.Sleep(time.Duration(1+i%7) * time.Millisecond)
			if i%11 == 0 {
				return 0, pipeline.Permanent(errBoom)
			}
			return i, nil
		}, pipeline.WithAdaptiveWorkers(1), pipeline.WithOrdered(4), discardDead[int]()))
		var got []int
		pipeline.ToBatches(s, 5, pipeline.NewSink("s", 1, func(_ context.Context, b []int) error { got = append(got, b...); return nil }))
		require.NoError(t, runWatch(t, p))
		c.check(t, n)
		for i := 1; i < len(got); i++ {
			if got[i] < got[i-1] {
				t.Fatalf("out of order at %d: %v", i, got[i-1:i+1])
			}
		}
		checkAccounting(t, p.Report())
	})
}

var _ = errors.New

// A panic in one settle callback of a batch's items loses the callbacks of the
// batch's other items.
func TestR2AckPanicInBatchLosesOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 6
		var mu sync.Mutex
		calls := map[int]int{}
		p := pipeline.New()
		src := pipeline.FromAcked(p, ackBody(n, func(i int) func(pipeline.Settlement) {
			return func(pipeline.Settlement) {
				mu.Lock()
				calls[i]++
				mu.Unlock()
				if i == 0 {
					panic("settle")
				}
			}
		}))
		pipeline.ToBatches(src, 3, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
		err := runWatch(t, p)
		t.Log(err)
		mu.Lock()
		defer mu.Unlock()
		for i := range n {
			if calls[i] != 1 {
				t.Errorf("item %d settled %d times", i, calls[i])
			}
		}
	})
}

func TestR2AckPanicAccounting(t *testing.T) {
	// (Not behind a Filter: there the callback runs in the source's goroutine, whose
	// panic ends the source, so the later items are never emitted, and never settled.)
	for _, shape := range []string{"batch", "tee"} {
		t.Run(shape, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 20
				c := newAckCounter()
				var made sync.Map
				p := pipeline.New()
				src := pipeline.FromAcked(p, ackBody(n, func(i int) func(pipeline.Settlement) {
					f := c.settle(i)
					made.Store(i, true)
					return func(s pipeline.Settlement) {
						f(s)
						if i == 4 && s.Outcome != pipeline.NotProcessed {
							panic("settle")
						}
					}
				}))
				sink := pipeline.NewSink("s", 1, func(context.Context, int) error { return nil })
				switch shape {
				case "batch":
					pipeline.ToBatches(src, 3, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
				case "tee":
					br := pipeline.Tee(src, 2)
					pipeline.To(br[0], sink)
					pipeline.ToBatches(br[1], 3, pipeline.NewSink("s2", 1, func(context.Context, []int) error { return nil }))
				}
				err := runWatch(t, p)
				t.Log(err)
				c.checkMade(t, &made)
				checkAccounting(t, p.Report())
			})
		})
	}
}

// A drained budget while the tracked source waits for room: the items the drained
// stage discards never settle, so the source never wakes.
func TestR2DrainWhileSourceWaits(t *testing.T) {
	budget := pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 1, Drain: true})
	for _, pend := range []int{1, 2, 3, 5} {
		t.Run("ack", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newAckCounter()
				var emitted atomic.Int64
				p := pipeline.New()
				src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
					for i := range 100 {
						emitted.Add(1)
						if err := emit(i, c.settle(i)); err != nil {
							return err
						}
					}
					return nil
				}, pipeline.WithMaxPending(pend))
				s := pipeline.Then(src, pipeline.NewStage("a", 1, func(_ context.Context, i int) (int, error) {
					if i == 3 {
						return 0, pipeline.Permanent(errBoom)
					}
					return i, nil
				}, discardDead[int](), budget))
				pipeline.To(s, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
				err := runWatch(t, p)
				t.Log(pend, err)
				c.check(t, int(emitted.Load()))
				checkAccounting(t, p.Report())
			})
		})
		t.Run("checkpoint", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &memStore{}
				p := pipeline.New()
				src := pipeline.FromCheckpoint(p, st, from(100), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(pend+1))
				s := pipeline.Then(src, pipeline.NewStage("a", 1, func(_ context.Context, i int) (int, error) {
					if i == 3 {
						return 0, pipeline.Permanent(errBoom)
					}
					return i, nil
				}, discardDead[int](), budget))
				pipeline.To(s, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
				err := runWatch(t, p)
				t.Log(pend, err, st.pos)
				checkAccounting(t, p.Report())
			})
		})
	}
}

// The budget's event is emitted before the drain flag is set: an observer that takes
// a moment lets the source refill its pending items into the drained stage's queue and
// wait for room; those items are discarded without settling, and the source waits
// forever.
func TestR2DrainHang(t *testing.T) {
	budget := pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.1, MinSample: 1, Drain: true})
	slowObserver := pipeline.WithObserver(func(e pipeline.Event) {
		if e.Kind == pipeline.EventBudget {
			time.Sleep(time.Millisecond) // a logger writing somewhere slow
		}
	})
	t.Run("ack", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newAckCounter()
			p := pipeline.New(slowObserver)
			src := pipeline.FromAcked(p, ackBody(100, c.settle), pipeline.WithMaxPending(3))
			s := pipeline.Then(src, pipeline.NewStage("a", 1, func(_ context.Context, i int) (int, error) {
				if i == 3 {
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, discardDead[int](), budget))
			pipeline.To(s, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
			err := runWatch(t, p)
			t.Log(err)
		})
	})
	t.Run("checkpoint", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := &memStore{}
			p := pipeline.New(slowObserver)
			src := pipeline.FromCheckpoint(p, st, from(100), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(3))
			s := pipeline.Then(src, pipeline.NewStage("a", 1, func(_ context.Context, i int) (int, error) {
				if i == 3 {
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, discardDead[int](), budget))
			pipeline.To(s, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
			err := runWatch(t, p)
			t.Log(err, st.pos)
		})
	})
}

func TestR2CheckpointShapes(t *testing.T) {
	const n = 60
	dlEvery := func(k int) *pipeline.Stage[int, int] {
		return pipeline.NewStage("dl", 3, func(_ context.Context, i int) (int, error) {
			time.Sleep(time.Duration(i%5) * time.Millisecond)
			if i%k == 0 {
				return 0, pipeline.Permanent(errBoom)
			}
			return i, nil
		}, discardDead[int]())
	}
	okSink := func(name string) *pipeline.Stage[[]int, struct{}] {
		return pipeline.NewSink(name, 2, func(ctx context.Context, _ []int) error {
			return pipeline.Commit(ctx, func(context.Context, pipeline.Progress) error { return nil })
		})
	}
	shapes := map[string]func(p *pipeline.Pipeline, s *pipeline.Stream[int]){
		"tee2batches": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			br := pipeline.Tee(s, 2)
			pipeline.ToBatches(pipeline.Filter(br[0], func(i int) bool { return i%2 == 0 }), 7, okSink("a"))
			pipeline.ToBatches(pipeline.Then(br[1], dlEvery(3)), 5, okSink("b"))
		},
		"batchflattenbatch": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			b := pipeline.Flatten(pipeline.Batch(s, 4))
			pipeline.ToBatches(pipeline.Then(b, dlEvery(4)), 6, okSink("a"))
		},
		"flat": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			f := pipeline.Then(s, pipeline.NewFlatStage("flat", 2, func(_ context.Context, i int, emit func(int)) error {
				for k := range i % 3 {
					emit(i*10 + k)
				}
				return nil
			}))
			pipeline.ToBatches(f, 8, okSink("a"))
		},
		"ordered": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			o := pipeline.Then(s, pipeline.NewStage("o", 3, func(_ context.Context, i int) (int, error) {
				time.Sleep(time.Duration(7-i%7) * time.Millisecond)
				if i%6 == 0 {
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, pipeline.WithOrdered(3), discardDead[int]()))
			pipeline.ToBatches(o, 9, okSink("a"))
		},
		"batchofbatch": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			b := pipeline.Batch(pipeline.Batch(pipeline.Then(s, dlEvery(5)), 3), 4)
			pipeline.To(b, pipeline.NewSink("a", 1, func(ctx context.Context, _ [][]int) error {
				return pipeline.Commit(ctx, func(context.Context, pipeline.Progress) error { return nil })
			}))
		},
	}
	for name, shape := range shapes {
		for _, redo := range []int{2, 3, 6} {
			t.Run(name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					st := &memStore{}
					p := pipeline.New()
					src := pipeline.FromCheckpoint(p, st, from(n), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(redo))
					shape(p, src)
					require.NoError(t, runWatch(t, p))
					assert.Equal(t, int64(n), st.pos)
					checkAccounting(t, p.Report())
				})
			})
		}
	}
}

// plainTxStore is a CommittedStore whose Save and Commit write the position as given.
func TestR2AckBreakerMaxOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 50
		c := newAckCounter()
		var emitted atomic.Int64
		p := pipeline.New()
		src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
			for i := range n {
				emitted.Add(1)
				if err := emit(i, c.settle(i)); err != nil {
					return err
				}
			}
			return nil
		}, pipeline.WithMaxPending(4))
		s := pipeline.Then(src, pipeline.NewStage("svc", 3, func(_ context.Context, i int) (int, error) {
			if i >= 10 {
				return 0, pipeline.Transient(errBoom)
			}
			return i, nil
		}, pipeline.WithRetry(2, nil), pipeline.WithHandBack(), pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 3, OpenFor: time.Second, MaxOpen: 5 * time.Second}), pipeline.WithAdaptiveWorkers(1)))
		pipeline.ToBatches(s, 10, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
		err := runWatch(t, p)
		t.Log(err)
		c.check(t, int(emitted.Load()))
		checkAccounting(t, p.Report())
	})
}

func TestR2AckAllBreak(t *testing.T) {
	// Breaking out of the loop over All: every item the source emitted still settles
	// exactly once (the rest: NotProcessed), and the report adds up.
	c := newAckCounter()
	var made sync.Map
	p := pipeline.New()
	src := pipeline.FromAcked(p, ackBody(10, func(i int) func(pipeline.Settlement) {
		made.Store(i, true)
		return c.settle(i)
	}), pipeline.WithMaxPending(2))
	for v, err := range pipeline.All(t.Context(), src) {
		if err != nil || v == 3 {
			break
		}
	}
	c.checkMade(t, &made)
	checkAccounting(t, p.Report())
}
