package pgpipe_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// lostSaves is a checkpoint store whose saves are lost while lose is set, as those of
// a process killed before it saved: only what a transaction recorded remains.
type lostSaves struct {
	*pgpipe.Checkpoint
	lose bool
}

func (s *lostSaves) Save(ctx context.Context, pos int64) error {
	return s.SaveCommitted(ctx, pos, nil)
}

func (s *lostSaves) SaveCommitted(ctx context.Context, pos int64, committed []pipeline.PositionRange) error {
	if s.lose {
		return nil
	}
	return s.Checkpoint.SaveCommitted(ctx, pos, committed)
}

// dlJob runs events 0..n-1 through a stage that dead-letters every tenth one into dead
// and upserts the others into table. With block, event 0 waits for the run to stop,
// holding the checkpoint at 0, and the run is canceled once event 0 started and every
// other event is in the table or among the dead letters.
func dlJob(t *testing.T, pool *pgxpool.Pool, store *lostSaves, ck *pgpipe.Checkpoint, dead *pgpipe.DeadLetterTable[event], table string, n int, calls map[int64]int, block bool) error {
	t.Helper()
	add := dead.Add
	if ck != nil {
		add = dead.WithCheckpoint(ck).Add
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, store, func(_ context.Context, pos int64) iter.Seq2[event, error] {
		return func(yield func(event, error) bool) {
			for i := pos; i < int64(n); i++ {
				if !yield(event{ID: i, Name: fmt.Sprint("event ", i)}, nil) {
					return
				}
			}
		}
	})
	s := pipeline.Then(src, pipeline.NewStage("check", 4, func(ctx context.Context, e event) (event, error) {
		mu.Lock()
		calls[e.ID]++
		mu.Unlock()
		switch {
		case e.ID == 0 && block:
			<-ctx.Done()
			return e, ctx.Err()
		case e.ID%10 == 5:
			return e, pipeline.Permanent(fmt.Errorf("bad event %d", e.ID))
		}
		return e, nil
	}, pipeline.WithDeadLetter(add)))
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), pgpipe.WithUpsert("id"), pgpipe.WithCheckpoint(store.Checkpoint), pgpipe.WithChunk(7, 0))
	pipeline.ToBatches(s, 7, w.Sink("load", 2), pipeline.WithLinger(time.Millisecond)) // the last batch is flushed though event 0 is still out
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	if block {
		waitFor(t, "event 0 started and every other settled", func() bool {
			mu.Lock()
			started := calls[0] > 0 // else the stop could end it taken but not started
			mu.Unlock()
			var rows int // queried either way: waitFor counts its polls, each a round trip
			letters, err := dead.Read(ctx, "")
			if err == nil {
				err = pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows)
			}
			return err == nil && started && rows+len(letters) == n-1
		})
		cancel()
	}
	return <-errc
}

// TestDeadLetterTableWithCheckpoint checks that the items a checkpointed run
// dead-lettered are neither redone nor dead-lettered again by the next run: after a
// stop, whose final save records them (they used to be redone), and, when the
// DeadLetterTable was given the run's checkpoint, after a crash that lost every save
// (each letter's transaction recorded its position).
func TestDeadLetterTableWithCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ck, crash bool
	}{{"stop", false, false}, {"stop, letters with checkpoint", true, false}, {"crash, letters with checkpoint", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 200
			// One pool for the writers, the checkpoint and the letters, with a connection
			// per writer: a letter that waited for a connection while holding the run's
			// tracker (which the writers, holding every connection, wait for) hung.
			pool := newPool(t, 2)
			table := createEvents(t, pool, true)
			name := tableName("dead")
			dead, err := pgpipe.OpenDeadLetterTable[event](t.Context(), pool, name, nil)
			require.NoError(t, err)
			t.Cleanup(func() { mustExec(t, pool, "DROP TABLE IF EXISTS "+name) })
			store := &lostSaves{Checkpoint: pgpipe.NewCheckpoint(pool, tableName("job")), lose: tc.crash}
			var ck *pgpipe.Checkpoint
			if tc.ck {
				ck = store.Checkpoint
			}
			calls := map[int64]int{}
			require.ErrorIs(t, dlJob(t, pool, store, ck, dead, table, n, calls, true), context.Canceled)
			store.lose = false
			require.NoError(t, dlJob(t, pool, store, ck, dead, table, n, calls, false))

			letters, err := dead.Read(t.Context(), "")
			require.NoError(t, err)
			got := map[int64]int{}
			for _, dl := range letters {
				got[dl.Item.ID]++
			}
			for i := int64(5); i < n; i += 10 {
				assert.Equal(t, 1, got[i], "dead letters of event %d", i)
				assert.Equal(t, 1, calls[i], "calls of event %d", i)
			}
			assert.Len(t, letters, n/10)
			rows, distinct := count(t, pool, table)
			assert.Equal(t, int64(n-n/10), rows)
			assert.Equal(t, rows, distinct)
			pos, above, err := store.LoadCommitted(t.Context())
			require.NoError(t, err)
			assert.Equal(t, int64(n), pos)
			assert.Empty(t, above)
		})
	}
}

// TestDeadLetterTableRefusalFailsRun checks that a dead-letter table that refuses a
// letter (a constraint of its own) stops the run with a fatal error that names the
// table: the refusal used to be taken for the batch's own row rejection.
func TestDeadLetterTableRefusalFailsRun(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, 4)
	table, dead := createEvents(t, pool, true), tableName("dead")
	dlt, err := pgpipe.OpenDeadLetterTable[event](ctx, pool, dead, nil)
	require.NoError(t, err)
	t.Cleanup(func() { mustExec(t, pool, "DROP TABLE IF EXISTS "+dead) })
	mustExec(t, pool, "ALTER TABLE "+dead+" ADD CONSTRAINT no_letters CHECK (stage <> 'load')")
	mustExec(t, pool, "INSERT INTO "+table+" VALUES (3, 'there before', 0)") // event 3 breaks the primary key

	evs := events(10)
	p := pipeline.New()
	pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), pgpipe.WithDeadLetterTable(dlt)).To(pipeline.FromSlice(p, evs), "load", 1)
	err = p.Run(ctx)
	require.Error(t, err)
	class, ok := pipeline.ClassOf(err)
	assert.True(t, ok && class == pipeline.ClassFatal, "fatal, not %v: %v", class, err)
	_, isRow := errors.AsType[*pgpipe.RowError](err)
	assert.False(t, isRow, "not a row of the batch: %v", err)
	assert.ErrorContains(t, err, "dead letters to "+dead)
}
