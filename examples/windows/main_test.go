package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

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
	if os.Getenv("DATABASE_URL") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("DATABASE_URL is not set: CI must start PostgreSQL (scripts/postgres.sh start) and export it")
		}
		t.Skip("DATABASE_URL is not set (scripts/postgres.sh start prints one)")
	}
	bin := filepath.Join(t.TempDir(), "windows")
	built, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", built)

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
