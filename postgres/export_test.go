package pgpipe

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/gopipeline/pipeline"
)

// CommitTx is commit, for the tests that commit a transaction of their own: it
// records p in tx and commits it.
func (c *Checkpoint) CommitTx(ctx context.Context, tx pgx.Tx, p pipeline.Progress) error {
	return c.commit(ctx, tx, p, defaultConfig())
}
