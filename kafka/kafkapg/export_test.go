package kafkapg

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/gopipeline/pipeline/kafka"
)

// CommitOffsets stores offsets in tx as a batch's transaction does, marked with id.
func CommitOffsets(ctx context.Context, o *Offsets, tx pgx.Tx, offsets []kafka.StoreOffset, id int64) ([]kafka.TopicPartition, error) {
	return o.commit(ctx, tx, offsets, id)
}

// Resolve learns the outcome of the transaction that stored offsets with id.
func Resolve(ctx context.Context, o *Offsets, offsets []kafka.StoreOffset, id int64) (committed bool, fenced []kafka.TopicPartition, err error) {
	return o.resolve(ctx, offsets, id)
}
