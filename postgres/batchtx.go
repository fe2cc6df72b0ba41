package pgpipe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gopipeline/pipeline"
)

// BatchTx extends the transaction in which [Writer.Write] writes one batch, for a sink
// that records something of its own with the rows: a source's consumed offsets (the
// kafka module's kafkapg package), a position of another kind. Both functions may be
// nil.
type BatchTx struct {
	// BeforeCommit runs in the batch's transaction once its rows are written (and its
	// rejected rows dead-lettered into a [DeadLetterTable]), as its last statements
	// before COMMIT (when rows were rejected and go to a [WithDeadLetter] function, the
	// writer then checks the deferred constraints and sends them). An error rolls the
	// transaction back and is Write's error, classified like the writer's own (an error
	// that has a class keeps it).
	BeforeCommit func(ctx context.Context, tx pgx.Tx) error
	// Resolve learns the outcome of a COMMIT whose outcome is unknown: the connection
	// was lost while it ran, or the session ended with it (a FATAL). The connection is
	// closed when Resolve is called, cause is the COMMIT's error. It returns nil if the
	// transaction committed, else an error (a [pipeline.Transient] one: the batch is
	// written again). Without Resolve, such a COMMIT fails with a transient error that
	// matches [ErrCommitUnknown].
	Resolve func(ctx context.Context, cause error) error
}

// Write writes rows in one transaction on a connection of the pool, with the writer's
// mode (insert, upsert, skip) and dead-letter destination, as a worker of
// [Writer.Sink] writes a batch, and runs tx's functions in it: it is the building block
// of a sink stage that records its own progress with the rows. stage names the stage
// in the rows' dead letters. Write makes one attempt (the stage retries, if it was
// given [pipeline.WithRetry]) and returns its error classified for the pipeline
// (transient, permanent for a rejected row without a dead-letter destination, fatal).
// With no rows it still runs the transaction, for tx.BeforeCommit alone. A writer with
// [WithCheckpoint] records its progress itself: Write fails on it, with a fatal error.
func (w *Writer[T]) Write(ctx context.Context, stage string, rows []T, tx BatchTx) error {
	if w.cfg.ck != nil {
		return pipeline.Fatal(fmt.Errorf("pgpipe: Writer.Write on the writer of %s, which has WithCheckpoint", w.table))
	}
	return w.writeWith(ctx, stage, rows, &tx)
}

// commitWith commits tx, whose hook's BeforeCommit ran (writeOn); a COMMIT whose
// outcome is unknown is resolved by hook's Resolve, if any.
func (w *Writer[T]) commitWith(ctx context.Context, tx pgx.Tx, hook *BatchTx) error {
	pc := tx.Conn().PgConn()
	w.stats.roundTrips.Add(1)
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	pe, isPg := errors.AsType[*pgconn.PgError](err)
	if isPg && !endsSession(pe) || errors.Is(err, pgx.ErrTxCommitRollback) || !isPg && !isConnError(err) {
		return &commitRefused{err} // not committed
	}
	if hook.Resolve == nil {
		return pipeline.Transient(fmt.Errorf("%w: %w", ErrCommitUnknown, err))
	}
	closeConn(ctx, pc)
	return hook.Resolve(ctx, err)
}

// closeConn closes pc, if it is not closed yet, so that the server ends its
// transaction.
func closeConn(ctx context.Context, pc *pgconn.PgConn) {
	if pc.IsClosed() {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = pc.Close(cctx)
}
