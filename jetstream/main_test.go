package jetstream_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs the child process of the crash test when asked to, and otherwise fails
// the test binary if any goroutine outlives the tests.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}
