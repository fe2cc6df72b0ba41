package pgpipe

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
)

// DeadLetterTable keeps dead letters in a PostgreSQL table, one row per record, with
// the item encoded by a [pipeline.Codec] (in a bytea column, so that any encoding fits,
// NUL bytes included) and, for rows the database rejected, the SQLSTATE, constraint,
// column and detail. Give it to a writer ([WithDeadLetterTable]) to dead-letter rejected
// rows in the batch's own transaction, or its Add method to [pipeline.WithDeadLetter]
// of any stage; feed it back with [Replay]. It is safe for concurrent use.
type DeadLetterTable[T any] struct {
	pool  *pgxpool.Pool
	table string
	ident pgx.Identifier
	codec pipeline.Codec[T]
	ck    *Checkpoint // WithCheckpoint: Add records the run's progress with the letter
}

var deadLetterColumns = []string{
	"stage", "item", "attempts", "class", "err_type", "first_error", "last_error",
	"sqlstate", "constraint_name", "column_name", "detail", "at",
}

// OpenDeadLetterTable returns the dead-letter table named table (optionally qualified
// by its schema), creating it if it does not exist. codec nil means
// [pipeline.JSONCodec].
func OpenDeadLetterTable[T any](ctx context.Context, pool *pgxpool.Pool, table string, codec pipeline.Codec[T]) (*DeadLetterTable[T], error) {
	if pool == nil || table == "" {
		panic(fmt.Sprintf("pgpipe: OpenDeadLetterTable(%q): need a pool and a table name", table))
	}
	if codec == nil {
		codec = pipeline.JSONCodec[T]{}
	}
	d := &DeadLetterTable[T]{pool: pool, table: table, ident: pgx.Identifier(strings.Split(table, ".")), codec: codec}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+d.ident.Sanitize()+` (
		id              bigserial PRIMARY KEY,
		stage           text NOT NULL,
		item            bytea NOT NULL,
		attempts        int NOT NULL,
		class           text NOT NULL,
		err_type        text NOT NULL,
		first_error     text NOT NULL,
		last_error      text NOT NULL,
		sqlstate        text,
		constraint_name text,
		column_name     text,
		detail          text,
		at              timestamptz NOT NULL
	)`)
	if err != nil {
		return nil, fmt.Errorf("pgpipe: create dead-letter table %s: %w", table, err)
	}
	return d, nil
}

// Add writes one dead letter. Its signature fits [pipeline.WithDeadLetter].
//
// On a table given a checkpoint ([DeadLetterTable.WithCheckpoint]), Add called by a
// stage of a checkpointed run writes the letter and the run's progress (the item's
// position, settled) in one transaction, through [pipeline.Commit]: a resumed run
// then skips the item, even after a crash right after the letter was written, so that
// no item is dead-lettered twice. Elsewhere it writes the letter alone.
func (d *DeadLetterTable[T]) Add(ctx context.Context, dl pipeline.DeadLetter[T]) error {
	recs := []pipeline.DeadLetter[T]{dl}
	if d.ck == nil || ctx.Value(inBatchKey{}) != nil {
		return d.insert(ctx, d.pool, recs, nil)
	}
	// The letter is written before Commit, so that its function does no more than
	// record the progress and commit.
	conn, err := d.ck.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if err := d.insert(ctx, tx, recs, nil); err != nil {
		return err
	}
	return pipeline.Commit(ctx, func(ctx context.Context, p pipeline.Progress) error {
		if !p.Checkpointed {
			return tx.Commit(ctx)
		}
		return d.ck.commit(ctx, tx, p, defaultConfig()) // a writer's retries of resolve
	})
}

// inBatchKey marks the context of a writer's dead-letter destination: the progress
// belongs to the batch's own transaction, not to one of its rows.
type inBatchKey struct{}

// WithCheckpoint returns a copy of d whose Add, in a run checkpointed in ck (given to
// [pipeline.FromCheckpoint]), writes each letter and the run's progress in one
// transaction, so that a dead-lettered item is never redone by a resumed run. Give the
// copy's Add to [pipeline.WithDeadLetter] of the stages that set items aside:
//
//	pipeline.WithDeadLetter(dead.WithCheckpoint(ck).Add)
//
// ck must be the store of the run's FromCheckpoint: the progress is fenced by its epoch.
// The letter and the progress are written on a connection of ck's pool, so the table
// must be in ck's database.
func (d *DeadLetterTable[T]) WithCheckpoint(ck *Checkpoint) *DeadLetterTable[T] {
	if ck == nil {
		panic("pgpipe: DeadLetterTable.WithCheckpoint(nil)")
	}
	c := *d
	c.ck = ck
	return &c
}

// copier is what a dead-letter insert needs: a pool or a transaction.
type copier interface {
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// insert writes recs; errs, when given, holds the database's rejection of each.
func (d *DeadLetterTable[T]) insert(ctx context.Context, db copier, recs []pipeline.DeadLetter[T], errs []*RowError) error {
	rows := make([][]any, len(recs))
	for i, r := range recs {
		item, err := d.codec.Marshal(r.Item)
		if err != nil {
			return pipeline.Fatal(fmt.Errorf("pgpipe: encode dead letter: %w", err))
		}
		var code, constraint, column, detail *string
		if errs != nil && errs[i] != nil {
			e := errs[i]
			code, constraint, column, detail = opt(e.Code), opt(e.Constraint), opt(e.Column), opt(clean(e.Detail))
		}
		rows[i] = []any{
			r.Stage, item, r.Attempts, r.Class.String(), r.ErrType, clean(r.FirstError), clean(r.LastError),
			code, constraint, column, detail, r.Time,
		}
	}
	_, err := db.CopyFrom(ctx, d.ident, deadLetterColumns, pgx.CopyFromRows(rows))
	if err != nil {
		err = fmt.Errorf("pgpipe: write dead letters to %s: %w", d.table, err)
		if rowError(err) != nil { // the table refused a record: not a row of the batch, and no retry helps
			return pipeline.Fatal(err)
		}
		return err
	}
	return nil
}

// clean replaces NUL bytes, which a text column cannot hold.
func clean(s string) string { return strings.ReplaceAll(s, "\x00", `\x00`) }

func opt(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Read returns the dead letters of stage (all of them when stage is ""), in the order
// they were written.
func (d *DeadLetterTable[T]) Read(ctx context.Context, stage string) ([]pipeline.DeadLetter[T], error) {
	rows, err := d.pool.Query(ctx, `SELECT stage, item, attempts, class, err_type, first_error, last_error, at
		FROM `+d.ident.Sanitize()+` WHERE $1 = '' OR stage = $1 ORDER BY id`, stage)
	if err != nil {
		return nil, fmt.Errorf("pgpipe: read dead letters from %s: %w", d.table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pipeline.DeadLetter[T], error) {
		var (
			dl    pipeline.DeadLetter[T]
			item  []byte
			class string
		)
		if err := r.Scan(&dl.Stage, &item, &dl.Attempts, &class, &dl.ErrType, &dl.FirstError, &dl.LastError, &dl.Time); err != nil {
			return dl, err
		}
		if err := dl.Class.UnmarshalText([]byte(class)); err != nil {
			return dl, err
		}
		return dl, d.codec.Unmarshal(item, &dl.Item)
	})
	if err != nil {
		return nil, fmt.Errorf("pgpipe: read dead letters from %s: %w", d.table, err)
	}
	return out, nil
}

// Replay returns a source of the items dead-lettered by stage into d (all of them when
// stage is ""), in the order they were written, so that they can be fed through the
// writer again after a fix. The table is read when the run starts; a read error fails
// the run. Replay does not delete what it read: delete the replayed rows yourself once
// the run succeeded.
func Replay[T any](p *pipeline.Pipeline, d *DeadLetterTable[T], stage string) *pipeline.Stream[T] {
	if d == nil {
		panic("pgpipe: Replay: nil DeadLetterTable")
	}
	return pipeline.Generate(p, func(ctx context.Context, emit func(T) error) error {
		dls, err := d.Read(ctx, stage)
		if err != nil {
			return err
		}
		for _, dl := range dls {
			if err := emit(dl.Item); err != nil {
				return err
			}
		}
		return nil
	})
}
