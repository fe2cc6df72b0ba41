package pipeline

import (
	"context"
	"errors"
	"iter"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lockFreeStore is a CommittedStore in memory that keeps the largest position and the
// union of the ranges, as Commit's contract asks of a store.
type lockFreeStore struct {
	mu     sync.Mutex
	pos    int64
	ranges []PositionRange
}

func (s *lockFreeStore) Load(ctx context.Context) (int64, error) {
	pos, _, err := s.LoadCommitted(ctx)
	return pos, err
}

func (s *lockFreeStore) LoadCommitted(context.Context) (int64, []PositionRange, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pos, s.ranges, nil
}

func (s *lockFreeStore) Save(ctx context.Context, pos int64) error {
	return s.SaveCommitted(ctx, pos, nil)
}

func (s *lockFreeStore) SaveCommitted(_ context.Context, pos int64, committed []PositionRange) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pos = max(s.pos, pos)
	s.ranges = mergeRanges(s.ranges, committed, s.pos)
	return nil
}

// TestCommitRunsFnWithoutTrackerLock has two sinks on the branches of a Tee commit
// item 0: the first one's function finds the run's tracker unlocked, and blocks until
// the second sink's Commit has settled its item (the other branch's). Commit held the
// tracker locked while the function ran, so a slow transaction stalled every settle of
// the run and every other writer's Commit.
func TestCommitRunsFnWithoutTrackerLock(t *testing.T) {
	t.Parallel()
	store := &lockFreeStore{}
	p := New()
	src := FromCheckpoint(p, store, func(_ context.Context, pos int64) iter.Seq2[int, error] {
		return func(yield func(int, error) bool) {
			for i := pos; i < 3 && yield(int(i), nil); i++ {
			}
		}
	})
	branches := Tee(src, 2)
	firstIn, secondSettled := make(chan struct{}), make(chan struct{})
	errLocked := errors.New("the tracker is locked while Commit's function runs")
	unlocked := func(ctx context.Context) bool {
		t := ctx.Value(commitKey{}).(*commitScope).t
		for range 10000 { // others take the lock for a moment: settles, the source
			if t.mu.TryLock() {
				t.mu.Unlock()
				return true
			}
			runtime.Gosched()
		}
		return false
	}
	To(branches[0], NewSink("first", 1, func(ctx context.Context, v int) error {
		return Commit(ctx, func(ctx context.Context, _ Progress) error {
			if v != 0 {
				return nil
			}
			close(firstIn)
			if !unlocked(ctx) {
				return Fatal(errLocked)
			}
			select { // the other branch's item settles meanwhile
			case <-secondSettled:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
	}))
	To(branches[1], NewSink("second", 1, func(ctx context.Context, v int) error {
		if v == 0 {
			select {
			case <-firstIn:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		err := Commit(ctx, func(ctx context.Context, _ Progress) error {
			if !unlocked(ctx) {
				return Fatal(errLocked)
			}
			return nil
		})
		if v == 0 && err == nil {
			close(secondSettled)
		}
		return err
	}))
	require.NoError(t, p.Run(t.Context()))
	pos, _, err := store.LoadCommitted(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(3), pos)
}
