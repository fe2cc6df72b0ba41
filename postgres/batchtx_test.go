package pgpipe_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
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
