package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// ErrBudgetExceeded is matched (with [errors.Is]) by the error a run returns when an
// error budget trips. The concrete error is a [*BudgetError] carrying the counts.
var ErrBudgetExceeded = errors.New("pipeline: error budget exceeded")

// ErrTimeout is matched (with [errors.Is]) by the error of an attempt that ran past the
// stage's per-attempt timeout (see [WithTimeout]). The same error also matches
// [context.DeadlineExceeded].
var ErrTimeout = errors.New("pipeline: attempt timed out")

// ErrLate is matched (with [errors.Is]) by the error of a run stopped by a late item of
// a [Window] stage without [WithLateItems]: an item behind the watermark by more than
// the allowed lateness.
var ErrLate = errors.New("pipeline: item late for its window")

// ErrBadCheckpoint is matched (with [errors.Is]) by the error of a run whose
// [CheckpointStore] loaded a position that cannot be one (a negative number).
var ErrBadCheckpoint = errors.New("pipeline: the checkpoint store loaded an invalid position")

// ErrGoexit is matched (with [errors.Is]) by the error of a run in which user code (a
// stage function, a source, a sink, a dead-letter destination) called [runtime.Goexit],
// as testing's t.FailNow and t.Fatal do: the goroutine ends without returning, so the
// run fails rather than lose the item it held.
var ErrGoexit = errors.New("pipeline: user code called runtime.Goexit (t.FailNow or t.Fatal in a stage?)")

// ErrRunning is the error [Pipeline.Run], [Collect] and [All] return, at once and
// without touching the run in progress or its report, when the pipeline is already
// running: a pipeline runs one run at a time. Match it with [errors.Is].
var ErrRunning = errors.New("pipeline: the pipeline is already running (one run at a time)")

// StageError is the error a run returns when a stage (or a source, or a sink) fails the
// run. Stage is the name of the stage; Err is the cause: the stage function's error, a
// [*PanicError], or a [*BudgetError].
//
// When the run stopped because of one item's error, Attempts is the number of calls
// made for it, and NoDeadLetter tells that the error was an item error (or a transient
// one out of retries) that stopped the run only because the stage has no
// [WithDeadLetter] to set the item aside.
type StageError struct {
	Stage        string
	Err          error
	Attempts     int
	NoDeadLetter bool
}

// Error implements error.
func (e *StageError) Error() string {
	switch {
	case e.NoDeadLetter && e.Attempts > 1:
		return fmt.Sprintf("pipeline: stage %q: item failed after %d attempts, and the stage has no WithDeadLetter to set it aside: %v",
			e.Stage, e.Attempts, e.Err)
	case e.NoDeadLetter:
		return fmt.Sprintf("pipeline: stage %q: item failed (1 attempt), and the stage has no WithDeadLetter to set it aside: %v", e.Stage, e.Err)
	case e.Attempts > 1:
		return fmt.Sprintf("pipeline: stage %q: attempt %d: %v", e.Stage, e.Attempts, e.Err)
	}
	return fmt.Sprintf("pipeline: stage %q: %v", e.Stage, e.Err)
}

// Unwrap returns the cause.
func (e *StageError) Unwrap() error { return e.Err }

// PanicError is a panic recovered from user code (a stage function, a source, a sink or a
// dead-letter destination). It always fails the run: it is never retried, dead-lettered
// or counted by a budget. Value is what was passed to panic; Stack is the stack of the
// panicking goroutine, captured where the panic was recovered.
type PanicError struct {
	Value any
	Stack []byte
}

func newPanicError(v any) *PanicError {
	return &PanicError{Value: v, Stack: debug.Stack()}
}

// guard is the engine's one recovery from user code that does not return: deferred, as
//
//	done := false
//	defer guard(&done, func(err error) { … })
//	… // calls user code
//	done = true
//
// it calls failed when the code did not return: with a *PanicError (the panic's value,
// and the stack of the panicking goroutine) once the panic is recovered, or with
// [ErrGoexit] itself (see isGoexit) for a runtime.Goexit, which cannot be stopped and
// goes on ending the goroutine after the deferred calls. With a nil done, a Goexit is
// not told from a return: failed is called for a panic only. failed does the site's
// own accounting, and may set the named results of the function that deferred guard.
// guard itself neither allocates nor calls failed when the code returned.
func guard(done *bool, failed func(err error)) {
	if done != nil && *done {
		return
	}
	v := recover() // guard is the deferred call itself: recover works only there
	if v == nil && done == nil {
		return // returned (or a Goexit, which the site does not handle)
	}
	err := ErrGoexit
	if v != nil {
		err = newPanicError(v)
	}
	failed(err)
}

// isGoexit reports whether err, given by [guard], is a runtime.Goexit rather than a
// panic (whose value may itself be or wrap ErrGoexit: errors.Is would see through it).
func isGoexit(err error) bool {
	return err == ErrGoexit //nolint:errorlint // identity: guard gives ErrGoexit itself, never wrapped
}

// Error implements error. It includes the value but not the stack; print Stack for that.
func (e *PanicError) Error() string {
	return fmt.Sprintf("panic: %v", e.Value)
}

// Unwrap returns Value when it is an error, so that [errors.Is] sees through a panic
// with an error value.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// BudgetError reports an error budget that tripped (see [WithErrorBudget]). Failed and
// Seen are the counts at the moment it tripped (over the window, when the budget has
// one). Drained tells whether the run drained (finished in-flight items) rather than
// aborting. It matches [ErrBudgetExceeded].
type BudgetError struct {
	Failed, Seen int64
	MaxRatio     float64
	Window       int
	Drained      bool
}

// Error implements error.
func (e *BudgetError) Error() string {
	over := "items"
	if e.Window > 0 {
		over = fmt.Sprintf("of the last %d items", e.Window)
	}
	mode := "aborted"
	if e.Drained {
		mode = "drained"
	}
	return fmt.Sprintf("pipeline: error budget exceeded: %d/%d %s failed (max %.4g), %s",
		e.Failed, e.Seen, over, e.MaxRatio, mode)
}

// Is reports whether target is [ErrBudgetExceeded].
func (e *BudgetError) Is(target error) bool { return target == ErrBudgetExceeded }

// timeoutError is an attempt that ran past its deadline.
type timeoutError struct {
	after time.Duration
	err   error
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("timed out after %v: %v", e.after, e.err)
}

func (e *timeoutError) Unwrap() []error {
	return []error{ErrTimeout, context.DeadlineExceeded, e.err}
}

// Class is what an item's error does to the run. See the package documentation,
// section "Error classes", for who decides the class.
type Class uint8

const (
	// ClassFatal stops the whole run: the error becomes the run's error.
	ClassFatal Class = iota
	// ClassItem sets the item aside (dead-letters it) and carries on.
	ClassItem
	// ClassTransient retries the item, when the stage has [WithRetry] and attempts are
	// left; otherwise it is treated as [ClassItem].
	ClassTransient
)

// String returns "fatal", "item" or "transient".
func (c Class) String() string { return enumName("Class", classNames[:], c) }

var classNames = [...]string{ClassFatal: "fatal", ClassItem: "item", ClassTransient: "transient"}

// valid reports whether c is one of the defined classes.
func (c Class) valid() bool { return c <= ClassTransient }

// MarshalText encodes the class as its name, so that dead-letter files read well. A
// class that is not defined is an error.
func (c Class) MarshalText() ([]byte, error) {
	if !c.valid() {
		return nil, fmt.Errorf("pipeline: undefined error class %d", uint8(c))
	}
	return []byte(c.String()), nil
}

// UnmarshalJSON decodes a class written by MarshalText (a JSON string), or as the
// number that dead-letter files of earlier releases hold.
func (c *Class) UnmarshalJSON(b []byte) error {
	if n, err := strconv.ParseUint(string(b), 10, 8); err == nil {
		if k := Class(n); k.valid() {
			*c = k
			return nil
		}
		return fmt.Errorf("pipeline: unknown error class %s", b)
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("pipeline: error class %s: %w", b, err)
	}
	return c.UnmarshalText([]byte(s))
}

// UnmarshalText decodes a class name written by MarshalText.
func (c *Class) UnmarshalText(b []byte) error {
	for _, k := range []Class{ClassFatal, ClassItem, ClassTransient} {
		if string(b) == k.String() {
			*c = k
			return nil
		}
	}
	return fmt.Errorf("pipeline: unknown error class %q", b)
}

// DeadLetterReadError names the lines of a dead-letter file that could not be decoded
// (see [ReadDeadLetters]); the file's other records were read.
type DeadLetterReadError struct {
	Path  string
	Lines []int   // 1-based line numbers
	Errs  []error // the error of each line
}

// Error implements error.
func (e *DeadLetterReadError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pipeline: %s: %d malformed dead-letter line(s)", e.Path, len(e.Lines))
	for i, l := range e.Lines {
		if i == 3 {
			b.WriteString(", ...")
			break
		}
		fmt.Fprintf(&b, "; line %d: %v", l, e.Errs[i])
	}
	return b.String()
}

// Unwrap returns the errors of the lines.
func (e *DeadLetterReadError) Unwrap() []error { return e.Errs }

// classified marks an error with its class.
type classified struct {
	err   error
	class Class
}

func (e *classified) Error() string { return e.err.Error() }
func (e *classified) Unwrap() error { return e.err }

// Transient marks err as transient: worth retrying. It returns nil for a nil err.
func Transient(err error) error { return mark(err, ClassTransient) }

// Permanent marks err as an item error that retrying cannot fix: the item is
// dead-lettered at once. It returns nil for a nil err.
func Permanent(err error) error { return mark(err, ClassItem) }

// Fatal marks err as fatal: it stops the run even when the stage's classifier would
// treat it as an item error. It returns nil for a nil err.
func Fatal(err error) error { return mark(err, ClassFatal) }

func mark(err error, c Class) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, class: c}
}

// ClassOf returns the class a marker ([Transient], [Permanent], [Fatal]) gave err, and
// whether err carries one. The outermost marker wins.
func ClassOf(err error) (Class, bool) {
	if c, ok := errors.AsType[*classified](err); ok {
		return c.class, true
	}
	return ClassFatal, false
}

// ErrBreakerOpen is matched (with [errors.Is]) by the error of a run whose circuit
// breaker stayed open for its MaxOpen (see [WithCircuitBreaker]). The
// concrete error is a [*BreakerError].
var ErrBreakerOpen = errors.New("pipeline: circuit breaker open too long")

// BreakerError reports a circuit breaker that was not closed (open, or half-open with
// failing probes) for Open in all over the last Window (its MaxOpenWindow), as long as
// its MaxOpen or longer: the service that Stage calls is still down, or keeps going
// down. It matches [ErrBreakerOpen].
type BreakerError struct {
	Stage   string
	Open    time.Duration
	MaxOpen time.Duration
	Window  time.Duration
}

// Error implements error.
func (e *BreakerError) Error() string {
	return fmt.Sprintf("pipeline: circuit breaker of stage %q open for %v of the last %v, as long as its MaxOpen of %v: what the stage calls is still failing",
		e.Stage, e.Open, e.Window, e.MaxOpen)
}

// Is reports whether target is [ErrBreakerOpen].
func (e *BreakerError) Is(target error) bool { return target == ErrBreakerOpen }

// ErrBreakerFull is matched (with [errors.Is]) by the error of an item shed because
// its key's circuit breaker already held as many items as it may
// ([WithBreakerPerKey]'s KeyBounds.Held). The concrete error is a [*BreakerFullError].
var ErrBreakerFull = errors.New("pipeline: a key's circuit breaker holds too many items")

// BreakerFullError reports an item of Stage that was shed, not held, because the
// circuit breaker of its key (Key, as fmt's %v prints it) held Held items already, its
// bound ([WithBreakerPerKey]). It is an item error ([ClassItem]): dead-lettered, or the
// run fails with it on a stage without a destination. It matches [ErrBreakerFull]; the
// report counts it under its type, "*pipeline.BreakerFullError".
type BreakerFullError struct {
	Stage string
	Key   string
	Held  int
}

// Error implements error.
func (e *BreakerFullError) Error() string {
	return fmt.Sprintf("pipeline: stage %q: the circuit breaker of key %s holds %d items, its bound: shed", e.Stage, e.Key, e.Held)
}

// Is reports whether target is [ErrBreakerFull].
func (e *BreakerFullError) Is(target error) bool { return target == ErrBreakerFull }

// ErrRetryAfterTooLong is matched (with [errors.Is]) by the error of an item whose
// failed attempt asked, with a Retry-After, for a longer delay than its stage's cap
// (see [WithRetryAfterCap]). The concrete error is a [*RetryAfterError].
var ErrRetryAfterTooLong = errors.New("pipeline: Retry-After past its cap")

// RetryAfterError reports an attempt of Stage whose error asked for a retry no sooner
// than Delay from now (see [RetryAfter]), longer than the stage's cap ([WithRetryAfterCap]):
// the item was set aside as an item error rather than waited for. Err is the attempt's
// error. It matches [ErrRetryAfterTooLong]; the report counts it under its type,
// "*pipeline.RetryAfterError".
type RetryAfterError struct {
	Stage string
	Delay time.Duration // what the server asked for
	Cap   time.Duration // the stage's cap
	Err   error
}

// Error implements error.
func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("pipeline: stage %q: the server asked to retry after %v, past the cap of %v: set aside: %v",
		e.Stage, e.Delay, e.Cap, e.Err)
}

// Unwrap returns the attempt's error.
func (e *RetryAfterError) Unwrap() error { return e.Err }

// Is reports whether target is [ErrRetryAfterTooLong].
func (e *RetryAfterError) Is(target error) bool { return target == ErrRetryAfterTooLong }

// ErrThrottled is matched (with [errors.Is]) by the error of an item shed because its
// attempt would have waited longer than its stage's [WithMaxTokenWait] for a rate-limit
// token. The concrete error is a [*ThrottledError].
var ErrThrottled = errors.New("pipeline: rate-limit token too far off")

// ThrottledError reports an item of Stage that was shed, not attempted, because its
// token would have come later than MaxWait from now ([WithMaxTokenWait]). It matches
// [ErrThrottled]; the report counts it under its type, "*pipeline.ThrottledError".
type ThrottledError struct {
	Stage   string
	MaxWait time.Duration
}

// Error implements error.
func (e *ThrottledError) Error() string {
	return fmt.Sprintf("pipeline: stage %q: its rate limit has no token within %v: shed", e.Stage, e.MaxWait)
}

// Is reports whether target is [ErrThrottled].
func (e *ThrottledError) Is(target error) bool { return target == ErrThrottled }

// retryAfterError is an error that carries the delay a server asked for.
type retryAfterError struct {
	err error
	d   time.Duration
}

func (e *retryAfterError) Error() string             { return e.err.Error() }
func (e *retryAfterError) Unwrap() error             { return e.err }
func (e *retryAfterError) RetryAfter() time.Duration { return e.d }
