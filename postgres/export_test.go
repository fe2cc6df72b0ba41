package pgpipe

import (
	"context"
	"hash/maphash"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/gopipeline/pipeline"
)

// CommitTx is commit, for the tests that commit a transaction of their own: it
// records p in tx and commits it.
func (c *Checkpoint) CommitTx(ctx context.Context, tx pgx.Tx, p pipeline.Progress) error {
	return c.commit(ctx, tx, p, defaultConfig())
}

// KeyPaths de-duplicates batch by the key columns key and gives each row's lane of
// lanes, both as a writer of m does (fast: unboxed, when keyKinds allows it) and with
// every key value boxed (compareValues and of's type switch), for the tests that check
// that the two agree; unboxed reports whether the fast path read m's key unboxed.
func KeyPaths[T any](m Mapping[T], key []string, batch []T, lanes int) (fast, boxed []T, fastLanes, boxedLanes []int, unboxed bool) {
	w := &Writer[T]{mapping: m}
	w.columns, w.cfg = m.columns, defaultConfig()
	for _, k := range key {
		w.keyIdx = append(w.keyIdx, slices.Index(m.columns, k))
	}
	l := newLanes(w, lanes)
	run := func() ([]T, []int) {
		var h maphash.Hash
		h.SetSeed(l.seed)
		of := make([]int, len(batch))
		for i := range batch {
			of[i], _, _ = l.of(&batch[i], &h, nil, nil)
		}
		return w.dedupe(batch), of
	}
	w.kinds = keyKinds(m, w.keyIdx)
	unboxed = w.kinds != nil
	fast, fastLanes = run()
	w.kinds = nil
	boxed, boxedLanes = run()
	return fast, boxed, fastLanes, boxedLanes, unboxed
}
