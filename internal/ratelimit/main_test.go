package ratelimit

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the test binary if any goroutine outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
