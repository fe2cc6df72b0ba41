package pipeline_test

import (
	"context"
	"fmt"
	"slices"

	"github.com/gopipeline/pipeline"
)

// bankStore stands for a database: its "transaction" keeps the rows and the progress
// together.
type bankStore struct {
	pos       int64
	committed []pipeline.PositionRange
	rows      []int
}

func (s *bankStore) Load(context.Context) (int64, error) { return s.pos, nil }
func (s *bankStore) Save(_ context.Context, pos int64) error {
	s.pos = max(s.pos, pos)
	return nil
}

func (s *bankStore) LoadCommitted(context.Context) (int64, []pipeline.PositionRange, error) {
	return s.pos, s.committed, nil
}

func (s *bankStore) SaveCommitted(_ context.Context, pos int64, committed []pipeline.PositionRange) error {
	s.pos = max(s.pos, pos)
	s.committed = append(s.committed, committed...) // a real store drops those below pos
	return nil
}

// This example shows a sink that commits its rows and the advanced checkpoint in one
// transaction: the progress handed to the function is what settling the batch records.
func ExampleCommit() {
	store := &bankStore{}
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, store, from(6))
	pipeline.ToBatches(src, 3, pipeline.NewSink("save", 1, func(ctx context.Context, batch []int) error {
		return pipeline.Commit(ctx, func(_ context.Context, pr pipeline.Progress) error {
			store.rows = append(store.rows, batch...) // in a database: one transaction
			// Never lower the position: concurrent commits may land in any order.
			store.pos = max(store.pos, pr.Watermark)
			fmt.Printf("rows %v, checkpoint %d\n", batch, pr.Watermark)
			return nil
		})
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
	}
	// Output:
	// rows [0 1 2], checkpoint 3
	// rows [3 4 5], checkpoint 6
}

// This example shows the progress of a batch committed ahead of the watermark: its
// positions are listed, so that a store can keep them and a resumed run skip them.
func ExampleProgress() {
	pr := pipeline.Progress{Checkpointed: true, Watermark: 100, Committed: []pipeline.PositionRange{{From: 200, To: 250}}}
	fmt.Println(pr.Watermark, pr.Committed)
	// Output: 100 [{200 250}]
}

// This example shows a resumed run that skips the positions a store says were
// committed above its watermark.
func ExampleCommittedStore() {
	store := &bankStore{pos: 2, committed: []pipeline.PositionRange{{From: 4, To: 6}}}
	p := pipeline.New()
	got, err := pipeline.Collect(context.Background(), pipeline.FromCheckpoint(p, store, from(8)))
	fmt.Println(got, err)
	// Output: [2 3 6 7] <nil>
}

// This example shows a range of positions: From is in it, To is not.
func ExamplePositionRange() {
	r := pipeline.PositionRange{From: 10, To: 13}
	fmt.Println(r.To-r.From, slices.Contains([]int64{10, 11, 12}, r.To))
	// Output: 3 false
}
