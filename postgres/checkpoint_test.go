package pgpipe_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// restrictedRole creates a login role with no right to create anything (no CREATE on
// schema public), dropped when the test ends, and returns its name.
func restrictedRole(t *testing.T, admin *pgxpool.Pool) string {
	t.Helper()
	role := tableName("pgpipe_role")
	mustExec(t, admin, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() {
		mustExec(t, admin, "DROP OWNED BY "+role)
		mustExec(t, admin, "DROP ROLE "+role)
	})
	mustExec(t, admin, "REVOKE CREATE ON SCHEMA public FROM "+role)
	return role
}

// rolePool opens a pool on the test server as role (when not empty) with searchPath
// (when not empty), closed when the test ends.
func rolePool(t *testing.T, role, searchPath string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL(t))
	require.NoError(t, err)
	if role != "" {
		cfg.ConnConfig.User = role
	}
	if searchPath != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = searchPath
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestCheckpointLoadWithDMLRightsOnly loads and saves a checkpoint as a role that may
// only read and write the existing checkpoint tables. Load used to run CREATE TABLE IF
// NOT EXISTS each time, which fails without CREATE on the schema ("permission denied
// for schema public").
func TestCheckpointLoadWithDMLRightsOnly(t *testing.T) {
	admin := newPool(t, 2)
	_, err := pgpipe.NewCheckpoint(admin, tableName("job_init")).Load(t.Context()) // the tables exist
	require.NoError(t, err)
	role := restrictedRole(t, admin)
	mustExec(t, admin, "GRANT SELECT, INSERT, UPDATE ON pgpipe_checkpoint TO "+role)
	mustExec(t, admin, "GRANT SELECT, INSERT, UPDATE, DELETE ON pgpipe_committed TO "+role)
	mustExec(t, admin, "GRANT SELECT, INSERT, DELETE ON pgpipe_commit_marks TO "+role)

	ck := pgpipe.NewCheckpoint(rolePool(t, role, ""), tableName("job"))
	pos, err := ck.Load(t.Context())
	require.NoError(t, err)
	assert.Zero(t, pos)
	require.NoError(t, ck.Save(t.Context(), 42))
	pos, err = ck.Load(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(42), pos)
}

// TestCheckpointMissingTableNamesTheRight loads a checkpoint as a role that may not
// create the missing tables: the error names the role, the schema and the privilege,
// and wraps PostgreSQL's.
func TestCheckpointMissingTableNamesTheRight(t *testing.T) {
	admin := newPool(t, 2)
	role := restrictedRole(t, admin)
	schema := tableName("pgpipe_schema")
	mustExec(t, admin, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { mustExec(t, admin, "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	mustExec(t, admin, "GRANT USAGE ON SCHEMA "+schema+" TO "+role)

	_, err := pgpipe.NewCheckpoint(rolePool(t, role, schema), "job").Load(t.Context())
	require.Error(t, err)
	pe, ok := errors.AsType[*pgconn.PgError](err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, pgerrcode.InsufficientPrivilege, pe.Code)
	for _, want := range []string{fmt.Sprintf("role %q", role), fmt.Sprintf("schema %q", schema), "CREATE privilege", "pgpipe_checkpoint"} {
		assert.Contains(t, err.Error(), want)
	}

	// Created by a role that may, the tables serve the restricted role.
	adminIn := rolePool(t, "", schema)
	_, err = pgpipe.NewCheckpoint(adminIn, "job_init").Load(t.Context())
	require.NoError(t, err)
	mustExec(t, admin, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %s.pgpipe_checkpoint TO %s", schema, role))
	mustExec(t, admin, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s.pgpipe_committed TO %s", schema, role))
	mustExec(t, admin, fmt.Sprintf("GRANT SELECT, INSERT, DELETE ON %s.pgpipe_commit_marks TO %s", schema, role))
	_, err = pgpipe.NewCheckpoint(rolePool(t, role, schema), "job").Load(t.Context())
	require.NoError(t, err)
}

// TestCheckpointUsesEarlierTablesAsTheyAre loads a checkpoint whose tables are of the
// previous release (no pgpipe_commit_marks): Load creates the missing table and alters
// none, so an owner of the old tables needs no more than CREATE on the schema. Load
// used to add a column to pgpipe_committed, an ALTER TABLE whose exclusive lock (with
// no lock_timeout) could stall every job's commits behind one long transaction.
func TestCheckpointUsesEarlierTablesAsTheyAre(t *testing.T) {
	admin := newPool(t, 2)
	schema := tableName("pgpipe_schema")
	mustExec(t, admin, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { mustExec(t, admin, "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	mustExec(t, admin, `CREATE TABLE `+schema+`.pgpipe_checkpoint (job text PRIMARY KEY, pos bigint NOT NULL,
		epoch bigint NOT NULL, seq bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`)
	mustExec(t, admin, `CREATE TABLE `+schema+`.pgpipe_committed (job text NOT NULL, lo bigint NOT NULL,
		hi bigint NOT NULL, PRIMARY KEY (job, lo))`)
	mustExec(t, admin, `INSERT INTO `+schema+`.pgpipe_checkpoint VALUES ('job', 7, 1, 3, now())`)
	mustExec(t, admin, `INSERT INTO `+schema+`.pgpipe_committed VALUES ('job', 9, 12)`)
	pool := rolePool(t, "", schema)
	ck := pgpipe.NewCheckpoint(pool, "job")
	pos, ranges, err := ck.LoadCommitted(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(7), pos)
	assert.Equal(t, []pipeline.PositionRange{{From: 9, To: 12}}, ranges)
	var cols int
	require.NoError(t, admin.QueryRow(t.Context(), `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'pgpipe_committed'`, schema).Scan(&cols))
	assert.Equal(t, 3, cols, "pgpipe_committed is not altered")
	require.NoError(t, ck.CommitTx(t.Context(), beginTx(t, pool), pipeline.Progress{Checkpointed: true, Watermark: 20}))
	pos, err = pgpipe.NewCheckpoint(pool, "job").Load(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(20), pos)
}

// beginTx begins a transaction on pool, rolled back when the test ends unless committed.
func beginTx(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) })
	return tx
}

// commitRows inserts rows [from, to) into table in one transaction and commits it with p.
func commitRows(ctx context.Context, pool *pgxpool.Pool, ck *pgpipe.Checkpoint, table string, from, to int64, p pipeline.Progress) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after a commit
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" SELECT g, 'x', 0 FROM generate_series($1::bigint, $2::bigint - 1) g", from, to); err != nil {
		return err
	}
	return ck.CommitTx(ctx, tx, p)
}

// TestCheckpointResolveSeesAReusedTransactionID resolves a COMMIT lost with its backend
// while another backend runs a transaction with the same id, as after a crash that
// lost the id before it reached the disk: the server hands it out again. That
// transaction may wait for the resolve to end (a piece of the same position waits in
// pipeline.Commit while its sibling's commit resolves); the resolve waited for it to
// end, for a minute, and failed the run with ErrCommitUnknown (TestFaultServerRestart
// with upsert, whose lanes' parts are pieces of one position). The id held by another
// backend tells that the lost transaction has ended: its mark is not there, so it did
// not commit.
func TestCheckpointResolveSeesAReusedTransactionID(t *testing.T) {
	pool := newPool(t, 4)
	ck := pgpipe.NewCheckpoint(pool, tableName("job"))
	_, err := ck.Load(t.Context())
	require.NoError(t, err)
	lost, err := pgx.Connect(t.Context(), dbURL(t))
	require.NoError(t, err)
	pid := lost.PgConn().PID()
	require.NoError(t, lost.Close(t.Context()))

	holder := beginTx(t, pool) // holds the id the lost transaction had
	var xid string
	require.NoError(t, holder.QueryRow(t.Context(), "SELECT pg_current_xact_id()::text").Scan(&xid))
	err = ck.Resolve(t.Context(), xid, 42, pid, errors.New("the connection was lost"))
	require.Error(t, err)
	require.NotErrorIs(t, err, pgpipe.ErrCommitUnknown)
	require.ErrorContains(t, err, "was not committed")
	class, _ := pipeline.ClassOf(err)
	assert.Equal(t, pipeline.ClassTransient, class, "the batch is written again")
}

// TestCheckpointResolveKeepsTheCommitError resolves a COMMIT whose outcome cannot be
// read back (here, the read-back's connection does not see the marks table): the fatal
// error says why the COMMIT failed, as well as why the read-back did (it used to keep
// only the read-back's).
func TestCheckpointResolveKeepsTheCommitError(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(dbURL(t))
	require.NoError(t, err)
	var lost atomic.Bool // from then on, new connections look for tables in pg_catalog only
	cfg.ConnConfig.AfterConnect = func(ctx context.Context, pc *pgconn.PgConn) error {
		if !lost.Load() {
			return nil
		}
		return pc.Exec(ctx, "SET search_path TO pg_catalog").Close()
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ck := pgpipe.NewCheckpoint(pool, tableName("job"))
	_, err = ck.Load(t.Context())
	require.NoError(t, err)
	lost.Store(true)
	cause := &pgconn.PgError{Severity: "FATAL", Code: pgerrcode.AdminShutdown, Message: "terminating connection due to administrator command"}
	err = ck.Resolve(t.Context(), "12345", 42, 1, cause)
	require.ErrorIs(t, err, pgpipe.ErrCommitUnknown)
	require.ErrorIs(t, err, cause, "the COMMIT's error")
	require.ErrorContains(t, err, "SQLSTATE "+pgerrcode.UndefinedTable, "the read-back's error")
	class, _ := pipeline.ClassOf(err)
	assert.Equal(t, pipeline.ClassFatal, class)
}

// TestCheckpointMarksSurviveEarlierReleaseSave has an instance of the previous release,
// fenced by a new one, run its periodic save once more (a rolling deploy): its DELETE of
// the job's rows of pgpipe_committed below the position has no epoch guard. It deleted
// the new release's marks kept there (hi <= 0), so the new instance's committed batch
// had no record left, and after a crash before its next save the batch was written
// again (duplicates in insert mode).
func TestCheckpointMarksSurviveEarlierReleaseSave(t *testing.T) {
	pool := newPool(t, 4)
	table := createEvents(t, pool, false)
	job := tableName("job")
	ctx := t.Context()

	_, err := pgpipe.NewCheckpoint(pool, job).Load(ctx) // stands for the old release's instance
	require.NoError(t, err)
	var oldEpoch int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT epoch FROM pgpipe_checkpoint WHERE job = $1", job).Scan(&oldEpoch))

	ck := pgpipe.NewCheckpoint(pool, job) // the new release's instance takes over
	_, err = ck.Load(ctx)
	require.NoError(t, err)
	require.NoError(t, commitRows(ctx, pool, ck, table, 0, 100, pipeline.Progress{Checkpointed: true, Watermark: 100}))

	// The previous release's save, as its saver sends it.
	b := &pgx.Batch{}
	b.Queue(`UPDATE pgpipe_checkpoint SET pos = GREATEST(pos, $3), updated_at = now() WHERE job = $1 AND epoch = $2`, job, oldEpoch, int64(0))
	b.Queue(`DELETE FROM pgpipe_committed WHERE job = $1 AND hi <= (SELECT pos FROM pgpipe_checkpoint WHERE job = $1)`, job)
	require.NoError(t, pool.SendBatch(ctx, b).Close())

	// The new instance crashes before its next save; the next run loads.
	pos, err := pgpipe.NewCheckpoint(pool, job).Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(100), pos, "the committed batch [0, 100) must not be redone")
}

// TestCheckpointFenceHoldsUnderConcurrentCommits has instance A's four writers commit one
// row each per transaction (recorded as a range of its own) while A's saver folds and
// deletes marks; instance B loads once A has committed a few hundred rows. A's writers
// go on until each is fenced. Every row in the table must then be covered by what B's
// Load returned (a row that is not was committed by a zombie after the newer Load), and
// every position B loaded as committed must have its row.
func TestCheckpointFenceHoldsUnderConcurrentCommits(t *testing.T) {
	const writers, before = 4, 200
	pool := newPool(t, 12)
	table := createEvents(t, pool, false)
	job := tableName("job")
	ctx := t.Context()
	a := pgpipe.NewCheckpoint(pool, job)
	_, err := a.Load(ctx)
	require.NoError(t, err)

	var next, fenced atomic.Int64
	started := make(chan struct{}) // closed once A committed `before` rows
	var once sync.Once
	var wg, savers sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for {
				k := next.Add(1) - 1
				err := commitRows(ctx, pool, a, table, k, k+1, pipeline.Progress{Checkpointed: true, Committed: []pipeline.PositionRange{{From: k, To: k + 1}}})
				if errors.Is(err, pgpipe.ErrFenced) {
					fenced.Add(1)
					return
				}
				if err != nil {
					t.Errorf("commit %d: %v", k, err)
					once.Do(func() { close(started) })
					return
				}
				if k == before {
					once.Do(func() { close(started) })
				}
			}
		})
	}
	stop := make(chan struct{})
	savers.Go(func() { // A's saver, one save after the other until A is fenced
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := a.SaveCommitted(ctx, 0, nil); err != nil {
				return
			}
		}
	})
	<-started
	pos, ranges, err := pgpipe.NewCheckpoint(pool, job).LoadCommitted(ctx)
	require.NoError(t, err)
	wg.Wait() // each writer's next commit is fenced
	close(stop)
	savers.Wait()
	assert.Equal(t, int64(writers), fenced.Load(), "every writer of A is fenced")

	covered := func(id int64) bool {
		return id < pos || slices.ContainsFunc(ranges, func(r pipeline.PositionRange) bool { return r.From <= id && id < r.To })
	}
	rows, err := pool.Query(ctx, "SELECT id FROM "+table+" ORDER BY id")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	var lost []int64
	have := map[int64]bool{}
	for _, id := range ids {
		have[id] = true
		if !covered(id) {
			lost = append(lost, id)
		}
	}
	t.Logf("%d rows committed by A; B loaded position %d and %d ranges", len(ids), pos, len(ranges))
	assert.Empty(t, lost, "rows committed but not in the loaded checkpoint")
	for _, r := range ranges {
		for id := r.From; id < r.To; id++ {
			assert.True(t, have[id], "position %d loaded as committed has no row", id)
		}
	}
}

// settledStore is a job's Checkpoint that closes settled once the run saves ranges
// covering [from, to) above its watermark: the items there have settled.
type settledStore struct {
	*pgpipe.Checkpoint
	from, to int64
	settled  chan struct{}
	once     sync.Once
}

func (s *settledStore) SaveCommitted(ctx context.Context, pos int64, committed []pipeline.PositionRange) error {
	err := s.Checkpoint.SaveCommitted(ctx, pos, committed)
	if err == nil && slices.ContainsFunc(committed, func(r pipeline.PositionRange) bool { return r.From <= s.from && r.To >= s.to }) {
		s.once.Do(func() { close(s.settled) })
	}
	return err
}

// TestCheckpointWritersDoNotWaitForEachOther holds the first batch's COMMIT (a deferred
// trigger on its first row waits for an advisory lock the test holds) while three other
// writers commit the other batches into the same job: they commit and settle (the run
// saves them as settled above the held watermark) while the first writer's transaction
// is still open. Each writer's transaction used to update the job's checkpoint row,
// and Commit held the run's tracker across it: the others waited for it.
func TestCheckpointWritersDoNotWaitForEachOther(t *testing.T) {
	const batch, writers, lockKey = 100, 4, 434343
	const n = batch * writers
	pool := newPool(t, 8)
	table := createEvents(t, pool, false)
	fn := table + "_hold"
	mustExec(t, pool, fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock_shared(%d); RETURN NULL; END $$`, fn, lockKey))
	mustExec(t, pool, fmt.Sprintf(`CREATE CONSTRAINT TRIGGER %s AFTER INSERT ON %s
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.id = 0) EXECUTE FUNCTION %s()`, fn, table, fn))
	t.Cleanup(func() {
		mustExec(t, pool, "DROP TABLE IF EXISTS "+table) // and its trigger, before the function
		mustExec(t, pool, "DROP FUNCTION IF EXISTS "+fn+"()")
	})
	holder, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(t.Context(), "SELECT pg_advisory_lock($1)", lockKey)
	require.NoError(t, err)

	j := &job{pool: pool, table: table, name: tableName("job"), n: n, batch: batch}
	ck := pgpipe.NewCheckpoint(pool, j.name)
	store := &settledStore{Checkpoint: ck, from: batch, to: n, settled: make(chan struct{})}
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, store, func(_ context.Context, pos int64) iter.Seq2[event, error] {
		return func(yield func(event, error) bool) {
			for _, e := range events(n)[pos:] {
				if !yield(e, nil) {
					return
				}
			}
		}
	}, pipeline.WithSaveEvery(batch), pipeline.WithSaveInterval(5*time.Millisecond), pipeline.WithMaxRedo(10*n))
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), pgpipe.WithCheckpoint(ck), pgpipe.WithChunk(batch, 0))
	w.To(src, "load", writers)
	done := make(chan error, 1)
	go func() { done <- p.Run(t.Context()) }()

	select {
	case <-store.settled:
	case err := <-done:
		t.Fatalf("the run ended while the first batch's COMMIT was held: %v", err)
	case <-time.After(hangGuard):
		t.Fatalf("the other writers did not settle their batches while the first one's transaction was open; the server's backends:\n%s", activity(t))
	}
	rows, _ := count(t, pool, table)
	assert.Equal(t, int64(n-batch), rows, "the other writers' batches are committed, the first one's is not")
	// The first batch's writer may not have reached its COMMIT yet (a loaded machine):
	// the others settled without it either way; then its COMMIT waits for the lock.
	waitFor(t, "the first batch's COMMIT to wait for the lock", func() bool {
		var held int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE lower(query) = 'commit' AND wait_event_type = 'Lock' AND datname = current_database()`).Scan(&held))
		return held == 1
	})
	rows, _ = count(t, pool, table)
	assert.Equal(t, int64(n-batch), rows, "the first batch's rows are not committed while its COMMIT waits")

	_, err = holder.Exec(t.Context(), "SELECT pg_advisory_unlock($1)", lockKey)
	require.NoError(t, err)
	require.NoError(t, awaitRun(t, done))
	j.check(t)
	assert.Equal(t, int64(writers), w.Stats().Batches)
}
