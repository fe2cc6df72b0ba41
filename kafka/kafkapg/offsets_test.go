package kafkapg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline/internal/scenario"
	"github.com/gopipeline/pipeline/kafka"
	"github.com/gopipeline/pipeline/kafka/kafkapg"
)

// TestClaimFencesEarlierOwners checks the store's fencing: a claim bumps each
// partition's epoch and returns its offset, a save under the old epoch stores nothing,
// and offsets never move back.
func TestClaimFencesEarlierOwners(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t)
	store := kafkapg.NewOffsets(pool, uniqueName("claim"))
	tps := []kafka.TopicPartition{{Topic: "a", Partition: 0}, {Topic: "a", Partition: 1}}
	first, err := store.Claim(ctx, tps)
	require.NoError(t, err)
	assert.Equal(t, []kafka.Claim{{TopicPartition: tps[0], Epoch: 1, Next: -1}, {TopicPartition: tps[1], Epoch: 1, Next: -1}}, first)
	fenced, err := store.Save(ctx, []kafka.StoreOffset{{TopicPartition: tps[0], Epoch: 1, Next: 10}, {TopicPartition: tps[1], Epoch: 1, Next: 20}})
	require.NoError(t, err)
	assert.Empty(t, fenced)

	second, err := store.Claim(ctx, tps[1:])
	require.NoError(t, err)
	assert.Equal(t, []kafka.Claim{{TopicPartition: tps[1], Epoch: 2, Next: 20}}, second)
	fenced, err = store.Save(ctx, []kafka.StoreOffset{{TopicPartition: tps[0], Epoch: 1, Next: 5}, {TopicPartition: tps[1], Epoch: 1, Next: 30}})
	require.NoError(t, err)
	assert.Equal(t, []kafka.TopicPartition{tps[1]}, fenced, "the old owner of a/1 is fenced")
	stored, err := store.Stored(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[kafka.TopicPartition]int64{tps[0]: 10, tps[1]: 20}, stored, "never back, nothing under an old epoch")
}

// TestResolveWaitsForTheTransactionAndReadsItsMark checks how a COMMIT of unknown
// outcome is settled: resolve waits while the transaction holds its rows (it has not
// ended), then finds its mark if it committed; a rolled-back one is not committed; with
// every partition claimed since by another owner, it is fenced, unless its mark is
// there.
func TestResolveWaitsForTheTransactionAndReadsItsMark(t *testing.T) {
	ctx := t.Context()
	pool := newPool(t)
	store := kafkapg.NewOffsets(pool, uniqueName("resolve"))
	tps := []kafka.TopicPartition{{Topic: "a", Partition: 0}, {Topic: "a", Partition: 1}}
	claims, err := store.Claim(ctx, tps)
	require.NoError(t, err)
	offs := []kafka.StoreOffset{{TopicPartition: tps[0], Epoch: claims[0].Epoch, Next: 10}, {TopicPartition: tps[1], Epoch: claims[1].Epoch, Next: 20}}

	// In flight: resolve waits for the transaction's end.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	fenced, err := kafkapg.CommitOffsets(ctx, store, tx, offs, 111)
	require.NoError(t, err)
	require.Empty(t, fenced)
	type outcome struct {
		committed bool
		fenced    []kafka.TopicPartition
		err       error
	}
	got := make(chan outcome, 1)
	go func() {
		c, f, err := kafkapg.Resolve(ctx, store, offs, 111)
		got <- outcome{c, f, err}
	}()
	scenario.Eventually(t, 10*time.Millisecond, 10*time.Second, "resolve waits for the row lock", func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FOR SHARE%'`).Scan(&waiting))
		return waiting > 0
	})
	select {
	case o := <-got:
		t.Fatalf("resolve answered %+v before the transaction ended", o)
	default:
	}
	require.NoError(t, tx.Commit(ctx))
	o := <-got
	require.NoError(t, o.err)
	assert.True(t, o.committed, "committed")

	// Rolled back: not committed, still ours.
	require.ErrorIs(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := kafkapg.CommitOffsets(ctx, store, tx, offs, 222)
		require.NoError(t, err)
		return context.Canceled // roll back
	}), context.Canceled)
	c, f, err := kafkapg.Resolve(ctx, store, offs, 222)
	require.NoError(t, err)
	assert.False(t, c)
	assert.Empty(t, f)

	// Another owner claimed both: fenced, unless the mark is there (a claim keeps it).
	_, err = store.Claim(ctx, tps)
	require.NoError(t, err)
	c, f, err = kafkapg.Resolve(ctx, store, offs, 333)
	require.NoError(t, err)
	assert.False(t, c)
	assert.Equal(t, tps, f)
	c, _, err = kafkapg.Resolve(ctx, store, offs, 111)
	require.NoError(t, err)
	assert.True(t, c, "committed before the claim")
}
