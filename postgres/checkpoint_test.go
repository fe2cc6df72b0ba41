package pgpipe_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
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
	_, err = pgpipe.NewCheckpoint(rolePool(t, role, schema), "job").Load(t.Context())
	require.NoError(t, err)
}

// TestCheckpointAddsPosToEarlierTable loads a checkpoint whose pgpipe_committed is of
// an earlier release (no column pos): Load adds the column when the role owns the
// table, and otherwise fails naming the statement to run.
func TestCheckpointAddsPosToEarlierTable(t *testing.T) {
	admin := newPool(t, 2)
	for _, owner := range []bool{true, false} {
		t.Run(fmt.Sprintf("owner=%v", owner), func(t *testing.T) {
			schema := tableName("pgpipe_schema")
			mustExec(t, admin, "CREATE SCHEMA "+schema)
			t.Cleanup(func() { mustExec(t, admin, "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
			mustExec(t, admin, `CREATE TABLE `+schema+`.pgpipe_checkpoint (job text PRIMARY KEY, pos bigint NOT NULL,
				epoch bigint NOT NULL, seq bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`)
			mustExec(t, admin, `CREATE TABLE `+schema+`.pgpipe_committed (job text NOT NULL, lo bigint NOT NULL,
				hi bigint NOT NULL, PRIMARY KEY (job, lo))`)
			mustExec(t, admin, `INSERT INTO `+schema+`.pgpipe_checkpoint VALUES ('job', 7, 1, 3, now())`)
			role := ""
			if !owner {
				role = restrictedRole(t, admin)
				mustExec(t, admin, "GRANT USAGE ON SCHEMA "+schema+" TO "+role)
				mustExec(t, admin, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %s.pgpipe_checkpoint TO %s", schema, role))
				mustExec(t, admin, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s.pgpipe_committed TO %s", schema, role))
			}
			pos, err := pgpipe.NewCheckpoint(rolePool(t, role, schema), "job").Load(t.Context())
			if !owner {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "ALTER TABLE pgpipe_committed ADD COLUMN IF NOT EXISTS pos bigint")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, int64(7), pos)
		})
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
	var held int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE lower(query) = 'commit' AND wait_event_type = 'Lock' AND datname = current_database()`).Scan(&held))
	assert.Equal(t, 1, held, "the first batch's COMMIT still waits")

	_, err = holder.Exec(t.Context(), "SELECT pg_advisory_unlock($1)", lockKey)
	require.NoError(t, err)
	require.NoError(t, awaitRun(t, done))
	j.check(t)
	assert.Equal(t, int64(writers), w.Stats().Batches)
}
