package pgpipe

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
)

// The checkpoint tables. Both are created by Load when missing.
const (
	checkpointTable = "pgpipe_checkpoint" // one row per job: position, epoch, commit count
	committedTable  = "pgpipe_committed"  // per job, ranges of positions committed above it
)

// The statements that create the checkpoint tables; Load runs each only when its table
// is missing, so that a role with no right to create tables can use tables made for it.
const (
	createCheckpointSQL = `CREATE TABLE IF NOT EXISTS ` + checkpointTable + ` (
	job        text PRIMARY KEY,
	pos        bigint NOT NULL,
	epoch      bigint NOT NULL,
	seq        bigint NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
)`
	createCommittedSQL = `CREATE TABLE IF NOT EXISTS ` + committedTable + ` (
	job text   NOT NULL,
	lo  bigint NOT NULL,
	hi  bigint NOT NULL,
	PRIMARY KEY (job, lo)
)`
)

// Checkpoint is a [pipeline.CommittedStore] kept in PostgreSQL, for one job: the
// job's watermark and the ranges of positions committed above it, in the tables
// pgpipe_checkpoint and pgpipe_committed, found on the connection's search path.
// Load creates a table that is missing (in the first schema of the search path, which
// needs the CREATE privilege there); once both exist, the role needs only SELECT,
// INSERT and UPDATE on pgpipe_checkpoint (UPDATE also lets the read-back of a COMMIT of
// unknown outcome lock the job's row FOR SHARE) and SELECT, INSERT, UPDATE and DELETE
// on pgpipe_committed.
//
// Give it to [pipeline.FromCheckpoint] and to the writer ([WithCheckpoint]): each batch's
// transaction then records the progress with the rows. Load takes the job over: it
// bumps the job's epoch, and every later commit or save of an instance holding an
// older epoch fails with [ErrFenced], so a job started twice never commits twice.
// Save retries transient failures itself. A Checkpoint is safe for concurrent use.
type Checkpoint struct {
	pool  *pgxpool.Pool
	job   string
	epoch atomic.Int64 // the epoch taken by the last Load; 0 before
}

// NewCheckpoint returns the checkpoint of job in the database of pool. It panics if
// pool is nil or job is empty.
func NewCheckpoint(pool *pgxpool.Pool, job string) *Checkpoint {
	if pool == nil || job == "" {
		panic(fmt.Sprintf("pgpipe: NewCheckpoint(%q): need a pool and a job name", job))
	}
	return &Checkpoint{pool: pool, job: job}
}

// Load implements [pipeline.CheckpointStore]: it takes the job over and returns its
// position.
func (c *Checkpoint) Load(ctx context.Context) (int64, error) {
	pos, _, err := c.LoadCommitted(ctx)
	return pos, err
}

// LoadCommitted implements [pipeline.CommittedStore]: it takes the job over (a new
// epoch) and returns its position and the ranges committed above it.
func (c *Checkpoint) LoadCommitted(ctx context.Context) (int64, []pipeline.PositionRange, error) {
	if err := c.ensureSchema(ctx); err != nil {
		return 0, nil, err
	}
	var (
		pos, epoch int64
		ranges     []pipeline.PositionRange
	)
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO `+checkpointTable+` AS c (job, pos, epoch, seq) VALUES ($1, 0, 1, 0)
			ON CONFLICT (job) DO UPDATE SET epoch = c.epoch + 1, updated_at = now() RETURNING pos, epoch`, c.job).Scan(&pos, &epoch)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT lo, hi FROM `+committedTable+` WHERE job = $1 AND hi > $2 ORDER BY lo`, c.job, pos)
		if err != nil {
			return err
		}
		ranges, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (pipeline.PositionRange, error) {
			var pr pipeline.PositionRange
			return pr, r.Scan(&pr.From, &pr.To)
		})
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("pgpipe: load the checkpoint of job %q: %w", c.job, err)
	}
	c.epoch.Store(epoch)
	return pos, ranges, nil
}

// ensureSchema creates the checkpoint tables that are missing (found on the search
// path); with both there it needs no right on the schema. When a table is missing and
// the role may not create it, the error names the role, the schema and the right.
func (c *Checkpoint) ensureSchema(ctx context.Context) error {
	var (
		role, schema        string
		haveCk, haveCommitd bool
	)
	err := c.pool.QueryRow(ctx, `SELECT current_user, coalesce(current_schema(), ''), to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		checkpointTable, committedTable).Scan(&role, &schema, &haveCk, &haveCommitd)
	if err != nil {
		return fmt.Errorf("pgpipe: look for the checkpoint tables: %w", err)
	}
	for _, t := range []struct {
		have      bool
		name, sql string
	}{{haveCk, checkpointTable, createCheckpointSQL}, {haveCommitd, committedTable, createCommittedSQL}} {
		if t.have {
			continue
		}
		err := c.create(ctx, t.sql)
		if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe.Code == pgerrcode.InsufficientPrivilege {
			return fmt.Errorf("pgpipe: the checkpoint table %s does not exist, and role %q may not create it in schema %q: "+
				"it needs the CREATE privilege on the schema, or the table created beforehand by a role that has it: %w",
				t.name, role, schema, err)
		}
		if err != nil {
			return fmt.Errorf("pgpipe: create the checkpoint table %s in schema %q: %w", t.name, schema, err)
		}
	}
	return nil
}

// create runs a CREATE TABLE IF NOT EXISTS, once more if it lost a race with another
// instance creating the same table (on the catalog).
func (c *Checkpoint) create(ctx context.Context, sql string) error {
	for attempt := 0; ; attempt++ {
		_, err := c.pool.Exec(ctx, sql)
		pe, ok := errors.AsType[*pgconn.PgError](err)
		if err == nil || attempt > 0 || !ok || (pe.Code != pgerrcode.UniqueViolation && pe.Code != pgerrcode.DuplicateTable) {
			return err
		}
	}
}

// loaded returns the epoch of the last Load, or an error if there was none.
func (c *Checkpoint) loaded() (int64, error) {
	e := c.epoch.Load()
	if e == 0 {
		return 0, pipeline.Fatal(fmt.Errorf("pgpipe: the checkpoint of job %q was never loaded: give it to pipeline.FromCheckpoint", c.job))
	}
	return e, nil
}

func (c *Checkpoint) fenced(epoch int64) error {
	return pipeline.Fatal(fmt.Errorf("%w: job %q, epoch %d", ErrFenced, c.job, epoch))
}

// Save implements [pipeline.CheckpointStore]: it advances the job's position to pos
// (never back), fenced by the epoch of the last Load. It retries transient failures
// (a lost connection, a restarting server) with backoff for about a minute.
func (c *Checkpoint) Save(ctx context.Context, pos int64) error {
	return c.SaveCommitted(ctx, pos, nil)
}

// SaveCommitted implements [pipeline.CommittedStore]: it advances the job's position to
// pos (never back) and adds committed, the ranges the run knows settled above it (its
// committed, dead-lettered and filtered items), to those the job keeps, so that a
// resumed run skips them. Like Save, it is fenced by the epoch of the last Load and
// retries transient failures for about a minute.
func (c *Checkpoint) SaveCommitted(ctx context.Context, pos int64, committed []pipeline.PositionRange) error {
	epoch, err := c.loaded()
	if err != nil {
		return err
	}
	backoff := pipeline.ExponentialBackoff(20*time.Millisecond, 2*time.Second)
	for attempt := 1; ; attempt++ {
		err := c.save(ctx, epoch, pos, committed)
		if err == nil || errors.Is(err, ErrFenced) || !isConnError(err) || attempt >= 30 || ctx.Err() != nil {
			return err
		}
		if err := wait(ctx, backoff(attempt)); err != nil {
			return err
		}
	}
}

func (c *Checkpoint) save(ctx context.Context, epoch, pos int64, committed []pipeline.PositionRange) error {
	b := &pgx.Batch{}
	b.Queue(`UPDATE `+checkpointTable+` SET pos = GREATEST(pos, $3), updated_at = now() WHERE job = $1 AND epoch = $2`, c.job, epoch, pos)
	b.Queue(`DELETE FROM `+committedTable+` WHERE job = $1 AND hi <= (SELECT pos FROM `+checkpointTable+` WHERE job = $1)`, c.job)
	queueRanges(b, c.job, epoch, committed)
	br := c.pool.SendBatch(ctx, b) // one implicit transaction
	tag, err := br.Exec()
	if err == nil && tag.RowsAffected() == 0 {
		err = c.fenced(epoch)
	}
	for i := 1; err == nil && i < b.Len(); i++ {
		_, err = br.Exec()
	}
	return errors.Join(err, br.Close())
}

// queueRanges queues the insert of ranges above the job's position into b, unless
// another instance took the job over (epoch): a range whose start is kept already keeps
// the larger end.
func queueRanges(b *pgx.Batch, job string, epoch int64, ranges []pipeline.PositionRange) {
	if len(ranges) == 0 {
		return
	}
	lo, hi := make([]int64, len(ranges)), make([]int64, len(ranges))
	for i, r := range ranges {
		lo[i], hi[i] = r.From, r.To
	}
	b.Queue(`INSERT INTO `+committedTable+` (job, lo, hi) SELECT $1, l, h FROM unnest($2::bigint[], $3::bigint[]) AS r(l, h)
		WHERE EXISTS (SELECT FROM `+checkpointTable+` WHERE job = $1 AND epoch = $4 AND pos < h)
		ON CONFLICT (job, lo) DO UPDATE SET hi = GREATEST(`+committedTable+`.hi, EXCLUDED.hi)`, job, lo, hi, epoch)
}

// stamp records progress p in tx, fenced by the epoch, and returns the job's commit
// count as of tx (for resolve).
func (c *Checkpoint) stamp(ctx context.Context, tx pgx.Tx, p pipeline.Progress) (int64, error) {
	epoch, err := c.loaded()
	if err != nil {
		return 0, err
	}
	b := &pgx.Batch{}
	var seq int64
	b.Queue(`UPDATE `+checkpointTable+` SET pos = GREATEST(pos, $3), seq = seq + 1, updated_at = now()
		WHERE job = $1 AND epoch = $2 RETURNING seq`, c.job, epoch, p.Watermark)
	queueRanges(b, c.job, epoch, p.Committed)
	if p.Checkpointed {
		b.Queue(`DELETE FROM `+committedTable+` WHERE job = $1 AND hi <= (SELECT pos FROM `+checkpointTable+` WHERE job = $1)`, c.job)
	}
	br := tx.SendBatch(ctx, b)
	err = br.QueryRow().Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		err = c.fenced(epoch)
	}
	for i := 1; err == nil && i < b.Len(); i++ {
		_, err = br.Exec()
	}
	return seq, errors.Join(err, br.Close())
}

// commit records progress p in tx (see stamp) and commits tx: a COMMIT whose outcome is
// unknown (its connection was lost, or its attempt timed out) is read back (resolve).
func (c *Checkpoint) commit(ctx context.Context, tx pgx.Tx, p pipeline.Progress, cfg config) error {
	seq, err := c.stamp(ctx, tx, p)
	if err != nil {
		return err
	}
	pc := tx.Conn().PgConn()
	pid := pc.PID()
	err = tx.Commit(ctx)
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*pgconn.PgError](err); ok || errors.Is(err, pgx.ErrTxCommitRollback) || !isConnError(err) {
		return err // refused: not committed
	}
	// The outcome is unknown. pgx closed the connection (a COMMIT that failed otherwise
	// leaves no transaction open); make sure, so that the server ends the transaction,
	// which the read-back waits for.
	if !pc.IsClosed() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = pc.Close(cctx)
		cancel()
	}
	return c.resolve(ctx, seq, pid, err, cfg)
}

// resolve learns the outcome of a COMMIT whose connection was lost (cause), by reading
// the job's row back on a new connection (see readBack): the commit happened if the
// job's commit count reached seq under the same epoch. It returns nil when the commit happened, a
// transient error when it did not (the batch is written again), [ErrFenced] when
// another instance took over, and a fatal error when the server stays unreachable, or
// when the transaction of backend pid (the lost connection's) has not ended within a
// minute: its outcome is still open, and only the next run's Load will know it.
//
// The caller's connection must be closed: the server then ends the transaction (it
// rolls it back, unless its COMMIT got there first).
//
// It reads on even when ctx is done (a canceled run, an attempt's timeout), for up to
// a minute: an answer settles the batch, while giving up would leave it unknown.
func (c *Checkpoint) resolve(ctx context.Context, seq int64, pid uint32, cause error, cfg config) error {
	epoch, err := c.loaded()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for attempt := 1; ; attempt++ {
		gotEpoch, gotSeq, err := c.readBack(ctx)
		switch {
		case err == nil && gotEpoch != epoch:
			return c.fenced(epoch)
		case err == nil && gotSeq >= seq:
			return nil // committed
		case err == nil:
			return pipeline.Transient(fmt.Errorf("pgpipe: COMMIT failed, the batch was not committed: %w", cause))
		case !isConnError(err) || attempt >= cfg.attempts || ctx.Err() != nil:
			return pipeline.Fatal(fmt.Errorf("%w (the transaction of backend %d may still be running); reading the checkpoint back failed: %w", ErrCommitUnknown, pid, err))
		}
		if werr := wait(ctx, cfg.backoff(attempt)); werr != nil {
			return pipeline.Fatal(fmt.Errorf("%w (the transaction of backend %d may still be running); reading the checkpoint back failed: %w", ErrCommitUnknown, pid, err))
		}
	}
}

// readBack reads the job's epoch and commit count on a connection of its own, outside
// the pool: the pool's connections may all be held by writers waiting for the commit
// being resolved.
//
// It reads the row FOR SHARE, which waits until the transaction being resolved has
// ended: that transaction updated the row (in stamp), so it holds the row's lock until
// it commits or rolls back, and a plain read could see the row as it was while the
// transaction is still in progress. Such a transaction may be alive well after its
// client gave up: a COMMIT waiting for a synchronous standby (its commit record is
// flushed locally, but it is neither visible nor has it released its locks until the
// standby answers or the wait is canceled, and then it commits), a backend that has
// not yet noticed its connection closed. Once the lock is free the row read is the
// transaction's outcome. The read's own transaction is rolled back, so that it does not
// wait for a standby itself.
func (c *Checkpoint) readBack(ctx context.Context) (epoch, seq int64, err error) {
	conn, err := pgx.ConnectConfig(ctx, c.pool.Config().ConnConfig.Copy())
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	err = tx.QueryRow(ctx, `SELECT epoch, seq FROM `+checkpointTable+` WHERE job = $1 FOR SHARE`, c.job).Scan(&epoch, &seq)
	return epoch, seq, errors.Join(err, tx.Rollback(ctx))
}

// wait waits d, or until ctx is done.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
