package scenario

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain is the TestMain of a package whose tests start their own test binary again
// as a child process (a crash or a kill test): with env set, the process is such a
// child, and exits with what child returns; otherwise it runs the tests and fails the
// binary if any goroutine outlives them.
func TestMain(m *testing.M, env string, child func() int) {
	if os.Getenv(env) != "" {
		os.Exit(child())
	}
	goleak.VerifyTestMain(m)
}
