package kafka

// Crash makes the current run of s, at its next transaction, stop as if its process
// died: the transaction stays open (its records produced), nothing more is committed,
// and the run fails with ErrCrashed.
func Crash[T any](s *Source[T]) { s.crash.Store(true) }

// ErrCrashed is the error of a run stopped by Crash.
var ErrCrashed = errCrashed
