package scenario

import (
	"bytes"
	"runtime"
	"testing"
	"time"
)

// Eventually polls cond at each tick of every until it holds, and fails tb if it does not
// within limit. It is for tests against a server outside the test's control (an
// embedded NATS or Kafka cluster), whose goroutines a synctest bubble cannot hold;
// limit bounds a failure, it does not measure anything. When it gives up, it logs the
// stacks of the goroutines in the module's own code (stuckStacks): a wait that gives up
// in CI is a hang to explain, and the log is all that a CI run keeps.
func Eventually(tb testing.TB, every, limit time.Duration, what string, cond func() bool) {
	tb.Helper()
	tick := time.NewTicker(every)
	defer tick.Stop()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			tb.Logf("goroutines in the module's code:\n%s", stuckStacks(256<<10))
			tb.Fatalf("gave up waiting for %s after %v", what, limit)
		}
	}
}

// module is the prefix of the functions whose goroutines stuckStacks keeps.
const module = "github.com/gopipeline/pipeline"

// stuckStacks returns the stacks of every goroutine that runs a function of the module
// outside its tests and this package (the library's own goroutines, and those blocked
// in it), at most limit bytes of them.
func stuckStacks(limit int) []byte {
	buf := make([]byte, 8<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []byte
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if !ownCode(g) {
			continue
		}
		if len(out)+len(g) > limit {
			out = append(out, "(more goroutines left out)\n"...)
			break
		}
		out = append(append(out, g...), "\n\n"...)
	}
	return out
}

// ownCode reports whether the goroutine's stack g has a frame of the module's code that
// is neither a test's nor this package's: a frame is a function's line, then its file's.
func ownCode(g []byte) bool {
	lines := bytes.Split(g, []byte("\n"))
	for i := 0; i+1 < len(lines); i++ {
		fn, file := lines[i], lines[i+1]
		if bytes.HasPrefix(fn, []byte(module)) && !bytes.Contains(fn, []byte("/internal/scenario.")) &&
			bytes.HasPrefix(file, []byte("\t")) && !bytes.Contains(file, []byte("_test.go:")) {
			return true
		}
	}
	return false
}
