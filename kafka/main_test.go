package kafka_test

import (
	"testing"

	"github.com/gopipeline/pipeline/internal/scenario"
)

// TestMain runs a member process of the kill test when asked to (killChildEnv), and
// otherwise fails the test binary if any goroutine outlives the tests.
func TestMain(m *testing.M) { scenario.TestMain(m, killChildEnv, runKillChild) }
