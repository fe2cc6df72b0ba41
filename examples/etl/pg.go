package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// The tables the PostgreSQL mode writes, and the job's name in pgpipe's checkpoint table.
const (
	pgTable = "etl_enriched"
	pgDead  = "etl_deadletters"
	pgJob   = "examples-etl"

	pgJobTable = "etl_job" // the job's -n, for a resumed run
)

// pgLoad is the PostgreSQL mode: the batches are upserted by id into pgTable by a
// pgpipe writer, and the checkpoint and the dead letters live in the same database,
// committed with each batch's rows or with each dead letter, so that a crash neither
// loses nor repeats a row or a dead letter, and a resumed run does not redo a record
// that the run before it set aside.
type pgLoad struct {
	pool  *pgxpool.Pool
	store *pgpipe.Checkpoint
	dead  *pgpipe.DeadLetterTable[enriched] // with the checkpoint: Add commits the progress too
	w     *pgpipe.Writer[enriched]
	added atomic.Int64 // dead letters of the enrich stage this run
}

func openPG(ctx context.Context, url string, fresh bool, batch int) (*pgLoad, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, &exitError{2, fmt.Errorf("-db: %w", err)}
	}
	cfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	stmts := []string{`CREATE TABLE IF NOT EXISTS ` + pgTable + ` (
		id bigint PRIMARY KEY, name text NOT NULL, amount double precision NOT NULL,
		score int NOT NULL, segment text NOT NULL)`}
	if fresh {
		stmts = append(stmts, `TRUNCATE `+pgTable,
			`DROP TABLE IF EXISTS `+pgDead,
			`DROP TABLE IF EXISTS `+pgJobTable,
			`DELETE FROM pgpipe_checkpoint WHERE job = '`+pgJob+`'`,
			`DELETE FROM pgpipe_committed WHERE job = '`+pgJob+`'`)
	}
	for _, q := range stmts {
		if _, err := pool.Exec(ctx, q); err != nil && !missingTable(err) {
			pool.Close()
			return nil, fmt.Errorf("-db: %w", err)
		}
	}
	store := pgpipe.NewCheckpoint(pool, pgJob)
	dead, err := pgpipe.OpenDeadLetterTable[enriched](ctx, pool, pgDead, nil)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("-db: %w", err)
	}
	m := pgpipe.Func([]string{"id", "name", "amount", "score", "segment"}, func(e enriched) []any {
		return []any{int64(e.ID), e.Name, e.Amount, int32(e.Score), e.Segment}
	})
	w := pgpipe.NewWriter(pool, pgTable, m, pgpipe.WithUpsert("id"), pgpipe.WithCheckpoint(store),
		pgpipe.WithDeadLetterTable(dead), pgpipe.WithChunk(batch, 0))
	return &pgLoad{pool: pool, store: store, dead: dead.WithCheckpoint(store), w: w}, nil
}

// addDead is the enrich stage's dead-letter destination in the PostgreSQL mode: the
// letter and the run's progress in one transaction.
func (l *pgLoad) addDead(ctx context.Context, dl pipeline.DeadLetter[record]) error {
	err := l.dead.Add(ctx, pipeline.DeadLetter[enriched]{
		Stage: dl.Stage, Item: enriched{record: dl.Item}, Attempts: dl.Attempts, Class: dl.Class, ErrType: dl.ErrType,
		FirstError: dl.FirstError, LastError: dl.LastError, Time: dl.Time,
	})
	if err == nil {
		l.added.Add(1)
	}
	return err
}

// missingTable tells an error of the fresh start's DELETE before pgpipe made its tables.
func missingTable(err error) bool {
	var pe interface{ SQLState() string }
	return errors.As(err, &pe) && pe.SQLState() == "42P01"
}

// rows counts the records in the table.
func (l *pgLoad) rows(ctx context.Context) (int64, error) {
	var n int64
	err := l.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgTable).Scan(&n)
	return n, err
}

// remember returns the number of records of the job in the database: n when given
// (-n) or when the job is new, else the one the job was started with (and then where
// it came from); it saves the result in the table etl_job.
func (l *pgLoad) remember(ctx context.Context, n int, given bool) (int, string, error) {
	if _, err := l.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+pgJobTable+` (job text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		return 0, "", fmt.Errorf("-db: %w", err)
	}
	var saved int64
	from := ""
	err := l.pool.QueryRow(ctx, `SELECT n FROM `+pgJobTable+` WHERE job = $1`, pgJob).Scan(&saved)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return 0, "", fmt.Errorf("-db: %w", err)
	case !given && int(saved) != n:
		n, from = int(saved), "PostgreSQL (table "+pgJobTable+")"
	}
	_, err = l.pool.Exec(ctx, `INSERT INTO `+pgJobTable+` (job, n) VALUES ($1, $2) ON CONFLICT (job) DO UPDATE SET n = excluded.n`, pgJob, n)
	if err != nil {
		return 0, "", fmt.Errorf("-db: %w", err)
	}
	return n, from, nil
}
