package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// S6: batching into PostgreSQL (seed 004). 50,000 rows of 3 columns into an UNLOGGED
// table, by method: one INSERT per row, multi-row INSERTs, the library's COPY writer
// (one and four connections, insert and upsert), and plain pgx CopyFrom as the floor of
// each COPY figure, in the same run. Needs DATABASE_URL (scripts/postgres.sh start).

const s6Rows = 50000

type s6Row struct {
	ID    int64
	Name  string
	Score float64
}

func s6Input() []s6Row {
	rows := make([]s6Row, s6Rows)
	for i := range rows {
		rows[i] = s6Row{ID: int64(i), Name: "row " + strconv.Itoa(i), Score: float64(i) / 3}
	}
	return rows
}

var s6Columns = []string{"id", "name", "score"}

func s6Values(r s6Row) []any { return []any{r.ID, r.Name, r.Score} }

func BenchmarkS6Postgres(b *testing.B) {
	url := scenario.DatabaseURL(b)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	in := s6Input()
	table := fmt.Sprintf("s6_%d", os.Getpid())
	exec := func(sql string) {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	exec("DROP TABLE IF EXISTS " + table)
	exec("CREATE UNLOGGED TABLE " + table + " (id bigint NOT NULL, name text NOT NULL, score float8 NOT NULL)")
	exec("DROP TABLE IF EXISTS " + table + "_pk")
	exec("CREATE UNLOGGED TABLE " + table + "_pk (id bigint PRIMARY KEY, name text NOT NULL, score float8 NOT NULL)")
	defer exec("DROP TABLE IF EXISTS " + table + ", " + table + "_pk")

	methods := []struct {
		name  string
		table string
		write func(ctx context.Context, table string) error
	}{
		{"row", table, func(ctx context.Context, table string) error { return s6RowByRow(ctx, pool, table, in) }},
		{"values10000", table, func(ctx context.Context, table string) error { return s6Values10000(ctx, pool, table, in) }},
		// Each floor runs just before the library's figure it is the floor of, so that a
		// change of load on a shared machine hits both alike.
		{"rawcopy10000", table, func(ctx context.Context, table string) error { return s6Raw(ctx, pool, table, in, 10000, 1) }},
		{"copy10000", table, func(ctx context.Context, table string) error { return s6Library(ctx, pool, table, in, 10000, 1) }},
		{"rawcopy5000x4", table, func(ctx context.Context, table string) error { return s6Raw(ctx, pool, table, in, 5000, 4) }},
		{"copy5000x4", table, func(ctx context.Context, table string) error { return s6Library(ctx, pool, table, in, 5000, 4) }},
		{"upsert5000x4", table + "_pk", func(ctx context.Context, table string) error {
			return s6Library(ctx, pool, table, in, 5000, 4, pgpipe.WithUpsert("id"))
		}},
	}
	for _, m := range methods {
		b.Run("method="+m.name, func(b *testing.B) {
			var lost int64
			for b.Loop() {
				b.StopTimer()
				if _, err := pool.Exec(ctx, "TRUNCATE "+m.table); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := m.write(ctx, m.table); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				var n int64
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+m.table).Scan(&n); err != nil {
					b.Fatal(err)
				}
				if n != s6Rows {
					b.Fatalf("%d rows in the table, want %d", n, s6Rows)
				}
				lost += s6Rows - n
				b.StartTimer()
			}
			b.ReportMetric(float64(s6Rows*b.N)/b.Elapsed().Seconds(), "rows/s")
			b.ReportMetric(float64(lost)/float64(b.N), "lost")
		})
	}
}

// s6RowByRow inserts one row per statement, on one connection.
func s6RowByRow(ctx context.Context, pool *pgxpool.Pool, table string, in []s6Row) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	sql := "INSERT INTO " + table + " (id, name, score) VALUES ($1, $2, $3)"
	for _, r := range in {
		if _, err := conn.Exec(ctx, sql, r.ID, r.Name, r.Score); err != nil {
			return err
		}
	}
	return nil
}

// s6Values10000 inserts 10,000 rows per multi-row INSERT, on one connection.
func s6Values10000(ctx context.Context, pool *pgxpool.Pool, table string, in []s6Row) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	const chunk = 10000
	var sql strings.Builder
	sql.WriteString("INSERT INTO " + table + " (id, name, score) VALUES ")
	for i := range chunk {
		if i > 0 {
			sql.WriteByte(',')
		}
		fmt.Fprintf(&sql, "($%d,$%d,$%d)", 3*i+1, 3*i+2, 3*i+3)
	}
	args := make([]any, 0, 3*chunk)
	for lo := 0; lo < len(in); lo += chunk {
		args = args[:0]
		for _, r := range in[lo:min(lo+chunk, len(in))] {
			args = append(args, r.ID, r.Name, r.Score)
		}
		if _, err := conn.Exec(ctx, sql.String(), args...); err != nil {
			return err
		}
	}
	return nil
}

// s6Library writes through the pipeline and the pgpipe writer.
func s6Library(ctx context.Context, pool *pgxpool.Pool, table string, in []s6Row, chunk, writers int, opts ...pgpipe.Option) error {
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[s6Row](), append(opts, pgpipe.WithChunk(chunk, 0))...)
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, in), "load", writers)
	return p.Run(ctx)
}

// s6Raw is the floor: plain pgx CopyFrom of chunks, writers goroutines each on a
// connection of its own, taking the next chunk as they finish one.
func s6Raw(ctx context.Context, pool *pgxpool.Pool, table string, in []s6Row, chunk, writers int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for k := range writers {
		wg.Go(func() {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				errs[k] = err
				return
			}
			defer conn.Release()
			for {
				lo := int(next.Add(1)-1) * chunk
				if lo >= len(in) {
					return
				}
				part := in[lo:min(lo+chunk, len(in))]
				_, err := conn.CopyFrom(ctx, pgx.Identifier{table}, s6Columns, pgx.CopyFromSlice(len(part), func(i int) ([]any, error) {
					return s6Values(part[i]), nil
				}))
				if err != nil {
					errs[k] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
