package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// The table the PostgreSQL mode writes, and the job's name in pgpipe's checkpoint table.
const (
	pgTable = "etl_enriched"
	pgJob   = "examples-etl"
)

// pgLoad is the PostgreSQL mode: the batches are upserted by id into pgTable by a
// pgpipe writer, and the checkpoint lives in the same database, committed with each
// batch's rows, so a crash neither loses nor repeats a row.
type pgLoad struct {
	pool  *pgxpool.Pool
	store *pgpipe.Checkpoint
	w     *pgpipe.Writer[enriched]
}

func openPG(ctx context.Context, url string, fresh bool, batch int, dead func(context.Context, pipeline.DeadLetter[enriched]) error) (*pgLoad, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, &exitError{2, fmt.Errorf("-db: %w", err)}
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	stmts := []string{`CREATE TABLE IF NOT EXISTS ` + pgTable + ` (
		id bigint PRIMARY KEY, name text NOT NULL, amount double precision NOT NULL,
		score int NOT NULL, segment text NOT NULL)`}
	if fresh {
		stmts = append(stmts, `TRUNCATE `+pgTable,
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
	m := pgpipe.Func([]string{"id", "name", "amount", "score", "segment"}, func(e enriched) []any {
		return []any{int64(e.ID), e.Name, e.Amount, int32(e.Score), e.Segment}
	})
	w := pgpipe.NewWriter(pool, pgTable, m, pgpipe.WithUpsert("id"), pgpipe.WithCheckpoint(store),
		pgpipe.WithDeadLetter(dead), pgpipe.WithChunk(batch, 0))
	return &pgLoad{pool: pool, store: store, w: w}, nil
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
