package kafkapg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// errFenced is the error of a transaction rolled back because another owner claimed
// one of its partitions; the sink writes the batch again without that partition's
// records.
var errFenced = errors.New("kafkapg: a partition has another owner")

// NewSink returns a sink stage that writes batches of messages with w, each batch in one
// transaction that also stores, per partition, the offset the batch's records take the
// group to, in the [Offsets] of src ([kafka.WithOffsetStore]): the rows and the
// offsets commit together or not at all, and a member that restarts or is assigned a
// partition starts from the offset of the last committed transaction. So each record's
// row is written once: after a crash, a rebalance, a member paused past its session.
//
// The sink's items are [kafka.Message] values whose Topic, Partition and Offset name
// the input record (copy them from the source's message) and whose Value is the row
// (one row per record, or none: a record filtered out upstream settles, and its offset
// is stored later). Give the sink each partition's records in offset order (a stage
// keyed by [kafka.Message.TopicPartition], no hand-back): a transaction stores a
// partition's offset past its records only when every earlier record settled or is
// in the batch; a row past an earlier record neither settled nor written is not
// written ([kafka.Stats].OutOfOrder): its record's own message is emitted again once it
// settles, and written, in order, by a later transaction. Rows whose records are not this member's any more (their
// partition was revoked or claimed by another owner), and a message from before a
// partition was claimed again when its replay was written first (or the other way
// round), are not written; a row written is its record's one outcome (the other
// message settles as done, even handed back or set aside: see
// [kafka.NewTransactSink]).
//
// A transaction that finds a partition claimed by another owner (its epoch moved)
// rolls back, the source ends that partition's assignment, and the batch is written
// again without its records, in the same attempt. A COMMIT whose outcome is unknown
// (the connection lost) is settled by reading the offsets' rows back, once the
// transaction has ended on the server; if that fails for a minute, the run fails with
// an error that matches [pgpipe.ErrCommitUnknown]. Other failures are classified as
// the writer's (see [pgpipe.Writer.Write]); the stage retries transient ones 30 times,
// with backoff from 20 ms to 2 s (opts, given after that, may replace it). The stage
// has one worker: transactions store offsets one after the other.
//
// Batch size and speed: a batch should fill while the one before it commits, so the
// source must let more records into the pipeline than one batch holds: give it
// [kafka.WithMaxPending] of two or three batches (its default, 1,000, is one batch of
// 1,000: a source at its limit makes the batch stage flush what it has, and the
// transactions then carry half batches). The stage's input queue holds one batch by
// default (pipeline.WithBuffer(1), replaceable in opts): batches that queue up in front
// of the one worker were flushed early for nothing. w must not have
// [pgpipe.WithCheckpoint] (the run fails at its first batch); its upsert modes and
// dead-letter table work as in [pgpipe.Writer.Sink]. It panics if src or w is nil, or
// if src's offset store is not an [*Offsets].
func NewSink[In, R any](name string, src *kafka.Source[In], w *pgpipe.Writer[R], opts ...pipeline.StageOption) *pipeline.Stage[[]kafka.Message[R], struct{}] {
	if src == nil || w == nil {
		panic(fmt.Sprintf("kafkapg: NewSink(%q) needs a source and a writer", name))
	}
	store, ok := src.OffsetStore().(*Offsets)
	if !ok {
		panic(fmt.Sprintf("kafkapg: NewSink(%q): the source's offset store is %T, not a *kafkapg.Offsets: give it kafka.WithOffsetStore(kafkapg.NewOffsets(pool, group))", name, src.OffsetStore()))
	}
	all := append([]pipeline.StageOption{
		pipeline.WithRetry(30, pipeline.ExponentialBackoff(20*time.Millisecond, 2*time.Second)),
		pipeline.WithBuffer(1),
	}, opts...)
	return pipeline.NewSink(name, 1, func(ctx context.Context, batch []kafka.Message[R]) error {
		from := make([]kafka.Origin, len(batch))
		for i, m := range batch {
			from[i] = m.Origin()
		}
		for {
			txn, err := src.BeginStoreTxn(from)
			if err != nil {
				return pipeline.Fatal(fmt.Errorf("kafkapg: NewSink(%q): %w", name, err))
			}
			fenced, err := write(ctx, store, name, w, batch, txn)
			if len(fenced) > 0 {
				txn.End(false, fenced)
				continue // again, without their records
			}
			txn.End(err == nil, nil)
			return err
		}
	}, all...)
}

// write writes the rows txn keeps of batch with w and stores txn's offsets in o, in
// one transaction. It returns the partitions found fenced (nothing committed), or the
// write's error.
func write[R any](ctx context.Context, o *Offsets, stage string, w *pgpipe.Writer[R], batch []kafka.Message[R], txn *kafka.StoreTxn) ([]kafka.TopicPartition, error) {
	if len(txn.Offsets) == 0 {
		return nil, nil // no record of a partition of ours
	}
	rows := make([]R, 0, len(batch))
	for i, m := range batch {
		if txn.Keep[i] {
			rows = append(rows, m.Value)
		}
	}
	id := newCommitID()
	var fenced []kafka.TopicPartition
	err := w.Write(ctx, stage, rows, pgpipe.BatchTx{
		BeforeCommit: func(ctx context.Context, tx pgx.Tx) error {
			f, err := o.commit(ctx, tx, txn.Offsets, id)
			if err == nil && len(f) > 0 {
				fenced = f
				return pipeline.Transient(errFenced)
			}
			return err
		},
		Resolve: func(ctx context.Context, cause error) error {
			committed, f, err := o.resolve(ctx, txn.Offsets, id)
			switch {
			case err != nil:
				return pipeline.Fatal(fmt.Errorf("%w; reading the offsets back failed: %w (after %w)", pgpipe.ErrCommitUnknown, err, cause))
			case committed:
				return nil
			case len(f) > 0:
				fenced = f
				return pipeline.Transient(errFenced)
			}
			return pipeline.Transient(fmt.Errorf("kafkapg: COMMIT failed, the batch was not committed: %w", cause))
		},
	})
	if len(fenced) > 0 {
		return fenced, nil
	}
	return nil, err
}
