package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// run runs the command built in bin with args and returns its exit status and output.
func run(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok { //nolint:errorlint // exec returns it unwrapped
		return ee.ExitCode(), out.String()
	}
	require.NoError(t, err)
	return 0, out.String()
}

// TestCrashAndResume crashes the job (os.Exit, as a SIGKILL leaves it) twice, once
// some rows are in the table, and resumes it: the last run reads only what the crashed
// ones left, and every row of the table equals the total of its orders.
func TestCrashAndResume(t *testing.T) {
	bin := build(t)
	code, out := run(t, bin, "-fresh", "-crash-after", "300")
	require.Equal(t, 3, code, out)
	code, out = run(t, bin, "-crash-after", "200")
	require.Equal(t, 3, code, out)
	code, out = run(t, bin)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "settled by earlier runs")
	assert.Contains(t, out, "every one equal to the total of its orders")
	assert.Contains(t, out, " 0 late")
}

// build builds the command into a temporary folder, once PostgreSQL is known to be there.
func build(t *testing.T) string {
	t.Helper()
	if os.Getenv("DATABASE_URL") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("DATABASE_URL is not set: CI must start PostgreSQL (scripts/postgres.sh start) and export it")
		}
		t.Skip("DATABASE_URL is not set (scripts/postgres.sh start prints one)")
	}
	bin := filepath.Join(t.TempDir(), "windows")
	built, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", built)
	return bin
}

// TestSIGKILLAndResume kills the job with SIGKILL from outside, after 1, 7 and 30 of
// its transactions have committed rows, and resumes it each time: the run that ends
// finds every window's row equal to the total of its orders, and no row was written
// twice (a trigger records every upsert that met a row already there).
func TestSIGKILLAndResume(t *testing.T) {
	bin := build(t)
	url := os.Getenv("DATABASE_URL")
	code, out := run(t, bin, "-fresh", "-n", "0") // the table, empty, and no checkpoint
	require.Equal(t, 0, code, out)
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS windows_rewrites (customer text, minute timestamptz)`,
		`TRUNCATE windows_rewrites`,
		`CREATE OR REPLACE FUNCTION windows_rewritten() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO windows_rewrites VALUES (NEW.customer, NEW.minute); RETURN NEW; END $$`,
		`CREATE OR REPLACE TRIGGER windows_rewritten BEFORE UPDATE ON ` + table + `
			FOR EACH ROW EXECUTE FUNCTION windows_rewritten()`,
		`CREATE OR REPLACE FUNCTION windows_written() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN PERFORM pg_notify('windows_written', ''); RETURN NULL; END $$`,
		`CREATE OR REPLACE TRIGGER windows_written AFTER INSERT ON ` + table + `
			FOR EACH STATEMENT EXECUTE FUNCTION windows_written()`,
	} {
		_, err := conn.Exec(t.Context(), q)
		require.NoError(t, err, q)
	}
	t.Cleanup(func() {
		defer func() { assert.NoError(t, conn.Close(context.Background())) }()
		for _, q := range []string{
			`DROP TRIGGER IF EXISTS windows_rewritten ON ` + table,
			`DROP TRIGGER IF EXISTS windows_written ON ` + table,
		} {
			_, err := conn.Exec(context.Background(), q)
			assert.NoError(t, err, q)
		}
	})

	for _, k := range []int{1, 7, 30} {
		killAfter(t, url, bin, k)
	}
	code, out = run(t, bin)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "settled by earlier runs")
	assert.Contains(t, out, "every one equal to the total of its orders")
	var rewrites int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT count(*) FROM windows_rewrites`).Scan(&rewrites))
	assert.Zero(t, rewrites, "rows written again by a resumed run")
}

// killAfter starts the command and sends it SIGKILL once k of its transactions have
// committed rows into the table (the trigger notifies at each; PostgreSQL delivers a
// notification when its transaction commits).
func killAfter(t *testing.T, url, bin string, k int) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { assert.NoError(t, conn.Close(context.Background())) }()
	_, err = conn.Exec(ctx, `LISTEN windows_written`)
	require.NoError(t, err)

	cmd := exec.Command(bin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		cancel() // a command that ends before its k commits stops the wait below
		exited <- err
	}()
	var waitErr error
	for range k {
		if _, waitErr = conn.WaitForNotification(ctx); waitErr != nil {
			break
		}
	}
	require.NoError(t, cmd.Process.Kill())
	err = <-exited
	require.NoError(t, waitErr, "the command ended before %d commits: %v\n%s", k, err, out.String())
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%v\n%s", err, out.String())
}
