package scenario

import (
	"context"
	"iter"
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
