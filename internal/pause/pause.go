// Package pause waits for a while unless a context ends first: the root package's
// retry backoff and the benchmarks' stand-in for an item's I/O share it.
package pause

import (
	"context"
	"time"
)

// For waits d, or until ctx is done, and then returns its cause.
func For(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
