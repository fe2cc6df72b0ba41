package pipelineprom_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the test binary if any goroutine outlives the tests: the collector
// starts none, and every run the tests start must have ended.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
