package kafkapg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
)

// Table is the table of the stored offsets, found on the search path.
const Table = "kafkapg_offsets"

const createSQL = `CREATE TABLE IF NOT EXISTS ` + Table + ` (
	job         text        NOT NULL,
	topic       text        NOT NULL,
	partition   integer     NOT NULL,
	epoch       bigint      NOT NULL,
	next_offset bigint      NOT NULL,
	commit_id   bigint      NOT NULL DEFAULT 0,
	updated_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (job, topic, partition)
)`

const (
	claimSQL = `INSERT INTO ` + Table + ` AS o (job, topic, partition, epoch, next_offset) VALUES ($1, $2, $3, 1, -1)
		ON CONFLICT (job, topic, partition) DO UPDATE SET epoch = o.epoch + 1, updated_at = now()
		RETURNING epoch, next_offset`
	saveSQL = `UPDATE ` + Table + ` SET next_offset = GREATEST(next_offset, $5), updated_at = now()
		WHERE job = $1 AND topic = $2 AND partition = $3 AND epoch = $4`
	// commitSQL stores a batch's offsets in one statement: it locks the rows whose
	// epoch is still the one given in the order of the key (as a claim does, so that
	// the two cannot deadlock: an UPDATE joined to unnest locks in the plan's order),
	// then moves their offsets, and returns the partitions it stored.
	commitSQL = `WITH u AS (
			SELECT * FROM unnest($2::text[], $3::integer[], $4::bigint[], $5::bigint[]) AS u(topic, partition, epoch, next)
		), l AS (
			SELECT o.topic, o.partition, u.next FROM ` + Table + ` o JOIN u ON o.topic = u.topic AND o.partition = u.partition
			WHERE o.job = $1 AND o.epoch = u.epoch ORDER BY o.topic, o.partition FOR UPDATE OF o
		)
		UPDATE ` + Table + ` o SET next_offset = GREATEST(o.next_offset, l.next), commit_id = $6, updated_at = now()
		FROM l WHERE o.job = $1 AND o.topic = l.topic AND o.partition = l.partition
		RETURNING o.topic, o.partition`
)

// Offsets is a [kafka.OffsetStore] in PostgreSQL: the consumed offsets of one consumer
// group's partitions, under a name of its own (the group's, usually; a group renamed
// keeps its offsets under the old name), in the table kafkapg_offsets. Give it to
// [kafka.WithOffsetStore] and write with [NewSink]. It is safe for concurrent use.
type Offsets struct {
	pool *pgxpool.Pool
	job  string

	mu     sync.Mutex
	schema bool // the table is known to exist
}

// NewOffsets returns the store named job (the consumer group's name, usually) in the
// database of pool. It panics if pool is nil or job is empty.
func NewOffsets(pool *pgxpool.Pool, job string) *Offsets {
	if pool == nil || job == "" {
		panic(fmt.Sprintf("kafkapg: NewOffsets(%q): need a pool and a name", job))
	}
	return &Offsets{pool: pool, job: job}
}

// Claim implements [kafka.OffsetStore]: in one transaction, it bumps the epoch of each
// partition (inserting its row, with no offset, if missing) and returns the new epochs
// and the stored offsets. The rows are locked in the order given (sorted), so claims
// and transactions that store offsets do not deadlock one another.
func (o *Offsets) Claim(ctx context.Context, partitions []kafka.TopicPartition) ([]kafka.Claim, error) {
	if err := o.ensureTable(ctx); err != nil {
		return nil, err
	}
	claims := make([]kafka.Claim, len(partitions))
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, tp := range partitions {
			b.Queue(claimSQL, o.job, tp.Topic, tp.Partition)
		}
		br := tx.SendBatch(ctx, b)
		for i, tp := range partitions {
			claims[i].TopicPartition = tp
			if err := br.QueryRow().Scan(&claims[i].Epoch, &claims[i].Next); err != nil {
				return errors.Join(err, br.Close())
			}
		}
		return br.Close()
	})
	if err != nil {
		return nil, classify(fmt.Errorf("kafkapg: claim partitions of %q: %w", o.job, err))
	}
	return claims, nil
}

// Save implements [kafka.OffsetStore]: it moves each partition's offset forward to the
// one given where the epoch is still the one given, and returns the others.
func (o *Offsets) Save(ctx context.Context, offsets []kafka.StoreOffset) ([]kafka.TopicPartition, error) {
	b := &pgx.Batch{}
	for _, so := range offsets {
		b.Queue(saveSQL, o.job, so.Topic, so.Partition, so.Epoch, so.Next)
	}
	fenced, err := fencedBy(o.pool.SendBatch(ctx, b), offsets)
	if err != nil {
		return nil, classify(fmt.Errorf("kafkapg: save offsets of %q: %w", o.job, err))
	}
	return fenced, nil
}

// Stored returns the next offset stored for each partition that has one.
func (o *Offsets) Stored(ctx context.Context) (map[kafka.TopicPartition]int64, error) {
	rows, err := o.pool.Query(ctx, `SELECT topic, partition, next_offset FROM `+Table+` WHERE job = $1 AND next_offset >= 0`, o.job)
	if err != nil {
		return nil, fmt.Errorf("kafkapg: read offsets of %q: %w", o.job, err)
	}
	m := map[kafka.TopicPartition]int64{}
	var (
		tp   kafka.TopicPartition
		next int64
	)
	_, err = pgx.ForEachRow(rows, []any{&tp.Topic, &tp.Partition, &next}, func() error {
		m[tp] = next
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kafkapg: read offsets of %q: %w", o.job, err)
	}
	return m, nil
}

// commit stores offsets in tx (a batch's transaction), marked with id, and returns the
// partitions whose epoch was not the one given.
//
// It first bounds how long the session may sit idle in the transaction from there
// (idleLimit): the rows it updates are the ones a claim locks, and a member paused
// between these UPDATEs and its COMMIT (a SIGSTOP, a VM paused) would otherwise hold
// up the claims of its partitions for as long as its connection lives.
func (o *Offsets) commit(ctx context.Context, tx pgx.Tx, offsets []kafka.StoreOffset, id int64) ([]kafka.TopicPartition, error) {
	topics, parts := make([]string, len(offsets)), make([]int32, len(offsets))
	epochs, nexts := make([]int64, len(offsets)), make([]int64, len(offsets))
	for i, so := range offsets {
		topics[i], parts[i], epochs[i], nexts[i] = so.Topic, so.Partition, so.Epoch, so.Next
	}
	b := &pgx.Batch{}
	b.Queue(`SET LOCAL idle_in_transaction_session_timeout = '` + idleLimit + `'`)
	b.Queue(commitSQL, o.job, topics, parts, epochs, nexts, id)
	br := tx.SendBatch(ctx, b) // one round trip
	if _, err := br.Exec(); err != nil {
		return nil, errors.Join(err, br.Close())
	}
	rows, err := br.Query()
	if err != nil {
		return nil, errors.Join(err, br.Close())
	}
	stored := make(map[kafka.TopicPartition]bool, len(offsets))
	var tp kafka.TopicPartition
	_, err = pgx.ForEachRow(rows, []any{&tp.Topic, &tp.Partition}, func() error {
		stored[tp] = true
		return nil
	})
	if err = errors.Join(err, br.Close()); err != nil {
		return nil, err
	}
	var fenced []kafka.TopicPartition
	for _, so := range offsets {
		if !stored[so.TopicPartition] {
			fenced = append(fenced, so.TopicPartition)
		}
	}
	return fenced, nil
}

// idleLimit is the idle_in_transaction_session_timeout of a batch's transaction once
// it updated its offsets' rows: the server ends a session paused longer than that
// before its COMMIT.
const idleLimit = "30s"

// fencedBy reads the answers of br, one UPDATE per offset, and returns the partitions
// whose UPDATE changed no row.
func fencedBy(br pgx.BatchResults, offsets []kafka.StoreOffset) ([]kafka.TopicPartition, error) {
	var fenced []kafka.TopicPartition
	for _, so := range offsets {
		tag, err := br.Exec()
		if err != nil {
			return nil, errors.Join(err, br.Close())
		}
		if tag.RowsAffected() == 0 {
			fenced = append(fenced, so.TopicPartition)
		}
	}
	return fenced, br.Close()
}

// resolve learns whether the transaction that stored offsets with id committed, after
// its COMMIT's outcome was lost: on a connection of its own, it reads the rows with FOR
// SHARE, which waits for the transaction's row locks, so for it to end (its connection
// is closed: the server ends it). It committed if a row holds id (a claim since keeps
// it, and no other transaction of this member stores an offset meanwhile: the sink
// has one worker and holds the source's store lock); else, if a row still has the
// epoch given, it did not; else every partition has another owner (fenced), whatever
// happened. It tries for at most a minute.
func (o *Offsets) resolve(ctx context.Context, offsets []kafka.StoreOffset, id int64) (committed bool, fenced []kafka.TopicPartition, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	topics, parts := make([]string, len(offsets)), make([]int32, len(offsets))
	for i, so := range offsets {
		topics[i], parts[i] = so.Topic, so.Partition
	}
	backoff := pipeline.ExponentialBackoff(50*time.Millisecond, 2*time.Second)
	for attempt := 1; ; attempt++ {
		committed, fenced, err = o.readBack(ctx, offsets, topics, parts, id)
		if err == nil {
			return committed, fenced, nil
		}
		t := time.NewTimer(backoff(attempt))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false, nil, err
		}
	}
}

func (o *Offsets) readBack(ctx context.Context, offsets []kafka.StoreOffset, topics []string, parts []int32, id int64) (committed bool, fenced []kafka.TopicPartition, err error) {
	conn, err := pgx.ConnectConfig(ctx, o.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	type row struct {
		tp          kafka.TopicPartition
		epoch, mark int64
	}
	var rows []row
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		rs, err := tx.Query(ctx, `SELECT topic, partition, epoch, commit_id FROM `+Table+`
			WHERE job = $1 AND (topic, partition) IN (SELECT * FROM unnest($2::text[], $3::integer[])) FOR SHARE`, o.job, topics, parts)
		if err != nil {
			return err
		}
		rows, err = pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
			var x row
			return x, r.Scan(&x.tp.Topic, &x.tp.Partition, &x.epoch, &x.mark)
		})
		return err
	})
	if err != nil {
		return false, nil, err
	}
	epochs := map[kafka.TopicPartition]int64{}
	for _, so := range offsets {
		epochs[so.TopicPartition] = so.Epoch
	}
	ours := false
	for _, r := range rows {
		if r.mark == id {
			return true, nil, nil
		}
		if r.epoch == epochs[r.tp] {
			ours = true
		}
	}
	if ours {
		return false, nil, nil
	}
	for _, so := range offsets {
		fenced = append(fenced, so.TopicPartition)
	}
	return false, fenced, nil
}

// ensureTable creates the table if it is missing.
func (o *Offsets) ensureTable(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.schema {
		return nil
	}
	var have bool
	var role, schema string
	err := o.pool.QueryRow(ctx, `SELECT current_user, coalesce(current_schema(), ''), to_regclass($1) IS NOT NULL`, Table).Scan(&role, &schema, &have)
	if err != nil {
		return fmt.Errorf("kafkapg: look for the table %s: %w", Table, err)
	}
	if !have {
		_, err = o.pool.Exec(ctx, createSQL)
		if pe, ok := errors.AsType[*pgconn.PgError](err); ok && (pe.Code == pgerrcode.UniqueViolation || pe.Code == pgerrcode.DuplicateTable) {
			err = nil // another member created it at the same time
		}
		if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe.Code == pgerrcode.InsufficientPrivilege {
			return pipeline.Fatal(fmt.Errorf("kafkapg: the table %s does not exist, and role %q may not create it in schema %q: "+
				"it needs the CREATE privilege on the schema, or the table created beforehand: %w", Table, role, schema, err))
		}
		if err != nil {
			return classify(fmt.Errorf("kafkapg: create the table %s in schema %q: %w", Table, schema, err))
		}
	}
	o.schema = true
	return nil
}

// classify marks err fatal when no retry can mend it (a missing privilege, table or
// database, a failed login, a statement the server does not understand); others are
// left unclassified, and retried.
func classify(err error) error {
	pe, ok := errors.AsType[*pgconn.PgError](err)
	if !ok {
		return err
	}
	switch pe.Code[:2] {
	case "42", "28", "3D", "0A": // syntax or access rule, authorization, catalog, feature
		return pipeline.Fatal(err)
	}
	return err
}

// newCommitID returns a transaction's mark: random, not 0 (a claimed row's start).
func newCommitID() int64 {
	for {
		if id := rand.Int64(); id != 0 {
			return id
		}
	}
}
