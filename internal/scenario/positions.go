package scenario

import (
	"context"
	"iter"
	"sync/atomic"

	"github.com/gopipeline/pipeline"
)

// Positions returns a FromCheckpoint function over the positions pos..n-1, each item
// its own position.
func Positions(n int) func(context.Context, int64) iter.Seq2[int, error] {
	return func(_ context.Context, pos int64) iter.Seq2[int, error] {
		return func(yield func(int, error) bool) {
			for i := int(pos); i < n && yield(i, nil); i++ {
			}
		}
	}
}

// MemStore is a pipeline.CheckpointStore in memory.
type MemStore struct{ Pos atomic.Int64 }

// Load implements pipeline.CheckpointStore.
func (s *MemStore) Load(context.Context) (int64, error) { return s.Pos.Load(), nil }

// Save implements pipeline.CheckpointStore.
func (s *MemStore) Save(_ context.Context, pos int64) error { s.Pos.Store(pos); return nil }

// Checkpointed builds a pipeline of a checkpointed source of the positions 0 ... n-1
// (Positions) in store, with opts, into a sink "sink" of 2 workers.
func Checkpointed(store pipeline.CheckpointStore, n int, opts ...pipeline.CheckpointOption) *pipeline.Pipeline {
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, store, Positions(n), opts...)
	pipeline.To(src, pipeline.NewSink("sink", 2, func(context.Context, int) error { return nil }))
	return p
}
