package pipeline

import (
	"context"
	"errors"
	"iter"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

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

// TestCommitRunsFnWithoutTrackerLock has a sink's two workers commit items 0 and 1: the
// first one's function finds the run's tracker unlocked, and blocks until the other
// worker's Commit has settled item 1. Commit held the tracker locked while the function
// ran, so a slow transaction stalled every settle of the run and every other writer's
// Commit. (Pieces of one position are another matter: see
// TestCommitSplitItemRecordsItsPosition.)
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
	firstIn, oneSettled := make(chan struct{}), make(chan struct{})
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
	To(src, NewSink("write", 2, func(ctx context.Context, v int) error {
		if v == 1 { // item 0's worker is in its function: this is the other worker
			select {
			case <-firstIn:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		err := Commit(ctx, func(ctx context.Context, _ Progress) error {
			if v == 0 {
				close(firstIn)
			}
			if !unlocked(ctx) {
				return Fatal(errLocked)
			}
			if v != 0 {
				return nil
			}
			select { // item 1 settles meanwhile
			case <-oneSettled:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
		if v == 1 && err == nil {
			close(oneSettled)
		}
		return err
	}))
	require.NoError(t, p.Run(t.Context()))
	pos, _, err := store.LoadCommitted(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(3), pos)
}

// splitDB stands for the database of a checkpointed sink: each Commit's function is one
// transaction that adds its rows and its progress record at once.
type splitDB struct {
	mu      sync.Mutex
	rows    map[int64]int // source position -> parts committed for it
	w       int64         // the largest watermark a commit recorded
	covered map[int64]bool
}

func (d *splitDB) commit(pos int64, p Progress) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rows[pos]++
	d.w = max(d.w, p.Watermark)
	for _, r := range p.Committed {
		for x := r.From; x < r.To; x++ {
			d.covered[x] = true
		}
	}
}

// skips reports whether a run resumed from what the commits recorded (a crash before
// the run's next save) skips pos.
func (d *splitDB) skips(pos int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return pos < d.w || d.covered[pos]
}

// TestCommitSplitItemRecordsItsPosition models pgpipe's upsert lanes: position 1 is split
// into two parts (Flatten), written by a sink's two workers, each in a transaction of its
// own that it would like to commit at the same moment as the other; position 0 is still
// upstream (a slow stage), and position 2 commits after both parts of 1. Once 2's commit
// recorded 2, a commit must have recorded 1 too: else a run resumed after a crash there
// (before the next save) skips 2 and redoes 1, whose older values overwrite 2's. It broke
// when Commit stopped holding the tracker's lock across the function: both parts previewed
// while the other was in flight, each consumed a ref, and neither claimed position 1.
func TestCommitSplitItemRecordsItsPosition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := &splitDB{rows: map[int64]int{}, covered: map[int64]bool{}}
		store := &lockFreeStore{}
		p := New()
		src := FromCheckpoint(p, store, func(_ context.Context, pos int64) iter.Seq2[int64, error] {
			return func(yield func(int64, error) bool) {
				for i := pos; i < 3 && yield(i, nil); i++ {
				}
			}
		}, WithSaveEvery(1000), WithSaveInterval(time.Hour))
		release0 := make(chan struct{})
		slow := Then(src, NewStage("slow", 2, func(ctx context.Context, v int64) (int64, error) {
			if v == 0 {
				select {
				case <-release0:
				case <-ctx.Done():
				}
			}
			return v, nil
		}))
		type part struct{ pos, lane int64 }
		parts := Flatten(Map(slow, func(v int64) []part {
			if v == 1 {
				return []part{{1, 0}, {1, 1}}
			}
			return []part{{v, 0}}
		}))
		var mu sync.Mutex
		var inFn, done1 int
		bothIn, oneDone := make(chan struct{}), make(chan struct{})
		var together, skips1, skips2 bool
		To(parts, NewSink("write", 2, func(ctx context.Context, pt part) error {
			if pt.pos == 2 {
				<-oneDone
			}
			err := Commit(ctx, func(ctx context.Context, pr Progress) error {
				if pt.pos == 1 {
					mu.Lock()
					if inFn++; inFn == 2 { // the other part's function is running too
						together = true
						close(bothIn)
					}
					mu.Unlock()
					select { // wait a while for the other part's transaction
					case <-bothIn:
					case <-time.After(time.Second):
					}
					mu.Lock()
					inFn--
					mu.Unlock()
				}
				db.commit(pt.pos, pr)
				if pt.pos == 2 { // the moment after 2 committed: a crash here
					skips1, skips2 = db.skips(1), db.skips(2)
					close(release0)
				}
				return nil
			})
			if pt.pos == 1 {
				mu.Lock()
				if done1++; done1 == 2 {
					close(oneDone)
				}
				mu.Unlock()
			}
			return err
		}))
		require.NoError(t, p.Run(t.Context()))
		assert.False(t, together, "the parts of one position commit one after the other")
		assert.Equal(t, 2, db.rows[1])
		assert.True(t, skips2, "2 is recorded")
		assert.True(t, skips1, "2 is recorded, so 1 must be: both its parts committed before")
		pos, _, err := store.LoadCommitted(t.Context())
		require.NoError(t, err)
		assert.Equal(t, int64(3), pos)
	})
}
