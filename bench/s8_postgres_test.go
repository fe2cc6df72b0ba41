package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
	"github.com/gopipeline/pipeline/kafka"
	"github.com/gopipeline/pipeline/kafka/kafkapg"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// S8 into PostgreSQL: the same topic as the rest of S8, read by a new group each
// iteration, each record written as a row (id, the record's first 8 bytes; payload, its
// 100 bytes) into one table, and each partition's next offset stored in PostgreSQL in
// the same transaction as the rows it follows, so that a restarted consumer resumes
// exactly after the last committed row:
//
//   - sink=postgres/impl=plain: franz-go and pgx by hand, as a skilled user writes it
//     (s8PGPlain);
//   - sink=postgres/impl=pipeline: the group source with kafkapg's offsets → batches
//     of s8PGBatch → kafkapg.NewSink (pgpipe), offsets in the batch's transaction
//     (s8PGPipeline).
//
// An iteration starts on an empty rows table and ends once the offsets stored for the
// group reach every partition's end; the rows are then counted (untimed): lost, the
// ids 0 … s8Items-1 missing from the table, and duplicated, the rows beyond one per
// id, must both be 0, and the iteration fails otherwise. Needs DATABASE_URL (skipped
// without it, failed with CI=true).
//
// With CI=true (the CI's smoke run, one iteration of each benchmark) an iteration
// reads only the first s8PGSmoke records (the first s8PGSmoke/12 of each partition):
// 2,000,000 rows take some 30 s per implementation on a shared 2-vCPU machine, where
// the smoke run only has to show that the variant still works and counts right.

// s8PGBatch is the number of records per transaction of both implementations: at most
// that many rows COPYed, and the offsets they reach, in one commit.
const s8PGBatch = 1_000

// s8PGSmoke is the number of records an iteration reads with CI=true: the same number
// from each partition.
const s8PGSmoke = 240_000

// s8PGPart is the part of the topic an iteration reads: the first limits[p] records of
// each partition p, the ids 0 … n-1.
type s8PGPart struct {
	limits map[int32]int64
	n      int64
}

// newS8PGPart returns the whole topic, whose partitions end at ends, or with CI=true
// its first s8PGSmoke records.
func newS8PGPart(b *testing.B, ends map[int32]int64) s8PGPart {
	b.Helper()
	if os.Getenv("CI") != "true" {
		return s8PGPart{limits: ends, n: s8Items}
	}
	part := s8PGPart{limits: make(map[int32]int64, len(ends)), n: s8PGSmoke}
	for p, end := range ends {
		if end < s8PGSmoke/s8Partitions {
			b.Fatalf("partition %d ends at %d, before %d", p, end, s8PGSmoke/s8Partitions)
		}
		part.limits[p] = s8PGSmoke / s8Partitions // record i is on partition i % 12 at offset i / 12
	}
	return part
}

// s8PG is the benchmark's database: the pool and the two tables, dropped at the end.
type s8PG struct {
	pool *pgxpool.Pool
	// rows holds a row per record: id bigint, payload bytea (no unique key, so that a
	// duplicate is counted instead of failing the COPY).
	rows string
	// offsets holds impl=plain's next offset per (group_name, topic, partition).
	offsets string
}

// newS8PG connects to DATABASE_URL and creates the tables (named after the process, so
// that two benchmark processes on one server do not share them); it skips b without
// DATABASE_URL, or fails it with CI=true.
func newS8PG(b *testing.B) *s8PG {
	b.Helper()
	url := scenario.DatabaseURL(b)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	suffix := strconv.Itoa(os.Getpid())
	db := &s8PG{pool: pool, rows: "s8_rows_" + suffix, offsets: "s8_offsets_" + suffix}
	db.exec(b, "DROP TABLE IF EXISTS "+db.rows+", "+db.offsets)
	db.forgetOffsets(b)
	db.exec(b, "CREATE TABLE "+db.rows+" (id bigint NOT NULL, payload bytea NOT NULL)")
	db.exec(b, "CREATE TABLE "+db.offsets+" (group_name text NOT NULL, topic text NOT NULL, partition int NOT NULL,"+
		" next_offset bigint NOT NULL, PRIMARY KEY (group_name, topic, partition))")
	b.Cleanup(func() {
		db.exec(b, "DROP TABLE IF EXISTS "+db.rows+", "+db.offsets)
		db.forgetOffsets(b)
		pool.Close()
	})
	return db
}

// forgetOffsets deletes the offsets impl=pipeline stored in kafkapg's table under
// this process's names (s8PGStoreName), if the table exists: an earlier process of
// the same id may have left some.
func (db *s8PG) forgetOffsets(b *testing.B) {
	b.Helper()
	var have bool
	if err := db.pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", kafkapg.Table).Scan(&have); err != nil {
		b.Fatal(err)
	}
	if have {
		db.exec(b, "DELETE FROM "+kafkapg.Table+" WHERE job LIKE '"+db.rows+"/%'")
	}
}

func (db *s8PG) exec(b *testing.B, sql string) {
	b.Helper()
	if _, err := db.pool.Exec(context.Background(), sql); err != nil {
		b.Fatal(err)
	}
}

// s8PGMeasure runs one iteration per b.Loop: an empty rows table and a new group, run
// until stored (the offsets an implementation keeps for a group) reaches part's
// limits, then the rows counted.
func s8PGMeasure(b *testing.B, db *s8PG, impl string, part s8PGPart,
	run func(ctx context.Context, group string), stored func(ctx context.Context, group string) (map[int32]int64, error),
) {
	b.Helper()
	ctx := b.Context()
	var lost, dup int64
	for b.Loop() {
		b.StopTimer()
		db.exec(b, "TRUNCATE "+db.rows)
		group := "pg-" + impl + "-" + strconv.FormatInt(s8Groups.Add(1), 10)
		b.StartTimer()
		run(ctx, group)
		b.StopTimer()
		offs, err := stored(ctx, group)
		if err != nil {
			b.Fatal(err)
		}
		for p, limit := range part.limits {
			if offs[p] < limit {
				b.Fatalf("group %s: partition %d stored at %d, short of %d", group, p, offs[p], limit)
			}
		}
		var rows, ids int64
		err = db.pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FILTER (WHERE id >= 0 AND id < $1) FROM "+db.rows,
			part.n).Scan(&rows, &ids)
		if err != nil {
			b.Fatal(err)
		}
		lost += part.n - ids
		dup += rows - ids // a row of an id outside the part counts too
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(part.n)*n/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(lost)/n, "lost")
	b.ReportMetric(float64(dup)/n, "duplicated")
	if lost != 0 || dup != 0 {
		b.Fatalf("%d rows lost and %d duplicated over %d iterations: the rows and offsets must commit together", lost, dup, b.N)
	}
}

// s8PGPlain is the floor into PostgreSQL, franz-go and pgx by hand: a group member
// that never commits offsets to Kafka but keeps them in db.offsets. On assignment
// (OnPartitionsAssigned, serialized with the poll loop by BlockRebalanceOnPoll) it
// reads the stored offsets of its new partitions and starts them there (SetOffsets;
// a partition with none starts at the reset offset, the log's start). Each poll of at
// most s8PGBatch records is one transaction: COPY the rows, upsert each partition's
// next offset, commit; only then may a rebalance go on (AllowRebalance), so that no
// partition moves to another member between its rows and its offset. It returns once
// its stored offsets reach part's limits, and writes no record beyond them.
//
// It does not fence a zombie: a member that lost its partitions in a rebalance it did
// not see could still commit a batch of them. One member per group here, nothing
// crashes, so none can occur.
func s8PGPlain(ctx context.Context, b *testing.B, c *kfake.Cluster, db *s8PG, group string, part s8PGPart) {
	b.Helper()
	var assignErr atomic.Pointer[error]
	cl, err := kgo.NewClient(append(s8Opts(c),
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(s8Topic),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(func(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
			if len(assigned[s8Topic]) == 0 {
				return
			}
			offs, err := s8PGStored(ctx, db, group, assigned[s8Topic])
			if err != nil {
				assignErr.CompareAndSwap(nil, &err)
				return
			}
			set := make(map[int32]kgo.EpochOffset, len(offs))
			for p, o := range offs {
				set[p] = kgo.EpochOffset{Epoch: -1, Offset: o}
			}
			cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{s8Topic: set})
		}),
	)...)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	next := make(map[int32]int64, len(part.limits)) // the offsets stored so far
	todo := 0                                       // partitions whose stored offset is short of its limit
	for _, limit := range part.limits {
		if limit > 0 {
			todo++
		}
	}
	parts := make([]int32, 0, s8Partitions)
	nexts := make([]int64, 0, s8Partitions)
	batch := map[int32]int64{}
	upsert := "INSERT INTO " + db.offsets + " (group_name, topic, partition, next_offset)" +
		" SELECT $1, $2, unnest($3::int[]), unnest($4::bigint[])" +
		" ON CONFLICT (group_name, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset"
	for todo > 0 {
		fs := cl.PollRecords(ctx, s8PGBatch)
		if err := fs.Err0(); err != nil {
			b.Fatal(err)
		}
		if err := assignErr.Load(); err != nil {
			b.Fatalf("reading the stored offsets: %v", *err)
		}
		recs := fs.Records()
		if part.n < s8Items { // a part of the topic: leave out what lies beyond it
			recs = slices.DeleteFunc(recs, func(r *kgo.Record) bool { return r.Offset >= part.limits[r.Partition] })
		}
		if len(recs) == 0 {
			cl.AllowRebalance()
			continue
		}
		clear(batch)
		for _, r := range recs {
			batch[r.Partition] = r.Offset + 1
		}
		parts, nexts = parts[:0], nexts[:0]
		for p, o := range batch {
			parts, nexts = append(parts, p), append(nexts, o)
		}
		err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{db.rows}, []string{"id", "payload"},
				pgx.CopyFromSlice(len(recs), func(i int) ([]any, error) {
					v := recs[i].Value
					if len(v) < 8 {
						return nil, errors.New("a record shorter than its id")
					}
					return []any{int64(binary.BigEndian.Uint64(v)), v}, nil
				}))
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, upsert, group, s8Topic, parts, nexts)
			return err
		})
		cl.AllowRebalance()
		if err != nil {
			b.Fatal(err)
		}
		for p, o := range batch {
			if next[p] < part.limits[p] && o >= part.limits[p] {
				todo--
			}
			next[p] = o
		}
	}
}

// s8PGPipeline is the library into PostgreSQL: kafka.Source with its offsets in
// kafkapg's table (under a name of this process and group, s8PGStoreName), at most
// three batches of records in the pipeline (kafka.WithMaxPending, as NewSink's doc
// advises), each record decoded into its row (s8RowCodec: the work s8PGPlain does in
// its COPY) → pipeline.ToBatches of at most s8PGBatch records (5 ms linger) →
// kafkapg.NewSink, a pgpipe.Writer COPYing each batch's rows and storing its
// partitions' offsets in the same transaction, fenced by the claim's epoch. With a part of the topic, a
// one-worker stage before the batches leaves out the records beyond it (they settle,
// their offsets are stored without rows). It returns once the offsets stored reach
// part's limits, after a graceful stop: it reads them once the source counts every
// record of part settled (Stats().Committed, looked at every millisecond), as
// s8PGPlain knows its own offsets; reading the table every 5 ms instead slowed the
// transactions' offset UPDATEs (1.7 s of a run's time in them, against 0.5 s, in one
// pair of runs on a loaded machine).
func s8PGPipeline(ctx context.Context, b *testing.B, c *kfake.Cluster, db *s8PG, group string, part s8PGPart) {
	b.Helper()
	store := kafkapg.NewOffsets(db.pool, s8PGStoreName(db, group))
	src := kafka.NewSource(s8Opts(c), group, []string{s8Topic}, s8RowCodec{}, kafka.WithOffsetStore(store), kafka.WithMaxPending(3*s8PGBatch))
	w := pgpipe.NewWriter(db.pool, db.rows, pgpipe.Struct[s8Row]())
	p := pipeline.New()
	recs := src.Stream(p)
	if part.n < s8Items {
		recs = pipeline.Then(recs, pipeline.NewFlatStage("part", 1, func(_ context.Context, m kafka.Message[s8Row], emit func(kafka.Message[s8Row])) error {
			if m.Offset < part.limits[m.Partition] {
				emit(m)
			}
			return nil
		}))
	}
	pipeline.ToBatches(recs, s8PGBatch, kafkapg.NewSink("pg", src, w), pipeline.WithLinger(5*time.Millisecond))
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case err := <-errc:
			b.Fatalf("the run ended early: %v", err)
		case <-tick.C:
			if src.Stats().Committed < part.n {
				continue // not yet: no need to ask the server
			}
			offs, err := s8PGPipelineStored(ctx, db, group)
			if err != nil {
				b.Fatal(err)
			}
			done := true
			for p, limit := range part.limits {
				done = done && offs[p] >= limit
			}
			if done {
				break wait
			}
		}
	}
	src.Stop()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

// s8Row is a record's row: its id (the value's first 8 bytes) and its value.
type s8Row struct {
	ID      int64  `db:"id"`
	Payload []byte `db:"payload"`
}

// s8RowCodec decodes a record's value into its row, as s8PGPlain does in its COPY.
type s8RowCodec struct{}

func (s8RowCodec) Marshal(r s8Row) ([]byte, error) { return r.Payload, nil }

func (s8RowCodec) Unmarshal(data []byte, r *s8Row) error {
	if len(data) < 8 {
		return errors.New("a record shorter than its id")
	}
	*r = s8Row{ID: int64(binary.BigEndian.Uint64(data)), Payload: data}
	return nil
}

// s8PGStoreName is the name of group's offsets in kafkapg's table: of this process's
// tables too, since each process counts its groups from 1 and the table outlives it.
func s8PGStoreName(db *s8PG, group string) string { return db.rows + "/" + group }

// s8PGPipelineStored reads the next offsets kafkapg stores for group.
func s8PGPipelineStored(ctx context.Context, db *s8PG, group string) (map[int32]int64, error) {
	stored, err := kafkapg.NewOffsets(db.pool, s8PGStoreName(db, group)).Stored(ctx)
	if err != nil {
		return nil, err
	}
	offs := make(map[int32]int64, len(stored))
	for tp, next := range stored {
		offs[tp.Partition] = next
	}
	return offs, nil
}

// s8PGStored reads the next offsets db.offsets holds for group, of the given partitions
// of the topic (all of them when partitions is nil).
func s8PGStored(ctx context.Context, db *s8PG, group string, partitions []int32) (map[int32]int64, error) {
	rows, err := db.pool.Query(ctx, "SELECT partition, next_offset FROM "+db.offsets+
		" WHERE group_name = $1 AND topic = $2 AND ($3::int[] IS NULL OR partition = ANY($3))", group, s8Topic, partitions)
	if err != nil {
		return nil, err
	}
	offs := map[int32]int64{}
	var p int32
	var o int64
	_, err = pgx.ForEachRow(rows, []any{&p, &o}, func() error {
		offs[p] = o
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stored offsets of group %s: %w", group, err)
	}
	return offs, nil
}

// s8Ends returns each partition's end offset.
func s8Ends(ctx context.Context, b *testing.B, c *kfake.Cluster) map[int32]int64 {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	listed, err := kadm.NewClient(cl).ListEndOffsets(ctx, s8Topic)
	if err != nil {
		b.Fatal(err)
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			b.Fatalf("partition %d: %v", o.Partition, o.Err)
		}
		ends[o.Partition] = o.Offset
	})
	if len(ends) != s8Partitions {
		b.Fatalf("%d partitions listed, want %d", len(ends), s8Partitions)
	}
	return ends
}
