package pipeline_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// txStore is a CommittedStore in memory whose "transactions" are Commit's fn: it keeps
// the effects (the items a sink committed) and the progress together, as a database
// sink does.
type txStore struct {
	memCommitted
	effects map[int]int // item -> times committed
}

func newTxStore() *txStore { return &txStore{effects: map[int]int{}} }

// commit is one transaction: the batch's effects and the progress.
func (s *txStore) commit(p pipeline.Progress, batch []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range batch {
		s.effects[v]++
	}
	s.recordLocked(p)
}

// covered reports whether the store's progress covers position i.
func (s *txStore) covered(i int) bool {
	if int64(i) < s.pos {
		return true
	}
	for _, r := range s.committed {
		if int64(i) >= r.From && int64(i) < r.To {
			return true
		}
	}
	return false
}

func TestCommitOutsideCheckpointedRun(t *testing.T) {
	t.Parallel()
	var got []pipeline.Progress
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []int{1, 2}), pipeline.NewSink("sink", 1, func(ctx context.Context, _ int) error {
		return pipeline.Commit(ctx, func(_ context.Context, pr pipeline.Progress) error {
			got = append(got, pr)
			return nil
		})
	}))
	require.NoError(t, p.Run(t.Context()))
	assert.Equal(t, []pipeline.Progress{{}, {}}, got)
	// Outside a sink too.
	require.NoError(t, pipeline.Commit(t.Context(), func(_ context.Context, pr pipeline.Progress) error {
		assert.False(t, pr.Checkpointed)
		return nil
	}))
}

// TestToTreatsNewStageAsSink checks that a NewStage with the output type struct{}
// attached by To is a sink exactly as a NewSink: Commit records its progress, SetAside
// counts in its row, and the row is a "sink".
func TestToTreatsNewStageAsSink(t *testing.T) {
	t.Parallel()
	errRow := errors.New("row rejected")
	for _, ctor := range []string{"NewSink", "NewStage"} {
		t.Run(ctor, func(t *testing.T) {
			t.Parallel()
			const n = 20
			store := newTxStore()
			p := pipeline.New()
			src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(1000))
			var checkpointed, uncovered int
			write := func(ctx context.Context, v int) error {
				if v%5 == 0 {
					pipeline.SetAside(ctx, errRow)
				}
				return pipeline.Commit(ctx, func(_ context.Context, pr pipeline.Progress) error {
					if pr.Checkpointed {
						checkpointed++
					}
					store.commit(pr, []int{v})
					if !store.covered(v) {
						uncovered++
					}
					return nil
				})
			}
			sink := pipeline.NewSink("write", 1, write)
			if ctor == "NewStage" {
				sink = pipeline.NewStage("write", 1, func(ctx context.Context, v int) (struct{}, error) { return struct{}{}, write(ctx, v) })
			}
			pipeline.To(src, sink)
			require.NoError(t, p.Run(t.Context()))
			assert.Equal(t, n, checkpointed, "every item's Commit saw the checkpoint's progress")
			assert.Zero(t, uncovered, "each commit covered its item")
			rep := p.Report()
			checkAccounting(t, rep)
			row, ok := rep.Stage("write")
			require.True(t, ok)
			assert.Equal(t, pipeline.KindSink, row.Kind)
			assert.Equal(t, int64(n/5), row.SetAside)
			assert.Equal(t, int64(n), store.pos)
		})
	}
}

// TestCommitProgressIsExact checks, at every commit of batches committed out of order by
// several writers, that the progress recorded covers exactly the items committed so far.
func TestCommitProgressIsExact(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 4} {
		const n = 2000
		store := newTxStore()
		p := pipeline.New(pipeline.WithBuffer(8))
		src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(50))
		var bad []string
		pipeline.ToBatches(src, 7, pipeline.NewSink("sink", workers, func(ctx context.Context, b []int) error {
			return pipeline.Commit(ctx, func(_ context.Context, pr pipeline.Progress) error {
				store.commit(pr, b)
				store.mu.Lock()
				defer store.mu.Unlock()
				for i := range n {
					if store.covered(i) != (store.effects[i] > 0) {
						bad = append(bad, "mismatch")
						break
					}
				}
				return nil
			})
		}))
		require.NoError(t, p.Run(t.Context()))
		assert.Empty(t, bad, "workers=%d", workers)
		assert.Equal(t, int64(n), store.pos)
		assert.Len(t, store.effects, n)
	}
}

// TestCommitResumeSkipsCommitted fails a run after some batches committed out of order,
// resumes it, and checks that every item was committed exactly once.
func TestCommitResumeSkipsCommitted(t *testing.T) {
	t.Parallel()
	const n = 3000
	store := newTxStore()
	boom := errors.New("boom")
	for run := range 2 {
		p := pipeline.New(pipeline.WithBuffer(4))
		src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(1000))
		later := make(chan struct{}) // closed when a batch above 1600 committed
		var once sync.Once
		held := false
		pipeline.ToBatches(src, 10, pipeline.NewSink("sink", 4, func(ctx context.Context, b []int) error {
			if run == 0 && slices.Contains(b, 1500) {
				held = true
				select { // let later batches commit out of order first
				case <-later:
				case <-ctx.Done():
				}
				return boom // never committed: holds the watermark at or below 1500
			}
			return pipeline.Commit(ctx, func(_ context.Context, pr pipeline.Progress) error {
				store.commit(pr, b)
				if b[0] > 1600 {
					once.Do(func() { close(later) })
				}
				return nil
			})
		}))
		err := p.Run(t.Context())
		if run == 0 {
			require.ErrorIs(t, err, boom)
			assert.True(t, held)
			assert.LessOrEqual(t, store.pos, int64(1500))
			continue
		}
		require.NoError(t, err)
	}
	for i := range n {
		require.Equal(t, 1, store.effects[i], "item %d", i)
	}
	assert.Equal(t, int64(n), store.pos)
}

// TestCommitSkipsGivenRanges resumes from a store holding committed ranges above its
// watermark: those items are not emitted again.
func TestCommitSkipsGivenRanges(t *testing.T) {
	t.Parallel()
	store := newTxStore()
	store.pos = 10
	store.committed = []pipeline.PositionRange{{From: 25, To: 30}, {From: 5, To: 12}, {From: 18, To: 20}}
	p := pipeline.New()
	got, err := pipeline.Collect(t.Context(), pipeline.FromCheckpoint(p, store, from(32)))
	require.NoError(t, err)
	assert.Equal(t, []int{12, 13, 14, 15, 16, 17, 20, 21, 22, 23, 24, 30, 31}, got)
	assert.Equal(t, int64(32), store.pos, "the skipped items settle too")
}

// TestCommitSplitItems splits every source item in two, so that its parts land in
// different batches: the progress must cover a position only once both parts are
// committed.
func TestCommitSplitItems(t *testing.T) {
	t.Parallel()
	const n = 1000
	store := newTxStore()
	p := pipeline.New(pipeline.WithBuffer(4))
	src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(10))
	split := pipeline.Then(src, pipeline.NewFlatStage("split", 2, func(_ context.Context, v int, emit func(int)) error {
		emit(2 * v)
		emit(2*v + 1)
		return nil
	}))
	var bad []int
	pipeline.ToBatches(split, 7, pipeline.NewSink("sink", 3, func(ctx context.Context, b []int) error {
		return pipeline.Commit(ctx, func(_ context.Context, pr pipeline.Progress) error {
			store.commit(pr, b)
			store.mu.Lock()
			defer store.mu.Unlock()
			for i := range n {
				if store.covered(i) && (store.effects[2*i] == 0 || store.effects[2*i+1] == 0) {
					bad = append(bad, i)
				}
			}
			return nil
		})
	}))
	require.NoError(t, p.Run(t.Context()))
	assert.Empty(t, bad, "positions covered before both of their parts committed")
	assert.Equal(t, int64(n), store.pos)
	assert.Len(t, store.effects, 2*n)
}

// A checkpointed run through a Filter into batches that Commit saves the final position,
// whatever WithMaxRedo.
func TestCommitAfterFilterAndBatchSavesFinalPosition(t *testing.T) {
	for _, redo := range []int{2, 3, 5} {
		synctest.Test(t, func(t *testing.T) {
			runSavingEach(t, 50, redo, func(_ *pipeline.Pipeline, src *pipeline.Stream[int]) {
				f := pipeline.Filter(src, func(i int) bool { return i%4 != 1 })
				var commits atomic.Int64
				pipeline.ToBatches(f, 6, pipeline.NewSink("s", 1, func(ctx context.Context, _ []int) error {
					return pipeline.Commit(ctx, func(ctx context.Context, pr pipeline.Progress) error {
						commits.Add(1)
						return nil
					})
				}))
			})
		})
	}
}
