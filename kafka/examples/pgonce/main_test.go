package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestKilledMembersWriteEachRecordOnce runs the example as a user does, small: it
// must end with every record in the table once.
func TestKilledMembersWriteEachRecordOnce(t *testing.T) {
	if os.Getenv("DATABASE_URL") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("DATABASE_URL is not set: CI must start PostgreSQL (scripts/postgres.sh start) and export it")
		}
		t.Skip("DATABASE_URL is not set (scripts/postgres.sh start prints one)")
	}
	if testing.Short() {
		t.Skip("starts and kills processes")
	}
	bin := filepath.Join(t.TempDir(), "pgonce")
	built, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", built)
	// Its output goes to a file: the members it starts write there too, and a pipe
	// would keep the test waiting for the last of them.
	logPath := filepath.Join(t.TempDir(), "out")
	log, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), bin, "-records", "3000", "-kills", "2", "-table", "pgonce_test")
	cmd.Stdout, cmd.Stderr = log, log
	err = cmd.Run()
	require.NoError(t, log.Close())
	out, rerr := os.ReadFile(logPath)
	require.NoError(t, rerr)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "3,000 rows, 3,000 distinct ids")
	assert.Contains(t, string(out), "each record written exactly once")
}
