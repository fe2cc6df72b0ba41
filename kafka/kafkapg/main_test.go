package kafkapg_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs a member process of the kill test when asked to (childEnv), and
// otherwise fails the test binary if any goroutine outlives the tests.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}
