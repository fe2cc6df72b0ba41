package pgpipe

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
)

// Option configures a [Writer] ([NewWriter]).
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type mode uint8

const (
	modeInsert mode = iota
	modeUpsert
	modeSkip
)

type config struct {
	mode     mode
	key      []string
	ck       *Checkpoint
	dl       any // func(context.Context, pipeline.DeadLetter[T]) error
	dlt      any // *DeadLetterTable[T]
	rows     int
	bytes    int
	attempts int
	backoff  pipeline.Backoff
}

// defaultConfig is a writer's configuration before its options: batches of 5,000 rows,
// 30 attempts with backoff from 20 ms to 2 s.
func defaultConfig() config {
	return config{rows: 5000, attempts: 30, backoff: pipeline.ExponentialBackoff(20*time.Millisecond, 2*time.Second)}
}

// WithUpsert makes the writer upsert on the key columns: each batch is copied into a
// temporary table in the same transaction, then moved with INSERT … SELECT … ON
// CONFLICT (key) DO UPDATE of every other column. Before that the batch is
// de-duplicated by key (the last row wins), so that PostgreSQL never meets a key twice
// in one statement, and sorted by key, so that writers running at once take their row
// locks in the same order and cannot deadlock each other. Rows whose key has a NULL (a
// nil pointer field, a nil []byte, a driver.Valuer whose value is nil, such as an invalid
// sql.NullString) are all kept: ON CONFLICT never matches a NULL, and inserts each.
// A batch with two rows that are one key to PostgreSQL but two to Go (a char(n) or
// citext column, a timestamp(p), a float4, one instant in two locations in a
// timestamptz; two NULLs under a unique index with NULLS NOT DISTINCT) fails the move
// ("cannot affect row a second time"): the writer then writes the batch again, as it
// came, and lets PostgreSQL keep the last row of each of its keys. (The
// de-duplication takes two times as one key only when both their instant and their
// wall clock are equal: a timestamptz keeps the one, a timestamp without time zone the
// other.) The key must be a unique index or constraint of the table. It panics if key
// is empty.
//
// Each key then holds the value of its last row in source order. With several workers,
// [Writer.To] keeps that order by giving each key to one worker: a lane chosen by a
// hash of the key's values as PostgreSQL takes them, by the key columns' types (read
// from the server once per writer, before the first batch is split). A time, to the
// microsecond (or rounded as a timestamp(p) rounds it), counts by its wall clock for a
// timestamp without time zone, by its day for a date, by its instant for a
// timestamptz; a string without its trailing spaces for a char(n) or a varchar(n)
// (which cuts those past n), without letter case for a citext (Unicode's case
// mappings, made coarse enough for a Turkish locale's); a float64 as it rounds to
// float32 for a float4; a driver.Valuer by its value. A column with a nondeterministic
// collation is left out of the hash: its rows spread over the lanes by the key's other
// columns alone, all in one lane for a key of that column alone. Values that
// PostgreSQL converts otherwise on the way in count as Go has them: a string for a
// column of another type (a uuid in upper and in lower case, a number with a leading
// zero), a number that numeric(p, s) rounds, an integer that float4 rounds. Two rows
// that are one key to PostgreSQL this way may land in two lanes, whose writers then
// write the key at once, in any order (the older row may win): give such key fields
// their column's Go type.
//
// A lane's parts of batches are written one after the other, retries included, and a
// checkpointed run records a batch only once every earlier batch is written, so a
// resumed run never writes an older row over a newer one (it may write a part's rows
// again, as they were: see the package's Exactly once). A batch part set aside by the sink's
// [pipeline.WithDeadLetter] does not hold its lane up: its keys keep what they held.
// [Writer.Sink] alone, with several workers, does not order batches: concurrent
// batches with the same key commit in any order.
func WithUpsert(key ...string) Option {
	if len(key) == 0 {
		panic("pgpipe: WithUpsert: no key columns")
	}
	return optionFunc(func(c *config) { c.mode, c.key = modeUpsert, key })
}

// WithSkipExisting is [WithUpsert] with ON CONFLICT (key) DO NOTHING: rows whose key is
// already in the table are left as they are (within a batch, the last row wins). It
// panics if key is empty.
func WithSkipExisting(key ...string) Option {
	if len(key) == 0 {
		panic("pgpipe: WithSkipExisting: no key columns")
	}
	return optionFunc(func(c *config) { c.mode, c.key = modeSkip, key })
}

// WithCheckpoint makes each batch's transaction also record the run's progress in
// store, the [pipeline.CheckpointStore] of the pipeline's [pipeline.FromCheckpoint] source: the
// rows of a batch and the advanced checkpoint commit together or not at all (see
// [pipeline.Commit]), the commit is fenced against a newer instance of the job
// ([ErrFenced]), and a commit whose outcome is unknown is settled by looking for the
// row its transaction wrote, once the transaction has ended. Writers committing at
// once do not wait for one another's transactions.
func WithCheckpoint(store *Checkpoint) Option {
	if store == nil {
		panic("pgpipe: WithCheckpoint(nil)")
	}
	return optionFunc(func(c *config) { c.ck = store })
}

// WithDeadLetter sends each row PostgreSQL rejects (see [RowError]) to fn once the
// batch's good rows are written and its deferred constraints checked, just before they
// commit. A batch written again because a deferred constraint refused a row (see the
// package's Errors) sends the letters of the write that commits alone; but a crash, or
// a COMMIT whose connection is lost, may send a row twice (at least once). The batch's
// transaction, not fn, records the rows' progress, so fn must not call
// [pipeline.Commit] (a [DeadLetterTable.WithCheckpoint]'s Add
// writes the letter alone here). T must be the writer's row type; [NewWriter] panics
// otherwise.
// Without a dead-letter destination, a rejected row fails its whole batch with an item
// error, which stops the run unless the sink stage has [pipeline.WithDeadLetter].
func WithDeadLetter[T any](fn func(ctx context.Context, dl pipeline.DeadLetter[T]) error) Option {
	if fn == nil {
		panic("pgpipe: WithDeadLetter(nil)")
	}
	return optionFunc(func(c *config) { c.dl = fn })
}

// WithDeadLetterTable writes the rows PostgreSQL rejects into t in the batch's own
// transaction, with the SQLSTATE, message and constraint: a row is dead-lettered
// exactly when the batch commits. T must be the writer's row type.
func WithDeadLetterTable[T any](t *DeadLetterTable[T]) Option {
	if t == nil {
		panic("pgpipe: WithDeadLetterTable(nil)")
	}
	return optionFunc(func(c *config) { c.dlt = t })
}

// WithChunk sets the size of the batches [Writer.To] makes: at most rows rows and, when
// bytes > 0, at most about bytes bytes of column values (the estimate costs one mapping
// of each row in the batching goroutine). The default is 5,000 rows and no byte
// bound. In the upsert modes with several workers, the batch written in one
// transaction is a lane's part of a larger batch (see [Writer.To]): at most rows rows,
// and bytes on average. It panics if rows < 1 or bytes < 0.
func WithChunk(rows, bytes int) Option {
	if rows < 1 || bytes < 0 {
		panic(fmt.Sprintf("pgpipe: WithChunk(%d, %d): need rows >= 1 and bytes >= 0", rows, bytes))
	}
	return optionFunc(func(c *config) { c.rows, c.bytes = rows, bytes })
}

// WithRetry sets how the sink retries a batch after a transient failure (a lost
// connection, a restarted server, a serialization failure or deadlock, too many
// connections, an attempt that ran past the sink's [pipeline.WithTimeout]): attempts
// in all, waiting backoff between them. The default is 30 attempts with exponential
// backoff from 20 ms to 2 s, which rides out a server restart of about a minute. It
// panics like [pipeline.WithRetry].
func WithRetry(attempts int, backoff pipeline.Backoff) Option {
	pipeline.WithRetry(attempts, backoff) // its checks
	return optionFunc(func(c *config) { c.attempts, c.backoff = attempts, backoff })
}

// Writer writes batches of T into one PostgreSQL table with COPY, on connections of a
// pgxpool. Make one with [NewWriter], then attach it with [Writer.To] or use
// [Writer.Sink] with [pipeline.ToBatches]. Each worker of the sink writes its batch on
// a connection of its own, in one transaction. A Writer is safe for concurrent use and
// may serve several pipelines.
type Writer[T any] struct {
	writerCore
	mapping Mapping[T]
	kinds   []reflect.Kind // the key's, when dedupe and lanes read it unboxed (keyKinds)
	dl      func(context.Context, pipeline.DeadLetter[T]) error
	dlt     *DeadLetterTable[T]
}

// writerCore is the part of a Writer that does not depend on T.
type writerCore struct {
	pool      *pgxpool.Pool
	table     string // as given
	ident     pgx.Identifier
	columns   []string
	keyIdx    []int
	cfg       config
	tmp       pgx.Identifier // upsert: the temporary table
	createTmp string
	moveSQL   string
	// moveDistinct moves as writeHow.distinct says (distinctKeys, distinctAll);
	// sameKeySQL reads the rows that share a key (see sameKey).
	moveDistinct [2]string
	sameKeySQL   string
	quotedCols   string
	oidc         oidCache
	keyMu        sync.Mutex
	keyT         []keyType // keyTypes', once read
	stats        stats
}

type stats struct{ batches, rows, dead, bisected, roundTrips atomic.Int64 }

// Stats are a [Writer]'s counts since it was made. In the upsert modes Rows counts a
// batch's rows after the de-duplication in Go; a batch written again as it came,
// because PostgreSQL took two of its keys as one, counts its rows as they came.
type Stats struct {
	Batches      int64 // batches committed
	Rows         int64 // rows committed (see above for the upsert modes)
	DeadLettered int64 // rows rejected and dead-lettered
	Bisected     int64 // batches that had to be bisected to find rejected rows
	RoundTrips   int64 // statements sent to the server (COPY, BEGIN, COMMIT, savepoints, ...)
}

// Stats returns the writer's counts. It is safe to call at any time.
func (w *Writer[T]) Stats() Stats {
	s := &w.stats
	return Stats{
		Batches: s.batches.Load(), Rows: s.rows.Load(), DeadLettered: s.dead.Load(),
		Bisected: s.bisected.Load(), RoundTrips: s.roundTrips.Load(),
	}
}

// NewWriter returns a writer of rows of T into table (a name, optionally qualified by
// its schema: "sales.orders"), mapped to columns by m. By default it inserts with plain
// COPY; see [WithUpsert], [WithSkipExisting], [WithCheckpoint], [WithDeadLetterTable].
//
// It panics with a "pgpipe:" message if pool is nil, table is empty, a key column is
// not mapped, or a typed option is for another row type.
func NewWriter[T any](pool *pgxpool.Pool, table string, m Mapping[T], opts ...Option) *Writer[T] {
	if pool == nil || table == "" || m.fill == nil {
		panic(fmt.Sprintf("pgpipe: NewWriter(%q): need a pool, a table and a Mapping", table))
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			panic(fmt.Sprintf("pgpipe: NewWriter(%q): nil Option", table))
		}
		o.apply(&cfg)
	}
	w := &Writer[T]{mapping: m}
	w.pool, w.table, w.columns, w.cfg = pool, table, m.columns, cfg
	w.quotedCols = quoteAll(m.columns)
	w.ident = pgx.Identifier(strings.Split(table, "."))
	for _, k := range cfg.key {
		i := slices.Index(m.columns, k)
		if i < 0 {
			panic(fmt.Sprintf("pgpipe: NewWriter(%q): key column %q is not mapped (columns: %v)", table, k, m.columns))
		}
		w.keyIdx = append(w.keyIdx, i)
	}
	w.kinds = keyKinds(m, w.keyIdx)
	var zero T
	if cfg.dl != nil {
		dl, ok := cfg.dl.(func(context.Context, pipeline.DeadLetter[T]) error)
		if !ok {
			panic(fmt.Sprintf("pgpipe: NewWriter(%q): WithDeadLetter for another row type (%T) on a writer of %T", table, cfg.dl, zero))
		}
		w.dl = dl
	}
	if cfg.dlt != nil {
		dlt, ok := cfg.dlt.(*DeadLetterTable[T])
		if !ok {
			panic(fmt.Sprintf("pgpipe: NewWriter(%q): WithDeadLetterTable for another row type (%T) on a writer of %T", table, cfg.dlt, zero))
		}
		w.dlt = dlt
	}
	if cfg.mode != modeInsert {
		w.prepareUpsert()
	}
	return w
}

func (w *writerCore) prepareUpsert() {
	cols := quoteAll(w.columns)
	keys := quoteAll(w.cfg.key)
	// A temporary table of the connection, named by a hash of the table and the columns:
	// writers of other tables ("s.t" and "s_t"), or of other columns of one table, that
	// meet on a connection each have theirs (named after the table alone, the second
	// found the first's, without its columns); names long enough to be cut at 63 bytes
	// no longer meet either.
	h := fnv.New64a()
	h.Write([]byte(w.table))
	for _, c := range w.columns {
		h.Write([]byte{0})
		h.Write([]byte(c))
	}
	w.tmp = pgx.Identifier{fmt.Sprintf("pgpipe_stage_%016x", h.Sum64())}
	w.createTmp = fmt.Sprintf("CREATE TEMP TABLE IF NOT EXISTS %s ON COMMIT DELETE ROWS AS SELECT %s FROM %s WITH NO DATA",
		w.tmp.Sanitize(), cols, w.ident.Sanitize())
	var set []string
	for _, c := range w.columns {
		if !slices.Contains(w.cfg.key, c) {
			q := pgx.Identifier{c}.Sanitize()
			set = append(set, q+" = EXCLUDED."+q)
		}
	}
	action := "DO NOTHING"
	if w.cfg.mode == modeUpsert && len(set) > 0 {
		action = "DO UPDATE SET " + strings.Join(set, ", ")
	}
	w.moveSQL = fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM %s ORDER BY %s ON CONFLICT (%s) %s",
		w.ident.Sanitize(), cols, cols, w.tmp.Sanitize(), keys, keys, action)
	// The last row of each key (the rows are copied in source order, and a COPY into
	// the emptied temporary table places them in that order): of each key with no NULL,
	// with every row whose key has one (ON CONFLICT never matches a NULL), or, for a
	// unique index with NULLS NOT DISTINCT, of every key (DISTINCT ON takes NULLs as
	// equal).
	nulls := make([]string, len(w.cfg.key))
	for i, k := range w.cfg.key {
		nulls[i] = pgx.Identifier{k}.Sanitize() + " IS NULL"
	}
	anyNull := strings.Join(nulls, " OR ")
	w.moveDistinct[0] = fmt.Sprintf("INSERT INTO %[1]s (%[2]s) SELECT %[2]s FROM ("+
		"SELECT DISTINCT ON (%[4]s) %[2]s FROM %[3]s WHERE NOT (%[5]s) ORDER BY %[4]s, ctid DESC) AS last "+
		"UNION ALL SELECT %[2]s FROM %[3]s WHERE %[5]s ORDER BY %[4]s ON CONFLICT (%[4]s) %[6]s",
		w.ident.Sanitize(), cols, w.tmp.Sanitize(), keys, anyNull, action)
	w.moveDistinct[1] = fmt.Sprintf("INSERT INTO %[1]s (%[2]s) SELECT %[2]s FROM ("+
		"SELECT DISTINCT ON (%[4]s) %[2]s FROM %[3]s ORDER BY %[4]s, ctid DESC) AS last ORDER BY %[4]s ON CONFLICT (%[4]s) %[5]s",
		w.ident.Sanitize(), cols, w.tmp.Sanitize(), keys, action)
	// Each row's index in the temporary table (in the order of the COPY), the first
	// index of its key and whether the key has a NULL, for the rows that share their key
	// (NULLs equal) with another.
	w.sameKeySQL = fmt.Sprintf("SELECT pgpipe_n, pgpipe_first, pgpipe_null FROM ("+
		"SELECT pgpipe_n, min(pgpipe_n) OVER pgpipe_key AS pgpipe_first, count(*) OVER pgpipe_key AS pgpipe_rows, %[3]s AS pgpipe_null "+
		"FROM (SELECT %[2]s, row_number() OVER (ORDER BY ctid) - 1 AS pgpipe_n FROM %[1]s) AS numbered "+
		"WINDOW pgpipe_key AS (PARTITION BY %[2]s)) AS keyed WHERE pgpipe_rows > 1",
		w.tmp.Sanitize(), keys, "("+anyNull+")")
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// Sink returns a sink stage of workers writers for batches of T, for
// [pipeline.ToBatches] or [pipeline.Batch]: each batch is written in one transaction
// on a pool connection of its own. The stage retries transient failures (see
// [WithRetry]); opts are given to [pipeline.NewSink] after that, so a
// [pipeline.WithRetry] there replaces it. Rejected rows go to the writer's dead-letter
// destination; the stage's own [pipeline.WithDeadLetter] receives whole batches that
// failed otherwise. Size the pool for at least workers connections. In the upsert
// modes with several workers, batches given to Sink directly commit in any order, so a
// key's older row may win; [Writer.To] keeps source order per key.
func (w *Writer[T]) Sink(name string, workers int, opts ...pipeline.StageOption) *pipeline.Stage[[]T, struct{}] {
	all := append([]pipeline.StageOption{pipeline.WithRetry(w.cfg.attempts, w.cfg.backoff)}, opts...)
	return pipeline.NewSink(name, workers, func(ctx context.Context, batch []T) error {
		return w.write(ctx, name, batch)
	}, all...)
}

// To ends s in the writer: batches of [WithChunk]'s size, written by a [Writer.Sink]
// stage of the given name and workers.
//
// In the upsert modes with more than one worker, the rows are batched workers times
// [WithChunk]'s rows (and bytes) at a time, and each batch is split by a hash of the
// key into parts of at most the chunk's rows, for one lane per worker (see
// [WithUpsert]); the sink stage gets [pipeline.WithPartition] on the lane, which it may
// not be given [pipeline.WithOrdered] or [pipeline.WithKey] with: every key's rows are
// written by one worker, in source order (the order of s), and each lane has a worker
// of its own. A part's bytes are about the chunk's bytes on
// average, not at most. The split runs in a stage of its own, named name+"/lanes" (one
// worker, a queue of one batch, the writer's retries), which reads the key columns'
// types from the server before it splits the first batch: a failure to read them is
// classified as a write's (a missing table is fatal). That stage is a row of the run's
// report, between the Batch row and the sink's: its items are the batches before the
// split (Retried counts the types' reads tried again), and the sink's row counts the
// parts. Its name is taken like any stage's: a pipeline with another stage (or named
// source, filter, batch or end) of that name panics, when the second of the two is
// attached, as for any name used twice.
func (w *Writer[T]) To(s *pipeline.Stream[T], name string, workers int, opts ...pipeline.StageOption) {
	var bopts []pipeline.BatchOption
	if w.cfg.bytes > 0 {
		bopts = append(bopts, pipeline.WithMaxBytes(w.cfg.bytes, w.size))
	}
	if w.cfg.mode == modeInsert || workers <= 1 {
		pipeline.ToBatches(s, w.cfg.rows, w.Sink(name, workers, opts...), bopts...)
		return
	}
	l := newLanes(w, workers)
	if w.cfg.bytes > 0 {
		bopts = []pipeline.BatchOption{pipeline.WithMaxBytes(w.cfg.bytes*workers, w.size)}
	}
	// A stage, not a Map: the split needs the key columns' types, read from the server.
	// Its queue holds one batch: the sink's holds the parts.
	split := pipeline.NewStage(name+"/lanes", 1, l.splitOn,
		pipeline.WithRetry(w.cfg.attempts, w.cfg.backoff), pipeline.WithBuffer(1))
	parts := pipeline.Flatten(pipeline.Then(pipeline.Batch(s, w.cfg.rows*workers, bopts...), split))
	keyed := append(slices.Clip(opts), pipeline.WithPartition(l.lane)) // lane i is worker i's: WithKey's hash put two lanes on one worker more often than not
	pipeline.To(parts, w.Sink(name, workers, keyed...))
}

// size estimates the bytes of v's values.
func (w *Writer[T]) size(v T) int {
	n := 0
	for _, x := range w.mapping.fill(&v, make([]any, 0, len(w.columns))) {
		n += valueSize(x)
	}
	return n
}

// settleEmpty settles an empty batch (an upsert lane's empty part, see lanes.go): with a
// checkpoint, the progress it makes (its batch's positions, when it is the last part)
// is saved before it settles, as a batch's transaction would record it, so that a crash
// never has a resumed run redo a batch whose later neighbours were committed.
func (w *Writer[T]) settleEmpty(ctx context.Context) error {
	ck := w.cfg.ck
	if ck == nil {
		return nil
	}
	return pipeline.Commit(ctx, func(ctx context.Context, p pipeline.Progress) error {
		if !p.Checkpointed {
			return nil
		}
		w.stats.roundTrips.Add(1)
		return w.classify(ctx, ck.SaveCommitted(ctx, p.Watermark, p.Committed))
	})
}

// badRow is a row PostgreSQL rejected.
type badRow[T any] struct {
	v   T
	at  int // its index in the rows written
	err *RowError
}

// write writes one batch in one transaction (or, for a plain insert without
// checkpoint, one COPY); the error it returns is classified for the pipeline.
func (w *Writer[T]) write(ctx context.Context, stage string, batch []T) error {
	if len(batch) == 0 {
		return w.settleEmpty(ctx)
	}
	return w.writeWith(ctx, stage, batch, nil)
}

// writeWith writes batch (de-duplicated in the upsert modes) in one transaction, with
// hook's extensions if not nil; the error it returns is classified for the pipeline.
func (w *Writer[T]) writeWith(ctx context.Context, stage string, batch []T, hook *BatchTx) error {
	rows := batch
	if w.cfg.mode != modeInsert {
		rows = w.dedupe(batch)
	}
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		return w.classify(ctx, err)
	}
	defer conn.Release()
	var how writeHow
	for {
		err = w.writeOn(ctx, conn.Conn(), stage, rows, hook, how)
		_, refused := errors.AsType[*commitRefused](err)
		pe, isPg := errors.AsType[*pgconn.PgError](err)
		switch {
		case refused && rowError(err) != nil && !how.immediate:
			// A deferred constraint (DEFERRABLE INITIALLY DEFERRED) is checked at COMMIT,
			// after every savepoint of a bisection passed: write the batch again with
			// every constraint checked at its statement, so that the bisection finds the
			// row.
			how.immediate = true
		case isPg && pe.Code == pgerrcode.CardinalityViolation && w.cfg.mode == modeUpsert && how.distinct < distinctAll:
			// Two rows whose keys differ in Go are one key to PostgreSQL (a citext or
			// char(n) column, a timestamp without time zone, a float4; then, a unique
			// index with NULLS NOT DISTINCT), and ON CONFLICT DO UPDATE cannot take both
			// in one statement: let PostgreSQL keep the last of each of its keys.
			how.distinct, rows = how.distinct+1, batch
		default:
			return w.classify(ctx, err)
		}
	}
}

// writeHow is how writeOn writes a batch, after a first attempt failed.
type writeHow struct {
	// immediate checks every deferrable constraint at its statement (SET CONSTRAINTS
	// ALL IMMEDIATE).
	immediate bool
	// distinct, if not 0, moves the rows of the temporary table, copied in source
	// order (the batch as it came, not de-duplicated in Go), with the last row of
	// each key as PostgreSQL compares them: of the keys with no NULL (distinctKeys),
	// or of every key (distinctAll).
	distinct int
}

const (
	distinctKeys = 1 // moveDistinct[0]
	distinctAll  = 2 // moveDistinct[1]
)

// commitRefused is the error of a COMMIT that the server refused (a deferred
// constraint failed, say): the transaction rolled back. Its message is err's.
type commitRefused struct{ err error }

func (e *commitRefused) Error() string { return e.err.Error() }
func (e *commitRefused) Unwrap() error { return e.err }

// writeOn writes rows in one transaction on conn (or one COPY), as how says.
func (w *Writer[T]) writeOn(ctx context.Context, conn *pgx.Conn, stage string, rows []T, hook *BatchTx, how writeHow) error {
	var rejected error // the whole batch's row error, when it had one
	if w.cfg.mode == modeInsert && w.cfg.ck == nil && hook == nil && !how.immediate {
		// One COPY is atomic: no transaction needed unless rows must be isolated.
		err := w.copyRows(ctx, conn, w.ident, rows)
		if err == nil {
			w.stats.batches.Add(1)
			w.stats.rows.Add(int64(len(rows)))
			return nil
		}
		if rowError(err) == nil {
			return err
		}
		rejected = err
	}
	tx, err := w.begin(ctx, conn, how.immediate)
	if err != nil {
		return err
	}
	defer func() { // a no-op after Commit
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	// Hints try a row before the rows ahead of it: in source order, as distinct
	// writes, a row of a key would then be written over by an earlier one.
	b := &bisection[T]{hints: how.distinct == 0, distinct: how.distinct}
	if rejected == nil && len(rows) > 0 {
		err = w.load(ctx, tx, rows, b.distinct)
		if err != nil && rowError(err) == nil {
			return err
		}
		if err != nil { // the transaction is aborted: start again, isolating the bad rows
			rejected = err
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			w.stats.roundTrips.Add(1)
			if tx, err = w.begin(ctx, conn, how.immediate); err != nil {
				return err
			}
		}
	}
	if rejected != nil {
		w.stats.bisected.Add(1)
		if err := w.bisect(ctx, tx, rows, 0, false, rejected, b); err != nil {
			return err
		}
		if err := w.retake(ctx, tx, rows, b); err != nil {
			return err
		}
		if err := w.deadLetter(ctx, tx, stage, b.bad); err != nil {
			return err
		}
	}
	if hook != nil && hook.BeforeCommit != nil {
		if err := hook.BeforeCommit(ctx, tx); err != nil {
			return err
		}
	}
	if err := w.sendDeadLetters(ctx, tx, stage, b.bad); err != nil {
		return err
	}
	if hook != nil {
		if err := w.commitWith(ctx, tx, hook); err != nil {
			return err
		}
	} else if err := w.commit(ctx, tx); err != nil {
		return err
	}
	w.stats.batches.Add(1)
	w.stats.rows.Add(int64(len(rows) - len(b.bad)))
	w.stats.dead.Add(int64(len(b.bad)))
	for _, r := range b.bad { // committed: the run's report counts them in the sink's row
		pipeline.SetAside(ctx, r.err)
	}
	return nil
}

// begin starts a batch's transaction; in the upsert modes it also makes sure the
// connection has the temporary table. immediate checks every deferrable constraint at
// its statement.
func (w *Writer[T]) begin(ctx context.Context, conn *pgx.Conn, immediate bool) (pgx.Tx, error) {
	tx, err := conn.Begin(ctx)
	w.stats.roundTrips.Add(1)
	var sql []string
	if immediate {
		sql = append(sql, "SET CONSTRAINTS ALL IMMEDIATE")
	}
	if w.cfg.mode != modeInsert {
		sql = append(sql, w.createTmp)
	}
	if err != nil || len(sql) == 0 {
		return tx, err
	}
	if err := w.exec(ctx, tx, strings.Join(sql, "; ")); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// load writes rows in tx: a COPY into the table, or into the temporary table and on
// (as writeHow.distinct says).
func (w *Writer[T]) load(ctx context.Context, tx pgx.Tx, rows []T, distinct int) error {
	if w.cfg.mode == modeInsert {
		return w.copyRows(ctx, tx.Conn(), w.ident, rows)
	}
	if err := w.copyRows(ctx, tx.Conn(), w.tmp, rows); err != nil {
		return err
	}
	if distinct > 0 {
		return w.exec(ctx, tx, w.moveDistinct[distinct-1])
	}
	return w.exec(ctx, tx, w.moveSQL)
}

// bisection is the state of one batch's search for its rejected rows.
type bisection[T any] struct {
	bad      []badRow[T]
	hints    bool // the errors' row hints have not misled yet
	distinct int  // writeHow.distinct
}

// bisect writes rows in savepoints and isolates the rows PostgreSQL rejects, in
// O(k·log n) round trips for k bad rows of n; at is rows[0]'s index in the rows
// written (badRow.at). failed tells that rows are known to hold
// a bad row (their sibling was clean and their parent failed), so trying them whole
// would only fail again; rejected, when not nil, is the row error rows failed with
// already (the whole batch's), which saves trying them again.
//
// When the error names its row (a COPY's "line N" context, or a value the writer could
// not encode), that row is tried alone first, which makes the search O(k); a hint that
// proves wrong (the row goes in alone) turns hints off for the rest of the batch.
func (w *Writer[T]) bisect(ctx context.Context, tx pgx.Tx, rows []T, at int, failed bool, rejected error, b *bisection[T]) error {
	if rejected == nil && (!failed || len(rows) == 1) {
		if err := w.exec(ctx, tx, "SAVEPOINT pgpipe"); err != nil {
			return err
		}
		err := w.load(ctx, tx, rows, b.distinct)
		if err == nil {
			done := "RELEASE SAVEPOINT pgpipe"
			if w.cfg.mode != modeInsert {
				done = "TRUNCATE " + w.tmp.Sanitize() + "; " + done
			}
			return w.exec(ctx, tx, done)
		}
		if rowError(err) == nil {
			return err
		}
		if err := w.exec(ctx, tx, "ROLLBACK TO SAVEPOINT pgpipe; RELEASE SAVEPOINT pgpipe"); err != nil {
			return err
		}
		rejected = err
	}
	if rejected != nil && len(rows) == 1 {
		b.bad = append(b.bad, badRow[T]{rows[0], at, rowError(rejected)})
		return nil
	}
	if i := rowHint(rejected); rejected != nil && b.hints && i >= 0 && i < len(rows) {
		n := len(b.bad)
		if err := w.bisect(ctx, tx, rows[i:i+1], at+i, false, nil, b); err != nil {
			return err
		}
		if len(b.bad) == n {
			b.hints = false // it went in: the hint misled
		}
		if err := w.bisect(ctx, tx, rows[:i], at, false, nil, b); err != nil {
			return err
		}
		return w.bisect(ctx, tx, rows[i+1:], at+i+1, false, nil, b)
	}
	mid := len(rows) / 2
	n := len(b.bad)
	if err := w.bisect(ctx, tx, rows[:mid], at, false, nil, b); err != nil {
		return err
	}
	return w.bisect(ctx, tx, rows[mid:], at+mid, len(b.bad) == n, nil, b)
}

// retake tries each row that the bisection rejected for a foreign key (23503) again,
// alone: one that refers to a row of its own batch (a foreign key to its own table, or
// to a table that a trigger fills) is rejected when the bisection tries it before that
// row went in. Passes repeat while one lets a row in.
//
// In a distinct write, rows (the batch as it came) may hold several rows of one key,
// which the bisection wrote in source order, so that the key's last good row won: a row
// taken again must not be written over a later row of its key. So the rows PostgreSQL
// takes as one key are read first (sameKey), and a row with a later row of its key that
// went in is not taken again but folded, as the distinct move folds it when the batch
// goes in whole: its key's last row is the one written. Whether a key with a NULL is
// one key depends on the unique index (NULLS NOT DISTINCT), which distinctKeys does not
// know: such a row with a later row of its key stays rejected (a dead letter loses
// nothing; taken again, it could be written over the later row, and folded, lost).
func (w *Writer[T]) retake(ctx context.Context, tx pgx.Tx, rows []T, b *bisection[T]) error {
	if !slices.ContainsFunc(b.bad, func(r badRow[T]) bool { return r.err.Code == pgerrcode.ForeignKeyViolation }) {
		return nil
	}
	var keys sameKeys    // distinct: the rows that share a key
	var bad map[int]bool // distinct: the rows rejected now, by index
	if b.distinct > 0 {
		slices.SortFunc(b.bad, func(x, y badRow[T]) int { return x.at - y.at }) // source order
		bad = make(map[int]bool, len(b.bad))
		for _, r := range b.bad {
			bad[r.at] = true
		}
		// The rows that went in and those taken again: a row rejected otherwise is
		// neither taken again nor a later row that went in (and may be one the COPY
		// itself rejects).
		var at []int
		for i := range rows {
			if !bad[i] {
				at = append(at, i)
			}
		}
		for _, r := range b.bad {
			if r.err.Code == pgerrcode.ForeignKeyViolation {
				at = append(at, r.at)
			}
		}
		slices.Sort(at)
		var err error
		if keys, err = w.sameKey(ctx, tx, rows, at); err != nil {
			return err
		}
	}
	// superseded reports whether a later row of r's key went in (or was folded).
	superseded := func(r badRow[T]) bool {
		k, ok := keys[r.at]
		if !ok {
			return false
		}
		for j := r.at + 1; j < len(rows); j++ {
			if l, ok := keys[j]; ok && l.first == k.first && !bad[j] {
				return true
			}
		}
		return false
	}
	for {
		kept, took := b.bad[:0:0], false
		for _, r := range b.bad {
			if r.err.Code != pgerrcode.ForeignKeyViolation {
				kept = append(kept, r)
				continue
			}
			if superseded(r) {
				if b.distinct == distinctKeys && keys[r.at].null {
					kept = append(kept, r)
				} else {
					delete(bad, r.at) // folded
					took = true
				}
				continue
			}
			one := &bisection[T]{distinct: b.distinct}
			if err := w.bisect(ctx, tx, []T{r.v}, r.at, false, nil, one); err != nil {
				return err
			}
			if len(one.bad) == 0 {
				delete(bad, r.at)
				took = true
			}
			kept = append(kept, one.bad...) // with its latest error
		}
		b.bad = kept
		if !took {
			return nil
		}
	}
}

// sameKeys gives the rows of a batch that share their key with another row, by index
// in the batch.
type sameKeys map[int]keyOf

// keyOf is a row's key in sameKeys: the index of the key's first row, and whether the
// key has a NULL.
type keyOf struct {
	first int
	null  bool
}

// sameKey returns which of the rows at (indexes of rows, in order) PostgreSQL takes as
// one key, as the distinct move with distinctAll compares them (a NULL equal to a
// NULL). It copies them into the temporary table in a savepoint that it rolls back.
func (w *Writer[T]) sameKey(ctx context.Context, tx pgx.Tx, rows []T, at []int) (sameKeys, error) {
	// A truncated table takes the rows in the order of the COPY: ctid orders them.
	if err := w.exec(ctx, tx, "SAVEPOINT pgpipe; TRUNCATE "+w.tmp.Sanitize()); err != nil {
		return nil, err
	}
	some := make([]T, len(at))
	for i, j := range at {
		some[i] = rows[j]
	}
	if err := w.copyRows(ctx, tx.Conn(), w.tmp, some); err != nil {
		return nil, err
	}
	w.stats.roundTrips.Add(1)
	res, err := tx.Query(ctx, w.sameKeySQL)
	if err != nil {
		return nil, err
	}
	keys := sameKeys{}
	var n, first int64
	var null bool
	_, err = pgx.ForEachRow(res, []any{&n, &first, &null}, func() error {
		if n < 0 || n >= int64(len(at)) || first < 0 || first >= int64(len(at)) {
			return fmt.Errorf("pgpipe: row %d (first %d) of %d in the temporary table", n, first, len(at))
		}
		keys[at[n]] = keyOf{at[first], null}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return keys, w.exec(ctx, tx, "ROLLBACK TO SAVEPOINT pgpipe; RELEASE SAVEPOINT pgpipe")
}

// rowHint returns the index of the row err names, or -1.
func rowHint(err error) int {
	if err == nil {
		return -1
	}
	if ee, ok := errors.AsType[*encodeError](err); ok {
		return ee.index
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return copyLine(pe.Where)
	}
	return -1
}

// deadLetter writes the rejected rows into the writer's DeadLetterTable, in tx. Without
// a dead-letter destination, the first rejection fails the batch. A WithDeadLetter
// function gets them from sendDeadLetters.
func (w *Writer[T]) deadLetter(ctx context.Context, tx pgx.Tx, stage string, bad []badRow[T]) error {
	if len(bad) == 0 {
		return nil
	}
	if w.dlt == nil && w.dl == nil {
		return pipeline.Permanent(bad[0].err)
	}
	if w.dlt == nil {
		return nil
	}
	errs := make([]*RowError, len(bad))
	for i, b := range bad {
		errs[i] = b.err
	}
	w.stats.roundTrips.Add(1)
	return w.dlt.insert(ctx, tx, letters(stage, bad), errs)
}

// sendDeadLetters sends the rejected rows to the writer's WithDeadLetter function (when
// it has no DeadLetterTable), as the last step before tx's COMMIT. The letters leave the
// transaction, so they go only once it can commit: first every deferred constraint is
// checked, as COMMIT would check it (SET CONSTRAINTS ALL IMMEDIATE checks what is
// pending). A refusal rolls the transaction back as a refused COMMIT, unsent, and
// writeWith writes the batch again, whose write sends the letters of the rows it
// rejects: a letter sent before a COMMIT that a deferred constraint then refused was
// sent again by that write, and a row its transaction had rejected was dead-lettered
// though the batch was not written that way.
func (w *Writer[T]) sendDeadLetters(ctx context.Context, tx pgx.Tx, stage string, bad []badRow[T]) error {
	if len(bad) == 0 || w.dl == nil || w.dlt != nil {
		return nil
	}
	if err := w.exec(ctx, tx, "SET CONSTRAINTS ALL IMMEDIATE"); err != nil {
		if rowError(err) != nil {
			return &commitRefused{err}
		}
		return err
	}
	dctx := context.WithValue(ctx, inBatchKey{}, true) // the batch commits the progress
	for _, r := range letters(stage, bad) {
		if err := w.dl(dctx, r); err != nil {
			return pipeline.Fatal(fmt.Errorf("pgpipe: dead-letter destination: %w", err))
		}
	}
	return nil
}

// letters returns the dead letters of the rejected rows of a batch of stage.
func letters[T any](stage string, bad []badRow[T]) []pipeline.DeadLetter[T] {
	recs := make([]pipeline.DeadLetter[T], len(bad))
	now := time.Now()
	for i, b := range bad {
		msg := b.err.Error()
		recs[i] = pipeline.DeadLetter[T]{
			Stage: stage, Item: b.v, Attempts: 1, Class: pipeline.ClassItem, ErrType: "*pgpipe.RowError",
			FirstError: msg, LastError: msg, Time: now,
		}
	}
	return recs
}

// commit commits tx, with the run's progress when the writer has a checkpoint.
func (w *Writer[T]) commit(ctx context.Context, tx pgx.Tx) error {
	ck := w.cfg.ck
	if ck == nil {
		w.stats.roundTrips.Add(1)
		if err := tx.Commit(ctx); err != nil {
			if pe, ok := errors.AsType[*pgconn.PgError](err); ok && endsSession(pe) || !ok && isConnError(err) {
				return pipeline.Transient(fmt.Errorf("%w: %w", ErrCommitUnknown, err))
			}
			return &commitRefused{err}
		}
		return nil
	}
	return pipeline.Commit(ctx, func(ctx context.Context, p pipeline.Progress) error {
		w.stats.roundTrips.Add(2)
		return ck.commit(ctx, tx, p, w.cfg)
	})
}

// copyRows copies rows into table on conn, in COPY's binary format (see copy.go).
func (w *Writer[T]) copyRows(ctx context.Context, conn *pgx.Conn, table pgx.Identifier, rows []T) error {
	oids, err := w.columnOIDs(ctx, conn, w.ident) // the temporary table has the same types
	if err != nil {
		return err
	}
	r := &copyReader[T]{
		rows: rows, cols: w.columns, fill: w.mapping.fill, m: conn.TypeMap(), oids: oids,
		plans: make([]columnPlan, len(oids)), vals: make([]any, 0, len(oids)),
		buf: make([]byte, 0, 64<<10),
	}
	if m := w.mapping; m.fields != nil {
		t := reflect.TypeFor[T]()
		if m.ptr {
			t = t.Elem()
		}
		r.fields, r.ptr, r.direct = m.fields, m.ptr, directEncoders(t, m.fields, oids)
	}
	w.stats.roundTrips.Add(1)
	_, err = conn.PgConn().CopyFrom(ctx, r, "COPY "+table.Sanitize()+" ("+w.quotedCols+") FROM STDIN BINARY")
	if err == nil || r.err == nil {
		return err
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok && !strings.HasPrefix(pe.Message, copyFailed) {
		return err // the server rejected an earlier row before the reader failed
	}
	if _, ok := errors.AsType[*encodeError](r.err); ok {
		return r.err
	}
	return pipeline.Fatal(r.err) // the mapping's own failure, not a row's
}

// exec runs sql (one or more statements without arguments) in tx.
func (w *writerCore) exec(ctx context.Context, tx pgx.Tx, sql string) error {
	w.stats.roundTrips.Add(1)
	_, err := tx.Conn().PgConn().Exec(ctx, sql).ReadAll()
	return err
}
