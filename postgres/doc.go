// Package pgpipe writes the batches of a [pipeline] into PostgreSQL, with pgx v5 and
// pgxpool, and owns the failures that live there: a lost connection mid-COPY, a COMMIT
// whose outcome is unknown, one bad row among thousands, two instances of one job.
//
// A [Writer] maps each item to a row ([Struct] or [Func]) and writes each batch with
// COPY, on a pool connection of its own per sink worker:
//
//	w := pgpipe.NewWriter(pool, "events", pgpipe.Struct[Event]())
//	w.To(events, "load", 4) // batches of 5,000 rows, four writers
//
// # Modes
//
// By default a batch is a plain COPY into the table. [WithUpsert] and
// [WithSkipExisting] copy it into a temporary table in the same transaction and move it
// with INSERT … SELECT … ON CONFLICT, after de-duplicating the batch by key (the last
// row wins) and sorting it by key, so that concurrent writers cannot deadlock. With
// several writers, [Writer.To] gives each key to one writer (a lane, by a hash of the
// key as its columns' types take it) so that each key holds its last row in source
// order, across retries and resumes.
//
// # Errors
//
// Errors are mapped onto the pipeline's classes. A lost connection, a server shutting
// down or restarting, too many connections, a serialization failure, a deadlock or a
// lock timeout are transient: the batch is retried with backoff on a fresh connection
// ([WithRetry]). So is an attempt that ran past the sink's [pipeline.WithTimeout] (it
// waited for a lock, for a slow server): nothing of it committed, or its COMMIT's
// outcome was learnt (see Exactly once). Data errors (SQLSTATE class 22) and constraint violations (class 23)
// belong to rows: the writer bisects the batch inside its transaction with savepoints,
// commits the good rows and dead-letters only the rejected ones ([WithDeadLetterTable],
// [WithDeadLetter]) with PostgreSQL's message, code and constraint, in O(k·log n) round
// trips for k bad rows of n. A constraint checked at COMMIT (DEFERRABLE INITIALLY
// DEFERRED) makes the writer write the batch again with every constraint checked at its
// statement (SET CONSTRAINTS ALL IMMEDIATE), so that the bisection finds the row; a
// row rejected for a foreign key is tried again once the others are in, so that one
// that refers to a later row of its batch is not rejected for the order (in an upsert,
// unless a later row of its key went in: that row wins). A missing
// table or column, a missing privilege, a failed login or an unknown database are
// fatal, with a message that names the table, the role or the database; so is a letter
// that the [DeadLetterTable] itself refuses (a constraint of its own).
//
// # Exactly once
//
// With a [Checkpoint] given both to [pipeline.FromCheckpoint] and to the writer
// ([WithCheckpoint]), each batch's transaction also records the run's progress (see
// [pipeline.Commit]): rows are never committed without their progress, nor progress
// without its rows, so a resumed run neither loses nor repeats a row, even in insert
// mode, even when four writers commit out of order. One exception: [Writer.To] with
// [WithUpsert] (or [WithSkipExisting]) and more than one worker splits each batch into
// a part per lane, and the batch's progress commits with its last part; a crash after
// an earlier part committed makes the resumed run upsert that part's rows again, with
// the values they had (no row lost, none older over a newer one, but a row trigger
// sees the update). Write with one worker where each row must be written once. The writers' transactions do not
// wait for one another: each records the progress in rows of its own. Loading the
// checkpoint takes the job over; the previous instance's next commit fails with
// [ErrFenced]. A COMMIT whose connection was lost (or whose attempt timed out) is
// settled by looking for the row its transaction wrote, never by guessing, and only once
// the transaction has ended (both read in one snapshot; PostgreSQL 13 or later), so a
// transaction still in progress on the
// server (a COMMIT waiting for a synchronous standby, a backend that has not yet seen
// its client go) is not read as "not committed". If it has not ended within a minute,
// the commit fails with [ErrCommitUnknown], fatal, and the next run's Load learns the
// outcome.
// Dead letters written to a [DeadLetterTable] commit with their batch; other
// destinations are at least once. A sink that records a progress of its own (the
// consumed Kafka offsets of the kafka module's kafkapg package) writes each batch with
// [Writer.Write], whose [BatchTx] runs its statements in the batch's transaction and
// settles a COMMIT of unknown outcome its own way.
package pgpipe
