package bench

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run when a benchmark or a test leaves a goroutine behind: every
// implementation measured here (the library, the hand-written baseline, conc) must have
// stopped all of its goroutines when its run returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
