package scenario

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
)

// DatabaseURL returns the URL of the PostgreSQL server the tests and benchmarks use,
// DATABASE_URL (scripts/postgres.sh start prints one). Without it tb skips, or fails
// under CI (CI=true), which must start the server.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv("DATABASE_URL")
	if u == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatal("DATABASE_URL is not set: CI must start PostgreSQL (scripts/postgres.sh start) and export it")
		}
		tb.Skip("no PostgreSQL: run  export DATABASE_URL=$(scripts/postgres.sh start)  first")
	}
	return u
}

var nameSeq atomic.Int64

// UniqueName returns a name of its own for this test process (a table, a checkpoint, an
// offset store): prefix, the process ID and a count, so that the test binaries sharing
// the server do not collide.
func UniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), nameSeq.Add(1))
}
