package pgpipe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
)

// The checkpoint tables. Each is created by Load when missing.
const (
	checkpointTable = "pgpipe_checkpoint"   // one row per job: position, epoch
	committedTable  = "pgpipe_committed"    // per job, the ranges committed above its position
	marksTable      = "pgpipe_commit_marks" // per job, commits' marks: the watermark each recorded
)

// lockKeys are the keys of a job's advisory lock, which fences its commits against a
// Load (see stamp): a constant that names pgpipe (the bytes "pgpp") and a hash of the
// job. Advisory locks with two keys are a key space of their own, apart from those
// taken with one bigint key.
const lockKeys = `1885827184, hashtext($1)`

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
	// The marks have a table of their own, which no earlier release reads or deletes
	// from: an instance of one still running in a rolling deploy (fenced, but saving
	// once more) deletes range rows of pgpipe_committed below the position, and would
	// delete marks kept there.
	createMarksSQL = `CREATE TABLE IF NOT EXISTS ` + marksTable + ` (
	job  text   NOT NULL,
	mark bigint NOT NULL,
	pos  bigint NOT NULL,
	PRIMARY KEY (job, mark)
)`
)

// Checkpoint is a [pipeline.CommittedStore] kept in PostgreSQL, for one job: the
// job's watermark, the ranges of positions committed above it and the marks of recent
// commits, in the tables pgpipe_checkpoint, pgpipe_committed and pgpipe_commit_marks,
// found on the connection's search path. It needs PostgreSQL 13 or later (the xid8
// functions). Load creates a table that is missing (in the first schema of the search
// path, which needs the CREATE privilege there); once they are in place, the role needs
// only SELECT, INSERT and UPDATE on pgpipe_checkpoint, SELECT, INSERT, UPDATE and
// DELETE on pgpipe_committed, and SELECT, INSERT and DELETE on pgpipe_commit_marks.
//
// Give it to [pipeline.FromCheckpoint] and to the writer ([WithCheckpoint]): each batch's
// transaction then records the progress with the rows. Concurrent writers' transactions
// do not wait for one another: each inserts rows of its own (its ranges, and a mark
// with the watermark it records) and updates or locks no shared row. Load takes the
// job over: it bumps the job's epoch, and every later commit or save of an instance
// holding an older epoch fails with [ErrFenced], so a job started twice never commits
// twice.
// Commits take a transaction-scoped advisory lock of the job in shared mode, which
// Load takes exclusively (two int4 keys: 1885827184 and hashtext of the job); an
// application that uses the same keys would wait with them. Save retries transient
// failures itself. A Checkpoint is safe for concurrent use.
type Checkpoint struct {
	pool  *pgxpool.Pool
	job   string
	epoch atomic.Int64 // the epoch taken by the last Load; 0 before

	mu   sync.Mutex
	done []int64 // the marks of commits known to have committed, for the next save to fold and delete
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
//
// It takes the job's advisory lock exclusively first, so it waits for every commit in
// flight (each holds the lock in shared mode until its transaction ends), and a commit
// that starts meanwhile waits behind it, then finds the new epoch and is fenced. What
// it reads is therefore final: no commit of an older instance can land after it. The
// position it returns is the largest of the stored one and the watermarks the commits'
// marks recorded; it then folds them into the job's row and deletes the marks (those
// of an earlier instance's commits included: their outcome no longer matters to it,
// since it is fenced).
func (c *Checkpoint) LoadCommitted(ctx context.Context) (int64, []pipeline.PositionRange, error) {
	if err := c.ensureSchema(ctx); err != nil {
		return 0, nil, err
	}
	var (
		pos, epoch int64
		ranges     []pipeline.PositionRange
	)
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+lockKeys+`)`, c.job); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `INSERT INTO `+checkpointTable+` AS c (job, pos, epoch, seq) VALUES ($1, 0, 1, 0)
			ON CONFLICT (job) DO UPDATE SET epoch = c.epoch + 1, updated_at = now(),
				pos = GREATEST(c.pos, (SELECT max(m.pos) FROM `+marksTable+` m WHERE m.job = $1))
			RETURNING pos, epoch`, c.job).Scan(&pos, &epoch)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+marksTable+` WHERE job = $1`, c.job); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+committedTable+` WHERE job = $1 AND hi <= $2`, c.job, pos); err != nil {
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
	c.mu.Lock()
	c.done = nil // deleted with the other marks
	c.mu.Unlock()
	return pos, ranges, nil
}

// ensureSchema creates the checkpoint tables that are missing (found on the search
// path); with all of them in place it needs no right on the schema, and alters none.
// When a table is missing and the role may not create it, the error names the role,
// the schema and the right.
func (c *Checkpoint) ensureSchema(ctx context.Context) error {
	var (
		role, schema                   string
		haveCk, haveCommitd, haveMarks bool
	)
	err := c.pool.QueryRow(ctx, `SELECT current_user, coalesce(current_schema(), ''),
		to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL`,
		checkpointTable, committedTable, marksTable).Scan(&role, &schema, &haveCk, &haveCommitd, &haveMarks)
	if err != nil {
		return fmt.Errorf("pgpipe: look for the checkpoint tables: %w", err)
	}
	for _, t := range []struct {
		have      bool
		name, sql string
	}{{haveCk, checkpointTable, createCheckpointSQL}, {haveCommitd, committedTable, createCommittedSQL}, {haveMarks, marksTable, createMarksSQL}} {
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
// retries transient failures for about a minute. It also folds the watermarks of the
// commits known to have committed since the last save into the job's position, and
// deletes their marks (see stamp).
func (c *Checkpoint) SaveCommitted(ctx context.Context, pos int64, committed []pipeline.PositionRange) error {
	epoch, err := c.loaded()
	if err != nil {
		return err
	}
	c.mu.Lock()
	done := c.done
	c.done = nil
	c.mu.Unlock()
	backoff := pipeline.ExponentialBackoff(20*time.Millisecond, 2*time.Second)
	for attempt := 1; ; attempt++ {
		err := c.save(ctx, epoch, pos, committed, done)
		if err == nil || errors.Is(err, ErrFenced) || !isConnError(err) || attempt >= 30 || ctx.Err() != nil {
			if err != nil { // the marks stay for the next save (or the next Load)
				c.mu.Lock()
				c.done = append(c.done, done...)
				c.mu.Unlock()
			}
			return err
		}
		if err := wait(ctx, backoff(attempt)); err != nil {
			c.mu.Lock()
			c.done = append(c.done, done...)
			c.mu.Unlock()
			return err
		}
	}
}

// save is one SaveCommitted, in one implicit transaction. The marks deleted are those
// of commits whose outcome is known, committed (done): a mark must outlive any doubt
// about its commit, which resolve settles by looking for it. The range rows below the
// position go too, each batch's transaction leaves them for a save to delete (a delete
// in every transaction would make concurrent ones wait for one another's row locks).
func (c *Checkpoint) save(ctx context.Context, epoch, pos int64, committed []pipeline.PositionRange, done []int64) error {
	b := &pgx.Batch{}
	b.Queue(`UPDATE `+checkpointTable+` SET updated_at = now(),
			pos = GREATEST(pos, $3, (SELECT max(m.pos) FROM `+marksTable+` m WHERE m.job = $1 AND m.mark = ANY($4::bigint[])))
		WHERE job = $1 AND epoch = $2`, c.job, epoch, pos, done)
	b.Queue(`DELETE FROM `+marksTable+` WHERE job = $1 AND mark = ANY($3::bigint[])
		AND EXISTS (SELECT FROM `+checkpointTable+` WHERE job = $1 AND epoch = $2)`, c.job, epoch, done)
	b.Queue(`DELETE FROM `+committedTable+` WHERE job = $1 AND hi <= (SELECT pos FROM `+checkpointTable+` WHERE job = $1)
		AND EXISTS (SELECT FROM `+checkpointTable+` WHERE job = $1 AND epoch = $2)`, c.job, epoch)
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

// stamp records progress p in tx, fenced by the epoch, and returns the transaction's
// id and its mark, for resolve.
//
// The transaction updates no row that another writer's transaction touches, so that
// concurrent writers never wait for one another (the run's tracker no longer orders
// them either: pipeline.Commit holds no lock across its function):
//   - It takes the job's advisory lock in shared mode, held until it ends, and then, in
//     a statement of its own (which sees what committed before the lock was granted),
//     reads the epoch: a plain read, which locks nothing. Load takes the lock
//     exclusively before it bumps the epoch: it waits for every commit in flight, and a
//     commit that asks after it waits behind it and finds the new epoch. That is the
//     whole fence; a row lock would add nothing to it (taken while Load's update is in
//     flight, it locks the row's old version, which Load's later lock does not wait
//     for), and a FOR KEY SHARE by every commit made multixacts of the job's hot row.
//   - It inserts its mark, a row of pgpipe_commit_marks of its own (a random id), with
//     the watermark p records. The watermark counts only positions that settled before
//     Commit was called (whose transactions committed) and the item's own, so it is
//     true if this transaction commits, whichever of the others in flight commit or
//     roll back; and it lives in this transaction's row, so a rollback takes it away.
//     Load and the saves fold the marks' watermarks into the job's position (GREATEST).
//   - It inserts the ranges of p, which are the item's own positions: no other
//     transaction in flight inserts the same key.
//
// The transaction id (pg_current_xact_id) tells resolve when the transaction has
// ended; the mark tells whether it committed.
func (c *Checkpoint) stamp(ctx context.Context, tx pgx.Tx, p pipeline.Progress) (xid string, mark int64, err error) {
	epoch, err := c.loaded()
	if err != nil {
		return "", 0, err
	}
	mark = rand.Int64() // a random id: two marks of a job kept at once never clash in practice
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock_shared(`+lockKeys+`)`, c.job)
	b.Queue(`SELECT pg_current_xact_id()::text FROM `+checkpointTable+` WHERE job = $1 AND epoch = $2`, c.job, epoch)
	b.Queue(`INSERT INTO `+marksTable+` (job, mark, pos) VALUES ($1, $2, $3)`, c.job, mark, p.Watermark)
	queueRanges(b, c.job, epoch, p.Committed)
	br := tx.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&xid)
		if errors.Is(err, pgx.ErrNoRows) {
			err = c.fenced(epoch)
		}
	}
	for i := 2; err == nil && i < b.Len(); i++ {
		_, err = br.Exec()
	}
	return xid, mark, errors.Join(err, br.Close())
}

// commit records progress p in tx (see stamp) and commits tx: a COMMIT whose outcome is
// unknown (its connection was lost, or its attempt timed out) is resolved (resolve).
func (c *Checkpoint) commit(ctx context.Context, tx pgx.Tx, p pipeline.Progress, cfg config) error {
	xid, mark, err := c.stamp(ctx, tx, p)
	if err != nil {
		return err
	}
	pc := tx.Conn().PgConn()
	pid := pc.PID()
	err = tx.Commit(ctx)
	if err == nil {
		c.committed(mark)
		return nil
	}
	pe, isPg := errors.AsType[*pgconn.PgError](err)
	switch {
	case isPg && !endsSession(pe), errors.Is(err, pgx.ErrTxCommitRollback), !isPg && !isConnError(err):
		return &commitRefused{err} // not committed
	}
	// The outcome is unknown: the connection was lost, or the session ended while the
	// COMMIT ran (a FATAL: the backend was terminated, or the server shut down), which
	// may be after its commit record was written. pgx closed the connection (a COMMIT
	// that failed otherwise leaves no transaction open); make sure, so that the server
	// ends the transaction, which resolve waits for.
	if !pc.IsClosed() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = pc.Close(cctx)
		cancel()
	}
	if err := c.resolve(ctx, xid, mark, pid, err, cfg); err != nil {
		return err
	}
	c.committed(mark)
	return nil
}

// committed records that the commit of mark committed: the next save may fold its
// watermark and delete it.
func (c *Checkpoint) committed(mark int64) {
	c.mu.Lock()
	c.done = append(c.done, mark)
	c.mu.Unlock()
}

// resolve learns the outcome of a COMMIT whose connection was lost (cause), on a new
// connection (see readBack): once transaction xid has ended, it committed if and only
// if its mark is there. It returns nil when the commit happened, a transient error when
// it did not (the batch is written again), [ErrFenced] when it did not and another
// instance took over, and a fatal error when the server stays unreachable, or when the
// transaction of backend pid (the lost connection's) has not ended within a minute: its
// outcome is still open, and only the next run's Load will know it.
//
// The mark decides, not the transaction's status: a server that crashed before its WAL
// reached the disk forgets the ids it had handed out and hands them out again, so
// after a restart xid may be another transaction's. Its mark is this transaction's
// alone (no save deletes it before commit hands it over, see committed). Whether the
// transaction has ended matters because a COMMIT waiting for a synchronous standby
// holds its locks and is not yet visible, though it will commit, and a backend may not
// yet have seen its client go. A reused id must not make it wait: the transaction that
// holds it may be waiting for this one (a piece of the same position, whose Commit
// waits for this commit's function to return, see [pipeline.Commit]), so an id held by
// another backend than pid tells that this transaction has ended.
//
// The caller's connection must be closed: the server then ends the transaction (it
// rolls it back, unless its COMMIT got there first).
//
// It reads on even when ctx is done (a canceled run, an attempt's timeout), for up to
// a minute: an answer settles the batch, while giving up would leave it unknown.
func (c *Checkpoint) resolve(ctx context.Context, xid string, mark int64, pid uint32, cause error, cfg config) error {
	epoch, err := c.loaded()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	unknown := func(err error) error {
		return pipeline.Fatal(fmt.Errorf("%w: %w (the transaction of backend %d may still be running); reading its outcome failed: %w", ErrCommitUnknown, cause, pid, err))
	}
	failures, waits := 0, 0
	for {
		ended, found, gotEpoch, err := c.readBack(ctx, xid, mark, pid)
		switch {
		case err == nil && !ended:
			waits++
			if werr := wait(ctx, cfg.backoff(waits)); werr != nil {
				return unknown(fmt.Errorf("the transaction has not ended: %w", werr))
			}
			continue
		case err == nil && found:
			return nil // committed
		case err == nil && gotEpoch != epoch:
			return c.fenced(epoch)
		case err == nil:
			return pipeline.Transient(fmt.Errorf("pgpipe: COMMIT failed, the batch was not committed: %w", cause))
		}
		failures++
		if !isConnError(err) || failures >= cfg.attempts || ctx.Err() != nil {
			return unknown(err)
		}
		if werr := wait(ctx, cfg.backoff(failures)); werr != nil {
			return unknown(err)
		}
	}
}

// readBack asks the server, on a connection of its own outside the pool (the pool's
// connections may all be held by writers), whether transaction xid (of backend pid) has
// ended and, if it has, whether its mark is there, and the job's epoch.
//
// "Ended" and "the mark is there" are read in one statement, from one snapshot: xid has
// ended for it when it is visible in that snapshot (pg_visible_in_snapshot: not running
// when the snapshot was taken), and then the same snapshot sees its mark if and only if
// it committed. Reading the status (pg_xact_status) and then the mark in a later
// statement relied on the status turning "committed" no sooner than the commit is
// visible to new snapshots, which older minor releases got wrong. An id in the future
// is never visible; pg_xact_status then tells it apart (it fails for one): its
// transaction never committed (a crash lost it before it reached the disk, where a
// commit would have taken it), so it has ended, and the mark decides.
//
// An id that a backend other than pid runs (read in an earlier statement, so before
// that snapshot) was handed out again after a crash: this transaction ended in the
// crash, and the mark decides too.
func (c *Checkpoint) readBack(ctx context.Context, xid string, mark int64, pid uint32) (ended, found bool, epoch int64, err error) {
	conn, err := pgx.ConnectConfig(ctx, c.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, false, 0, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var reused bool
	err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE backend_xid = xid($1::xid8)
		AND pid <> $2 AND coalesce(leader_pid, 0) <> $2)`, xid, int64(pid)).Scan(&reused)
	if err != nil {
		return false, false, 0, err
	}
	err = conn.QueryRow(ctx, `SELECT $4 OR pg_visible_in_snapshot($1::xid8, pg_current_snapshot()),
		EXISTS (SELECT FROM `+marksTable+` WHERE job = $2 AND mark = $3),
		coalesce((SELECT epoch FROM `+checkpointTable+` WHERE job = $2), 0)`, xid, c.job, mark, reused).Scan(&ended, &found, &epoch)
	if err != nil || ended {
		return ended, found, epoch, err
	}
	var status *string
	err = conn.QueryRow(ctx, `SELECT pg_xact_status($1::xid8)`, xid).Scan(&status)
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe.Code == pgerrcode.InvalidParameterValue {
		return true, found, epoch, nil // "transaction ID … is in the future"
	}
	return false, false, 0, err // still running
}

// endsSession reports whether a server error ended the session (severity FATAL or
// PANIC) rather than the statement. An ERROR from COMMIT means the transaction rolled
// back; a FATAL does not say: a backend terminated while its COMMIT waits for a
// synchronous standby that has just been released (or after the commit record is
// written, for any reason) reports the FATAL of its exit for a transaction that
// committed.
func endsSession(pe *pgconn.PgError) bool {
	return pe.Severity == "FATAL" || pe.Severity == "PANIC"
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
