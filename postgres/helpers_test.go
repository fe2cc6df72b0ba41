package pgpipe_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gopipeline/pipeline/internal/scenario"
)

// TestMain fails the package if a goroutine outlives the tests: every pool a test opens
// is closed, and every run's goroutines have exited.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dbURL returns the test server's URL (scenario.DatabaseURL: without one the test
// skips, or fails under CI).
func dbURL(tb testing.TB) string {
	tb.Helper()
	return scenario.DatabaseURL(tb)
}

// newPool opens a pool on the test server, closed when the test ends.
func newPool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL(tb))
	require.NoError(tb, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

// tableName returns a table name of its own for this test and process.
var tableName = scenario.UniqueName

// createTable creates a table of its own (tableName(prefix)) with the given columns,
// "(name type, ...)", dropped when the test ends, and returns its name.
func createTable(tb testing.TB, pool *pgxpool.Pool, prefix, columns string) string {
	tb.Helper()
	table := tableName(prefix)
	mustExec(tb, pool, "CREATE TABLE "+table+" "+columns)
	tb.Cleanup(func() { mustExec(tb, pool, "DROP TABLE IF EXISTS "+table) })
	return table
}

// mustExec runs sql on pool.
func mustExec(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(tb, err, sql)
}

// count returns count(*) and count(DISTINCT id) of table.
func count(tb testing.TB, pool *pgxpool.Pool, table string) (rows, distinct int64) {
	tb.Helper()
	err := pool.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT id) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&rows, &distinct)
	require.NoError(tb, err)
	return rows, distinct
}

// serverScript returns the path of scripts/postgres.sh when it runs the test server
// (the fault tests stop and start it), or skips the test (fails it under CI).
func serverScript(tb testing.TB) string {
	tb.Helper()
	dbURL(tb)
	s := os.Getenv("PGPIPE_SERVER_SCRIPT")
	if s == "" {
		s, _ = filepath.Abs(filepath.Join("..", "scripts", "postgres.sh"))
	}
	out, err := exec.Command(s, "url").Output()
	if err != nil || strings.TrimSpace(string(out)) != os.Getenv("DATABASE_URL") {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("the test server is not the one of %s: the fault tests need to stop and start it", s)
		}
		tb.Skipf("DATABASE_URL is not the server of %s, which this test stops and starts", s)
	}
	return s
}

// server runs the script with cmd (crash, start).
func server(tb testing.TB, script, cmd string) {
	tb.Helper()
	out, err := exec.Command(script, cmd).CombinedOutput()
	require.NoError(tb, err, "%s %s: %s", script, cmd, out)
}
