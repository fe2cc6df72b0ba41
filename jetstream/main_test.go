package jetstream_test

import (
	"testing"

	"github.com/gopipeline/pipeline/internal/scenario"
)

// TestMain runs the child process of the crash test when asked to (childEnv), and
// otherwise fails the test binary if any goroutine outlives the tests.
func TestMain(m *testing.M) { scenario.TestMain(m, childEnv, runChild) }
