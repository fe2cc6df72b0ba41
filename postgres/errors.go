package pgpipe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gopipeline/pipeline"
)

// ErrFenced is matched (with [errors.Is]) by the error of a commit or a save made by a
// job instance that another instance of the same job has taken over since (see
// [Checkpoint]). It is fatal: the instance that gets it must stop, since the other one
// now owns the job's progress.
var ErrFenced = errors.New("pgpipe: another instance of the job took over its checkpoint")

// ErrCommitUnknown is matched by the error of a commit whose outcome could not be
// learnt: the connection was lost during COMMIT. Without a [Checkpoint] to read the
// outcome back from, the error is transient and the batch is written again, which in
// insert mode may duplicate its rows (the upsert modes are exact). With one, the
// outcome is learnt once the transaction has ended on the server (its commit wrote a
// row of the checkpoint's, or did not); only when that
// fails for a minute (the server unreachable, or the transaction still running, as a
// COMMIT waiting for a synchronous standby that never answers) is the error returned,
// as fatal: the next run's Load then learns what was committed.
var ErrCommitUnknown = errors.New("pgpipe: the outcome of COMMIT is unknown (the connection was lost)")

// RowError is PostgreSQL's rejection of one row: a data error (SQLSTATE class 22, such
// as a NUL byte in text or a value out of range), a constraint violation (class 23), or
// a value the driver could not encode for its column. The writer finds the rows that
// cause such errors by bisection and dead-letters them alone; the record's LastError is
// the RowError's text.
type RowError struct {
	Code       string // SQLSTATE, such as "23505"; empty for an encoding error
	Message    string // PostgreSQL's message
	Detail     string
	Constraint string // the violated constraint, if any
	Table      string
	Column     string // the column, when PostgreSQL names it, or for an encoding error
	Err        error  // the driver's error
}

// Error implements error.
func (e *RowError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pgpipe: row rejected: %s", e.Message)
	if e.Code != "" {
		fmt.Fprintf(&b, " (SQLSTATE %s)", e.Code)
	}
	if e.Constraint != "" {
		fmt.Fprintf(&b, ", constraint %s", e.Constraint)
	}
	if e.Detail != "" {
		fmt.Fprintf(&b, ": %s", e.Detail)
	}
	return b.String()
}

// Unwrap returns the driver's error.
func (e *RowError) Unwrap() error { return e.Err }

// copyFailed is the start of the message of the error PostgreSQL returns for a COPY the
// driver aborted, here because a value could not be encoded.
const copyFailed = "COPY from stdin failed"

// rowError returns err as a *RowError when it is the rejection of a row, else nil.
func rowError(err error) *RowError {
	if re, ok := errors.AsType[*RowError](err); ok {
		return re
	}
	if ee, ok := errors.AsType[*encodeError](err); ok {
		return &RowError{Message: ee.err.Error(), Column: ee.column, Err: err}
	}
	pe, ok := errors.AsType[*pgconn.PgError](err)
	if !ok {
		return nil
	}
	switch {
	case pgerrcode.IsDataException(pe.Code), pgerrcode.IsIntegrityConstraintViolation(pe.Code),
		pe.Code == pgerrcode.QueryCanceled && strings.HasPrefix(pe.Message, copyFailed):
		msg, code := pe.Message, pe.Code
		if code == pgerrcode.QueryCanceled { // the driver could not encode a value
			msg, code = strings.TrimPrefix(strings.TrimPrefix(msg, copyFailed), ": "), ""
		}
		return &RowError{
			Code: code, Message: msg, Detail: pe.Detail, Constraint: pe.ConstraintName,
			Table: pe.TableName, Column: pe.ColumnName, Err: err,
		}
	}
	return nil
}

// transientCodes are the SQLSTATEs worth retrying: the server or the connection failed,
// or the transaction lost a race it may win next time.
var transientCodes = map[string]bool{
	pgerrcode.SerializationFailure:  true,
	pgerrcode.DeadlockDetected:      true,
	pgerrcode.LockNotAvailable:      true,
	pgerrcode.TooManyConnections:    true,
	pgerrcode.AdminShutdown:         true,
	pgerrcode.CrashShutdown:         true,
	pgerrcode.CannotConnectNow:      true,
	pgerrcode.QueryCanceled:         true, // statement_timeout, or a cancel from outside
	pgerrcode.IdleSessionTimeout:    true,
	pgerrcode.InsufficientResources: true,
	pgerrcode.OutOfMemory:           true,
	pgerrcode.DiskFull:              true,
	pgerrcode.IOError:               true,
}

// classify marks err for the pipeline: a row's rejection as an item error, a lost
// connection or a lost race as transient, anything else as fatal with a message that
// names what is missing (the table, a column, the role's right, the database). what
// names the table written to; role and database come from the pool's configuration.
//
// An error met after the attempt's context ended keeps the class it was given (the
// outcome of a COMMIT learnt, a fence), or else is transient: the attempt ran past
// its own deadline ([pipeline.WithTimeout]) waiting for a lock or for a slow server,
// and nothing of it committed, so the batch is written again.
// When the run itself is stopping, the pipeline ignores the class and returns the run's
// cause.
func (w *writerCore) classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := pipeline.ClassOf(err); ok {
		return err
	}
	if ctx.Err() != nil {
		return pipeline.Transient(err)
	}
	if re := rowError(err); re != nil {
		return pipeline.Permanent(re)
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return w.classifyCode(pe, err)
	}
	if isConnError(err) {
		return pipeline.Transient(err)
	}
	return pipeline.Fatal(fmt.Errorf("pgpipe: writing table %s: %w", w.table, err))
}

func (w *writerCore) classifyCode(pe *pgconn.PgError, err error) error {
	cfg := w.pool.Config().ConnConfig
	switch {
	case transientCodes[pe.Code], pgerrcode.IsConnectionException(pe.Code):
		return pipeline.Transient(err)
	case pe.Code == pgerrcode.UndefinedTable:
		return pipeline.Fatal(fmt.Errorf("pgpipe: table %s does not exist in database %q: %w", w.table, cfg.Database, err))
	case pe.Code == pgerrcode.UndefinedColumn:
		return pipeline.Fatal(fmt.Errorf("pgpipe: table %s lacks a column of %v: %w", w.table, w.columns, err))
	case pe.Code == pgerrcode.InsufficientPrivilege:
		return pipeline.Fatal(fmt.Errorf("pgpipe: role %q may not write table %s: %w", cfg.User, w.table, err))
	case pgerrcode.IsInvalidAuthorizationSpecification(pe.Code), pe.Code == pgerrcode.InvalidPassword:
		return pipeline.Fatal(fmt.Errorf("pgpipe: role %q cannot log in to database %q: %w", cfg.User, cfg.Database, err))
	case pe.Code == pgerrcode.InvalidCatalogName:
		return pipeline.Fatal(fmt.Errorf("pgpipe: database %q does not exist: %w", cfg.Database, err))
	}
	return pipeline.Fatal(fmt.Errorf("pgpipe: writing table %s: %w", w.table, err))
}

// isConnError reports whether err is a failure of the connection rather than of the
// statement: the server went away, refused the connection, or timed out.
func isConnError(err error) bool {
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return transientCodes[pe.Code] || pgerrcode.IsConnectionException(pe.Code)
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgx.ErrTxClosed) || strings.Contains(err.Error(), "conn closed") ||
		strings.Contains(err.Error(), "conn busy")
}
