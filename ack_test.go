package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

func ackBody(n int, settle func(i int) func(pipeline.Settlement)) func(context.Context, func(int, func(pipeline.Settlement)) error) error {
	return func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		for i := range n {
			if err := emit(i, settle(i)); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestFromAckedMisuse(t *testing.T) {
	t.Parallel()
	body := ackBody(1, func(int) func(pipeline.Settlement) { return nil })
	assertPanicsPipeline(t, func() { pipeline.FromAcked[int](nil, body) })
	assertPanicsPipeline(t, func() { pipeline.FromAcked[int](pipeline.New(), nil) })
	assertPanicsPipeline(t, func() { pipeline.WithMaxPending(0) })
	assertPanicsPipeline(t, func() { pipeline.FromAcked(pipeline.New(), body, nil) })
	p := pipeline.New()
	pipeline.FromAcked(p, body)
	msg := assertPanicsPipeline(t, func() { pipeline.FromAcked(p, body) })
	assert.Contains(t, msg, "tracked source")
	assertPanicsPipeline(t, func() { pipeline.FromCheckpoint(p, &memStore{}, from(3)) })
	q := pipeline.New()
	pipeline.FromCheckpoint(q, &memStore{}, from(3))
	assertPanicsPipeline(t, func() { pipeline.FromAcked(q, body) })
}

// TestFromAckedOutcomes: a Tee whose branches commit, filter and dead-letter the copies
// of one item settles it once, with the outcome of the worst copy; a nil callback is
// allowed; the report has no checkpoint.
func TestFromAckedOutcomes(t *testing.T) {
	t.Parallel()
	got := make([]pipeline.Settlement, 6)
	var calls atomic.Int64
	p := pipeline.New()
	src := pipeline.FromAcked(p, ackBody(7, func(i int) func(pipeline.Settlement) {
		if i == 6 {
			return nil
		}
		return func(s pipeline.Settlement) {
			calls.Add(1)
			got[i] = s
		}
	}))
	br := pipeline.Tee(src, 2)
	pipeline.To(pipeline.Filter(br[0], func(i int) bool { return i%2 == 0 }), pipeline.NewSink("even", 2, func(context.Context, int) error { return nil }))
	pipeline.ToBatches(br[1], 2, pipeline.NewSink("batches", 1, func(_ context.Context, b []int) error {
		if slices.Contains(b, 3) {
			return pipeline.Permanent(errBoom) // the whole batch is set aside
		}
		return nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[[]int])))
	require.NoError(t, p.Run(t.Context()))
	assert.Equal(t, int64(6), calls.Load())
	for i, s := range got {
		if i == 2 || i == 3 { // batch [2 3]
			assert.Equal(t, pipeline.DeadLettered, s.Outcome, "item %d", i)
			assert.Equal(t, "batches", s.DeadLetter.Stage)
		} else {
			assert.Equal(t, pipeline.Committed, s.Outcome, "item %d", i)
		}
	}
	assert.Equal(t, int64(-1), p.Report().Checkpoint)
}

// TestFromAckedSettlePanics: a panic in a settle callback fails the run like a stage's
// panic, and every other item is still settled once.
func TestFromAckedSettlePanics(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	p := pipeline.New()
	src := pipeline.FromAcked(p, ackBody(20, func(i int) func(pipeline.Settlement) {
		return func(pipeline.Settlement) {
			calls.Add(1)
			if i == 5 {
				panic("settle")
			}
		}
	}))
	pipeline.To(src, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
	err := p.Run(t.Context())
	_, ok := errors.AsType[*pipeline.PanicError](err)
	require.True(t, ok, "want a panic error, got %v", err)
	assert.LessOrEqual(t, calls.Load(), int64(20))
	assert.GreaterOrEqual(t, calls.Load(), int64(6))
	checkAccounting(t, p.Report())
}

// TestFromAckedEmitRefused: once the run stops (canceled, or a budget drained it),
// emit refuses items, and each item offered is settled once all the same: a refused
// one as not processed.
func TestFromAckedEmitRefused(t *testing.T) {
	t.Parallel()
	for _, drain := range []bool{false, true} {
		outcomes := map[pipeline.Outcome]int{}
		var mu sync.Mutex
		settle := func(s pipeline.Settlement) {
			mu.Lock()
			outcomes[s.Outcome]++
			mu.Unlock()
		}
		offered, refused := 0, 0
		p := pipeline.New()
		ctx, cancel := context.WithCancel(t.Context())
		src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
			for i := range 100 {
				offered++
				if err := emit(i, settle); err != nil {
					refused++
					offered++
					if err := emit(i+100, settle); err == nil { // a source may go on offering
						return errors.New("emit took an item after refusing one")
					}
					return err
				}
			}
			return nil
		})
		var opts []pipeline.StageOption
		if drain {
			opts = append(opts, pipeline.WithErrorBudget(pipeline.Budget{MinSample: 1, Drain: true}), pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]))
		}
		pipeline.To(src, pipeline.NewSink("s", 1, func(_ context.Context, i int) error {
			if i == 10 {
				if drain {
					return pipeline.Permanent(errBoom)
				}
				cancel()
			}
			return nil
		}, opts...))
		err := p.Run(ctx)
		cancel()
		require.Error(t, err)
		assert.Equal(t, 1, refused, "drain=%v", drain)
		total := 0
		for _, c := range outcomes {
			total += c
		}
		assert.Equal(t, offered, total, "drain=%v: every item offered is settled once", drain)
		assert.Positive(t, outcomes[pipeline.NotProcessed], "drain=%v", drain)
		assert.Positive(t, outcomes[pipeline.Committed], "drain=%v", drain)
		checkAccounting(t, p.Report())
	}
}

// TestHandBackDelay: the delay of a handed-back item is the stage's backoff, or the
// longer one a RetryAfter error asks; Commit in a sink of an acknowledged run settles
// nothing itself, and the item is committed when the sink returns.
func TestHandBackDelay(t *testing.T) {
	t.Parallel()
	got := make([]pipeline.Settlement, 3)
	p := pipeline.New()
	src := pipeline.FromAcked(p, ackBody(3, func(i int) func(pipeline.Settlement) {
		return func(s pipeline.Settlement) { got[i] = s }
	}))
	pipeline.To(src, pipeline.NewSink("s", 1, func(ctx context.Context, i int) error {
		switch i {
		case 0:
			return pipeline.Transient(errBoom)
		case 1:
			return pipeline.RetryAfter(errBoom, time.Minute)
		}
		return pipeline.Commit(ctx, func(context.Context, pipeline.Progress) error { return nil })
	}, pipeline.WithHandBack(), pipeline.WithRetry(1, pipeline.ConstantBackoff(time.Second))))
	require.NoError(t, p.Run(t.Context()))
	assert.Equal(t, pipeline.HandedBack, got[0].Outcome)
	assert.Equal(t, time.Second, got[0].Delay)
	assert.Equal(t, pipeline.HandedBack, got[1].Outcome)
	assert.Equal(t, time.Minute, got[1].Delay)
	assert.Equal(t, pipeline.Committed, got[2].Outcome)
	rep := p.Report()
	assert.Equal(t, int64(2), rep.Stages[1].DeadLettered)
	assert.Equal(t, int64(2), rep.Stages[1].HandedBack)
	checkAccounting(t, rep)
}

// TestHandBackCounted: the report counts, of a stage's dead-lettered items, those it
// handed back to their acknowledged source apart from those its destination took; a
// stage with WithHandBack fed by another source dead-letters them all.
func TestHandBackCounted(t *testing.T) {
	t.Parallel()
	fn := func(_ context.Context, i int) (int, error) {
		switch i % 3 {
		case 0:
			return 0, pipeline.Transient(errBoom) // handed back
		case 1:
			return 0, pipeline.Permanent(errBoom) // an item error: dead-lettered
		}
		return i, nil
	}
	opts := []pipeline.StageOption{pipeline.WithHandBack(), discardDead[int]()}
	for _, tc := range []struct {
		name   string
		source func(*pipeline.Pipeline) *pipeline.Stream[int]
		back   int64
	}{
		{"FromAcked", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			return pipeline.FromAcked(p, ackBody(30, func(int) func(pipeline.Settlement) { return nil }))
		}, 10},
		{"FromSlice", func(p *pipeline.Pipeline) *pipeline.Stream[int] {
			items := make([]int, 30)
			for i := range items {
				items[i] = i
			}
			return pipeline.FromSlice(p, items)
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			pipeline.To(pipeline.Then(tc.source(p), pipeline.NewStage("work", 2, fn, opts...)),
				pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
			require.NoError(t, p.Run(t.Context()))
			rep := p.Report()
			work := row(t, rep, "work")
			assert.Equal(t, int64(20), work.DeadLettered, "hand-backs among the dead-lettered")
			assert.Equal(t, tc.back, work.HandedBack)
			assert.Zero(t, row(t, rep, "sink").HandedBack)
			checkAccounting(t, rep)
		})
	}
}

// TestFromAckedWrappedDrainingError: a FromAcked function that wraps emit's error under
// a drained budget made Run return the source's internal draining error, not the
// *BudgetError.
func TestFromAckedWrappedDrainingError(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	outcomes := map[pipeline.Outcome]int{}
	settle := func(s pipeline.Settlement) {
		mu.Lock()
		outcomes[s.Outcome]++
		mu.Unlock()
	}
	offered := 0
	p := pipeline.New()
	src := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
		for i := range 1000 {
			offered++
			if err := emit(i, settle); err != nil {
				return fmt.Errorf("read %d: %w", i, err)
			}
		}
		return nil
	})
	pipeline.To(src, pipeline.NewSink("s", 1, func(context.Context, int) error {
		return pipeline.Permanent(errBoom) // every item: the budget trips at the first
	}, pipeline.WithErrorBudget(pipeline.Budget{MinSample: 1, Drain: true}), discardDead[int]()))

	err := p.Run(t.Context())

	require.ErrorIs(t, err, pipeline.ErrBudgetExceeded)
	be, ok := errors.AsType[*pipeline.BudgetError](err)
	require.Truef(t, ok, "want a *BudgetError, got %v", err)
	assert.True(t, be.Drained)
	se, ok := errors.AsType[*pipeline.StageError](err)
	require.True(t, ok)
	assert.Equal(t, "s", se.Stage, "the stage whose budget drained, not the source")
	total := 0
	for _, c := range outcomes {
		total += c
	}
	assert.Equal(t, offered, total, "every item offered is settled once")
	assert.Positive(t, outcomes[pipeline.NotProcessed])
	checkAccounting(t, p.Report())
}

// ackCounter counts settle calls per item.
type ackCounter struct {
	mu  sync.Mutex
	n   map[int]int
	out map[int]pipeline.Outcome
}

func newAckCounter() *ackCounter {
	return &ackCounter{n: map[int]int{}, out: map[int]pipeline.Outcome{}}
}

// runAcked runs a pipeline whose acknowledged source emits 0 ... n-1 with
// WithMaxPending(pend) and which wire ends, and checks that it succeeds, that every item
// settled exactly once and that the report adds up; it returns the settlements.
func runAcked(t *testing.T, n, pend int, wire func(src *pipeline.Stream[int])) *ackCounter {
	t.Helper()
	c := newAckCounter()
	p := pipeline.New()
	wire(pipeline.FromAcked(p, ackBody(n, c.settle), pipeline.WithMaxPending(pend)))
	require.NoError(t, runWithin(t, p, time.Hour))
	c.check(t, n)
	checkAccounting(t, p.Report())
	return c
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

// Acknowledged items grouped by ToBatches each settle exactly once, whatever WithMaxPending.
func TestAckBatchSettlesEveryItem(t *testing.T) {
	for _, pend := range []int{1, 2, 3, 7} {
		synctest.Test(t, func(t *testing.T) {
			runAcked(t, 50, pend, func(src *pipeline.Stream[int]) {
				pipeline.ToBatches(src, 5, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
			})
		})
	}
}

// Acknowledged items through a Filter, a dead-lettering stage and ToBatches each settle
// exactly once.
func TestAckFilterDeadLetterBatchSettlesEveryItem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		runAcked(t, 60, 3, func(src *pipeline.Stream[int]) {
			f := pipeline.Filter(src, func(i int) bool { return i%3 != 0 })
			s := pipeline.Then(f, pipeline.NewStage("dl", 2, func(_ context.Context, i int) (int, error) {
				if i%5 == 0 {
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, discardDead[int]()))
			pipeline.ToBatches(s, 4, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
		})
	})
}

// An acknowledged item sent by a Tee to a dead-lettering branch and a batching one settles
// once: DeadLettered if the branch dead-lettered it, else Committed.
func TestAckTeeSettlesDeadLetteredFromEitherBranch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		c := runAcked(t, n, 2, func(src *pipeline.Stream[int]) {
			br := pipeline.Tee(src, 2)
			pipeline.To(pipeline.Then(br[0], pipeline.NewStage("dl", 1, func(_ context.Context, i int) (int, error) {
				if i%2 == 0 {
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, discardDead[int]())), pipeline.NewSink("s0", 1, func(context.Context, int) error { return nil }))
			pipeline.ToBatches(br[1], 8, pipeline.NewSink("s1", 1, func(context.Context, []int) error { return nil }))
		})
		c.mu.Lock()
		for i := range n {
			want := pipeline.Committed
			if i%2 == 0 {
				want = pipeline.DeadLettered
			}
			assert.Equal(t, want, c.out[i], "item %d", i)
		}
		c.mu.Unlock()
	})
}

// Acknowledged items in batches that a WithHandBack sink hands back each settle exactly once.
func TestAckHandBackBatchSettlesEveryItem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		runAcked(t, 30, 2, func(src *pipeline.Stream[int]) {
			b := pipeline.Batch(src, 4)
			pipeline.To(b, pipeline.NewSink("s", 1, func(_ context.Context, v []int) error {
				if v[0]%2 == 0 {
					return pipeline.Transient(errBoom)
				}
				return nil
			}, pipeline.WithHandBack()))
		})
	})
}

// TestHandBackBatchWithItemsOfAnotherSource batches items of a source merged with an
// acknowledged one, into a WithHandBack sink that fails every batch: a batch that holds
// an item of the other source cannot be handed back, so it goes to the dead-letter
// destination whole, and its acknowledged items settle as DeadLettered. Such a batch
// was handed back to no one: its items of the other source were neither processed nor
// set aside, and the run succeeded.
func TestHandBackBatchWithItemsOfAnotherSource(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		acked []int // the acknowledged source's items; the other source's are 100 and 101
	}{
		{"only the other source", nil},
		{"mixed", []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				got := map[int]pipeline.Outcome{}
				p := pipeline.New()
				acked := pipeline.FromAcked(p, func(_ context.Context, emit func(int, func(pipeline.Settlement)) error) error {
					for _, v := range tc.acked {
						if err := emit(v, func(s pipeline.Settlement) {
							mu.Lock()
							got[v] = s.Outcome
							mu.Unlock()
						}); err != nil {
							return err
						}
					}
					return nil
				})
				n := len(tc.acked) + 2
				var dead [][]int
				pipeline.ToBatches(pipeline.Merge(acked, pipeline.FromSlice(p, []int{100, 101})), n, pipeline.NewSink("sink", 1, func(context.Context, []int) error {
					return pipeline.Transient(errBoom)
				}, pipeline.WithHandBack(), pipeline.WithDeadLetter(func(_ context.Context, dl pipeline.DeadLetter[[]int]) error {
					dead = append(dead, dl.Item)
					return nil
				})))
				require.NoError(t, p.Run(t.Context()))
				require.Len(t, dead, 1, "the batch set aside")
				assert.ElementsMatch(t, append([]int{100, 101}, tc.acked...), dead[0])
				sink := row(t, p.Report(), "sink")
				assert.Zero(t, sink.HandedBack)
				assert.Equal(t, int64(1), sink.DeadLettered)
				mu.Lock()
				defer mu.Unlock()
				for _, v := range tc.acked {
					assert.Equal(t, pipeline.DeadLettered, got[v], "acknowledged item %d", v)
				}
				checkAccounting(t, p.Report())
			})
		})
	}
}

// A panic in one settle callback of a batch's items does not lose the callbacks of the
// batch's other items (it did).
func TestAckSettlePanicInBatchSettlesOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 6
		var mu sync.Mutex
		calls, made := map[int]int{}, map[int]bool{}
		p := pipeline.New()
		src := pipeline.FromAcked(p, ackBody(n, func(i int) func(pipeline.Settlement) {
			mu.Lock()
			made[i] = true // the run may fail before the source emits them all
			mu.Unlock()
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
		err := runWithin(t, p, time.Hour)
		t.Log(err)
		mu.Lock()
		defer mu.Unlock()
		for i := range n {
			if want := map[bool]int{true: 1}[made[i] || i < 3]; calls[i] != want {
				t.Errorf("item %d (made: %v) settled %d times", i, made[i], calls[i])
			}
		}
	})
}

// A panic in one item's settle callback, behind a Batch or a Tee: every item whose callback
// was made still settles exactly once, and the report adds up.
func TestAckSettlePanicSettlesEveryMadeItem(t *testing.T) {
	// (Not behind a Filter: there the callback runs in the source's goroutine, whose
	// panic ends the source, so the later items are never emitted, and never settled.)
	for _, shape := range []string{"batch", "tee"} {
		t.Run(shape, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := pipeline.New()
				src, c, made := settlePanicSource(p)
				sink := pipeline.NewSink("s", 1, func(context.Context, int) error { return nil })
				switch shape {
				case "batch":
					pipeline.ToBatches(src, 3, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
				case "tee":
					br := pipeline.Tee(src, 2)
					pipeline.To(br[0], sink)
					pipeline.ToBatches(br[1], 3, pipeline.NewSink("s2", 1, func(context.Context, []int) error { return nil }))
				}
				err := runWithin(t, p, time.Hour)
				t.Log(err)
				c.checkMade(t, made)
				checkAccounting(t, p.Report())
			})
		})
	}
}

// TestAckSettlePanicOnDeadLetterCountsOnce checks that a settle callback panicking for
// an item a stage dead-lettered or handed back counts the item once (it was counted
// dead-lettered, then failed by the worker's panic guard).
func TestAckSettlePanicOnDeadLetterCountsOnce(t *testing.T) {
	for _, handBack := range []bool{false, true} {
		t.Run(fmt.Sprint("handBack=", handBack), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := pipeline.New()
				src, c, made := settlePanicSource(p)
				opts := []pipeline.StageOption{pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int])}
				if handBack {
					opts = append(opts, pipeline.WithHandBack())
				}
				s := pipeline.Then(src, pipeline.NewStage("check", 1, func(_ context.Context, i int) (int, error) {
					if i == 4 {
						return 0, pipeline.Transient(errBoom)
					}
					return i, nil
				}, opts...))
				pipeline.To(s, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
				err := runWithin(t, p, time.Hour)
				var pe *pipeline.PanicError
				require.ErrorAs(t, err, &pe)
				c.checkMade(t, made)
				checkAccounting(t, p.Report())
			})
		})
	}
}

// Acknowledged items through a hand-back stage whose breaker stays open (up to MaxOpen),
// with adaptive workers, each settle exactly once.
func TestAckBreakerMaxOpenSettlesEveryItem(t *testing.T) {
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
		err := runWithin(t, p, time.Hour)
		t.Log(err)
		c.check(t, int(emitted.Load()))
		checkAccounting(t, p.Report())
	})
}

// Breaking out of a loop over All settles every acknowledged item the source emitted.
func TestAckAllBreakSettlesEveryItem(t *testing.T) {
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

// settlePanicSource returns an acknowledged source of 20 items in p whose item 4's
// settle callback panics (panicOnSettle), the counter of their settlements, and the
// record of the callbacks made.
func settlePanicSource(p *pipeline.Pipeline) (*pipeline.Stream[int], *ackCounter, *sync.Map) {
	c := newAckCounter()
	made := &sync.Map{}
	return pipeline.FromAcked(p, ackBody(20, panicOnSettle(c, made, 4))), c, made
}

// panicOnSettle gives each item c's settle callback, records in made that the item was
// emitted, and makes item bad's callback panic once its outcome is known (not for
// NotProcessed).
func panicOnSettle(c *ackCounter, made *sync.Map, bad int) func(i int) func(pipeline.Settlement) {
	return func(i int) func(pipeline.Settlement) {
		f := c.settle(i)
		made.Store(i, true)
		return func(s pipeline.Settlement) {
			f(s)
			if i == bad && s.Outcome != pipeline.NotProcessed {
				panic("settle")
			}
		}
	}
}

// ackBatchBody emits items 0..n-1 through FromAckedBatches' emit in batches of size,
// each with settle(i).
func ackBatchBody(n, size int, settle func(i int) func(pipeline.Settlement)) func(context.Context, func([]int, []func(pipeline.Settlement)) error) error {
	return func(_ context.Context, emit func([]int, []func(pipeline.Settlement)) error) error {
		for i := 0; i < n; i += size {
			vs := make([]int, 0, size)
			settles := make([]func(pipeline.Settlement), 0, size)
			for j := i; j < min(i+size, n); j++ {
				vs = append(vs, j)
				settles = append(settles, settle(j))
			}
			if err := emit(vs, settles); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestFromAckedBatchesMisuse(t *testing.T) {
	t.Parallel()
	body := ackBatchBody(1, 1, func(int) func(pipeline.Settlement) { return nil })
	assertPanicsPipeline(t, func() { pipeline.FromAckedBatches[int](nil, body) })
	assertPanicsPipeline(t, func() { pipeline.FromAckedBatches[int](pipeline.New(), nil) })
	p := pipeline.New()
	pipeline.FromAckedBatches(p, body)
	msg := assertPanicsPipeline(t, func() { pipeline.FromAcked(p, ackBody(1, func(int) func(pipeline.Settlement) { return nil })) })
	assert.Contains(t, msg, "tracked source")

	q := pipeline.New()
	src := pipeline.FromAckedBatches(q, func(_ context.Context, emit func([]int, []func(pipeline.Settlement)) error) error {
		return emit([]int{1, 2}, nil)
	})
	pipeline.To(src, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
	var pe *pipeline.PanicError
	require.ErrorAs(t, q.Run(t.Context()), &pe)
	assert.Contains(t, fmt.Sprint(pe.Value), "2 items with 0 settle callbacks")
}

// Items emitted in batches settle exactly once each, with their outcome, whatever the
// batch size against WithMaxPending (a batch larger than the room waits in the middle),
// through a sink, ToBatches, a dead-lettering stage and a Tee; the report adds up.
func TestFromAckedBatchesSettlesEveryItem(t *testing.T) {
	for _, shape := range []string{"sink", "batches", "deadletter", "tee"} {
		for _, pend := range []int{1, 3, 64, 0} {
			for _, size := range []int{1, 5, 100} {
				t.Run(fmt.Sprintf("%s/pending=%d/size=%d", shape, pend, size), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						const n = 300
						c := newAckCounter()
						p := pipeline.New()
						var opts []pipeline.AckOption
						if pend > 0 {
							opts = append(opts, pipeline.WithMaxPending(pend))
						}
						src := pipeline.FromAckedBatches(p, ackBatchBody(n, size, c.settle), opts...)
						sink := pipeline.NewSink("s", 2, func(context.Context, int) error { return nil })
						switch shape {
						case "sink":
							pipeline.To(src, sink)
						case "batches":
							pipeline.ToBatches(src, 7, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
						case "deadletter":
							s := pipeline.Then(src, pipeline.NewStage("dl", 2, func(_ context.Context, i int) (int, error) {
								if i%5 == 0 {
									return 0, pipeline.Permanent(errBoom)
								}
								return i, nil
							}, discardDead[int]()))
							pipeline.To(s, sink)
						case "tee":
							br := pipeline.Tee(src, 2)
							pipeline.To(br[0], sink)
							pipeline.ToBatches(pipeline.Filter(br[1], func(i int) bool { return i%2 == 0 }), 4,
								pipeline.NewSink("s2", 1, func(context.Context, []int) error { return nil }))
						}
						require.NoError(t, runWithin(t, p, time.Hour))
						c.check(t, n)
						c.mu.Lock()
						for i := range n {
							want := pipeline.Committed
							if shape == "deadletter" && i%5 == 0 {
								want = pipeline.DeadLettered
							}
							assert.Equal(t, want, c.out[i], "item %d", i)
						}
						c.mu.Unlock()
						rep := p.Report()
						checkAccounting(t, rep)
						assert.Equal(t, int64(n), rep.Stages[0].Out)
					})
				})
			}
		}
	}
}

// A run that stops in the middle of a batch (a stage fails, or the run is canceled)
// settles every item of every batch the source offered exactly once: those the emit
// did not take as NotProcessed at once, and the report adds up.
func TestFromAckedBatchesStopSettlesEveryItem(t *testing.T) {
	for _, how := range []string{"fail", "cancel", "panic"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 400
				c := newAckCounter()
				var made sync.Map
				p := pipeline.New()
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				src := pipeline.FromAckedBatches(p, ackBatchBody(n, 50, func(i int) func(pipeline.Settlement) {
					made.Store(i, true)
					return c.settle(i)
				}), pipeline.WithMaxPending(20))
				if how == "panic" { // an inline operator's panic in the middle of a batch
					src = pipeline.Map(src, func(i int) int {
						if i == 130 {
							panic("map")
						}
						return i
					})
				}
				pipeline.To(src, pipeline.NewSink("s", 1, func(_ context.Context, i int) error {
					if i == 120 {
						switch how {
						case "fail":
							return errBoom
						case "cancel":
							cancel()
						}
					}
					return nil
				}))
				err := p.Run(ctx)
				require.Error(t, err)
				c.checkMade(t, &made)
				checkAccounting(t, p.Report())
			})
		})
	}
}
