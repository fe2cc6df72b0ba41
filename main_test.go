package pipeline

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the test binary if any goroutine outlives the tests, parallel ones
// included: every goroutine a run starts must have exited when Run returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
