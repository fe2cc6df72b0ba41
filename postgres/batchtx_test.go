package pgpipe_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// TestWriteRunsBeforeCommitInTheBatchTransaction checks that Write's BeforeCommit
// commits with the rows, that its error rolls them back, that it runs for no rows, and
// that a checkpointed writer refuses Write.
func TestWriteRunsBeforeCommitInTheBatchTransaction(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, 4)
	table := createEvents(t, pool, true)
	marks := tableName("marks")
	mustExec(t, pool, "CREATE TABLE "+marks+" (n int)")
	t.Cleanup(func() { mustExec(t, pool, "DROP TABLE IF EXISTS "+marks) })
	mark := func(n int) pgpipe.BatchTx {
		return pgpipe.BatchTx{BeforeCommit: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+marks+" VALUES ($1)", n)
			return err
		}}
	}
	nmarks := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+marks).Scan(&n))
		return n
	}
	for _, opts := range [][]pgpipe.Option{nil, {pgpipe.WithUpsert("id")}} {
		mustExec(t, pool, "TRUNCATE "+table+", "+marks)
		w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), opts...)
		require.NoError(t, w.Write(ctx, "load", events(10), mark(1)))
		rows, _ := count(t, pool, table)
		assert.Equal(t, int64(10), rows)
		assert.Equal(t, 1, nmarks(), "the mark commits with the rows")

		refused := errors.New("refused")
		err := w.Write(ctx, "load", events(20)[10:], pgpipe.BatchTx{BeforeCommit: func(context.Context, pgx.Tx) error {
			return pipeline.Transient(refused)
		}})
		require.ErrorIs(t, err, refused)
		class, _ := pipeline.ClassOf(err)
		assert.Equal(t, pipeline.ClassTransient, class, "the hook's class is kept")
		rows, _ = count(t, pool, table)
		assert.Equal(t, int64(10), rows, "rolled back with the hook's error")

		require.NoError(t, w.Write(ctx, "load", nil, mark(2)))
		assert.Equal(t, 2, nmarks(), "no rows: the hook runs alone")
	}

	// A rejected row: the batch is written again (a new transaction) to isolate it,
	// and the hook runs in the transaction that commits.
	mustExec(t, pool, "TRUNCATE "+table+", "+marks)
	dead, err := pgpipe.OpenDeadLetterTable[event](ctx, pool, tableName("dead"), nil)
	require.NoError(t, err)
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), pgpipe.WithDeadLetterTable(dead))
	bad := events(5)
	bad[2].Name = "nul \x00 byte"
	require.NoError(t, w.Write(ctx, "load", bad, mark(3)))
	rows, _ := count(t, pool, table)
	assert.Equal(t, int64(4), rows, "the good rows")
	assert.Equal(t, 1, nmarks(), "one mark, with the good rows")
	assert.Equal(t, int64(1), w.Stats().DeadLettered)

	ck := pgpipe.NewCheckpoint(pool, tableName("job"))
	err = pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), pgpipe.WithCheckpoint(ck)).Write(ctx, "load", events(1), pgpipe.BatchTx{})
	class, _ := pipeline.ClassOf(err)
	assert.Equal(t, pipeline.ClassFatal, class, "a checkpointed writer: %v", err)
}

// killCommits makes the first n COMMITs of transactions that inserted into table end
// their session (a deferred trigger terminates its own backend): a FATAL at COMMIT, whose
// outcome the client cannot know (here: rolled back).
func killCommits(tb testing.TB, pool *pgxpool.Pool, table string, n int) {
	tb.Helper()
	seq, fn := table+"_kills", table+"_kill"
	mustExec(tb, pool, "CREATE SEQUENCE "+seq)
	mustExec(tb, pool, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('`+seq+`') <= `+strconv.Itoa(n)+` THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
			RETURN NULL;
		END $$`)
	mustExec(tb, pool, "CREATE CONSTRAINT TRIGGER "+fn+" AFTER INSERT ON "+table+" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
	tb.Cleanup(func() {
		mustExec(tb, pool, "DROP TABLE IF EXISTS "+table)
		mustExec(tb, pool, "DROP FUNCTION IF EXISTS "+fn+"()")
		mustExec(tb, pool, "DROP SEQUENCE IF EXISTS "+seq)
	})
}

// TestWriteResolvesACommitOfUnknownOutcome checks that a COMMIT whose session ends (a
// FATAL) goes to BatchTx.Resolve, whose answer is Write's, and without one fails with a
// transient ErrCommitUnknown.
func TestWriteResolvesACommitOfUnknownOutcome(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t, 4)
	table := createEvents(t, pool, false)
	killCommits(t, pool, table, 2)
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event]())

	err := w.Write(ctx, "load", events(3), pgpipe.BatchTx{})
	require.ErrorIs(t, err, pgpipe.ErrCommitUnknown)
	class, _ := pipeline.ClassOf(err)
	assert.Equal(t, pipeline.ClassTransient, class)

	var cause error
	notCommitted := errors.New("read back: not committed")
	err = w.Write(ctx, "load", events(3), pgpipe.BatchTx{Resolve: func(_ context.Context, c error) error {
		cause = c
		return pipeline.Transient(notCommitted)
	}})
	require.ErrorIs(t, err, notCommitted, "Resolve's answer")
	require.Error(t, cause, "Resolve got the COMMIT's error")
	rows, _ := count(t, pool, table)
	assert.Zero(t, rows, "the two transactions rolled back")

	require.NoError(t, w.Write(ctx, "load", events(3), pgpipe.BatchTx{}), "the third COMMIT goes through")
	rows, _ = count(t, pool, table)
	assert.Equal(t, int64(3), rows)
}
