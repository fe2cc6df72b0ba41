package scenario

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Child is the test binary run again as a child process of a crash or kill test, its
// standard input open until Stop closes it (the child's cue to stop gracefully). The
// child's side is TestMain's child function.
type Child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan error // the child's exit
}

// StartChild starts the test binary again, running no test, with env added to the
// environment (TestMain's env among them, so that it runs the child); its standard
// error is the test's. out, when not nil, reads the child's standard output to its end.
func StartChild(tb testing.TB, out func(io.Reader), env ...string) *Child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var stdout io.Reader
	if out != nil {
		if stdout, err = cmd.StdoutPipe(); err != nil {
			tb.Fatal(err)
		}
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &Child{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	go func() {
		if out != nil {
			out(stdout)
		}
		c.done <- cmd.Wait()
	}()
	return c
}

// Kill SIGKILLs the child and waits for its exit.
func (c *Child) Kill(tb testing.TB) {
	tb.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		tb.Fatal(err)
	}
	var ee *exec.ExitError
	if err := <-c.done; !errors.As(err, &ee) {
		tb.Fatalf("the child's exit: want an *exec.ExitError, got %v", err)
	}
}

// Stop closes the child's input (it stops gracefully) and waits for its exit, which
// must be a success, for a minute at most.
func (c *Child) Stop(tb testing.TB) {
	tb.Helper()
	if err := c.stdin.Close(); err != nil {
		tb.Fatal(err)
	}
	select {
	case err := <-c.done:
		if err != nil {
			tb.Fatalf("the child's exit: %v", err)
		}
	case <-time.After(time.Minute):
		tb.Fatal("a child did not stop")
	}
}
