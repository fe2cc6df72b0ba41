package pgpipe_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

type event struct {
	ID    int64   `db:"id"`
	Name  string  `db:"name"`
	Score float64 `db:"score"`
}

func events(n int) []event {
	out := make([]event, n)
	for i := range out {
		out[i] = event{ID: int64(i), Name: fmt.Sprintf("event %d", i), Score: float64(i) / 2}
	}
	return out
}

func createEvents(tb testing.TB, pool *pgxpool.Pool, primaryKey bool) string {
	tb.Helper()
	pk := ""
	if primaryKey {
		pk = " PRIMARY KEY"
	}
	return createTable(tb, pool, "events", fmt.Sprintf("(id bigint%s, name text NOT NULL, score float8 NOT NULL)", pk))
}

func TestInsert(t *testing.T) {
	pool := newPool(t, 8)
	table := createEvents(t, pool, false)
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), pgpipe.WithChunk(1000, 1<<20))
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, events(20000)), "load", 4)
	require.NoError(t, p.Run(t.Context()))
	rows, distinct := count(t, pool, table)
	assert.Equal(t, int64(20000), rows)
	assert.Equal(t, int64(20000), distinct)
	st := w.Stats()
	assert.Equal(t, int64(20000), st.Rows)
	assert.Equal(t, int64(20), st.Batches)
	var sum float64
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT sum(score) FROM "+table).Scan(&sum))
	assert.Equal(t, float64(19999*20000/4), sum)
}

func TestUpsertLastRowWins(t *testing.T) {
	for _, mode := range []string{"upsert", "skip"} {
		t.Run(mode, func(t *testing.T) {
			pool := newPool(t, 8)
			table := createEvents(t, pool, true)
			mustExec(t, pool, "INSERT INTO "+table+" VALUES (0, 'old', -1), (5000, 'old', -1)")
			opt := pgpipe.WithUpsert("id")
			if mode == "skip" {
				opt = pgpipe.WithSkipExisting("id")
			}
			w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), opt)
			// Every id twice in each batch, the second time with its final name: a
			// batch that did not de-duplicate would fail ("cannot affect row a second
			// time"), one that kept the first row would keep the wrong name.
			var in []event
			for i := range 10000 {
				in = append(in, event{ID: int64(i % 5000), Name: "first", Score: 1}, event{ID: int64(i % 5000), Name: "last", Score: 2})
			}
			p := pipeline.New()
			w.To(pipeline.FromSlice(p, in), "load", 4)
			require.NoError(t, p.Run(t.Context()))
			rows, distinct := count(t, pool, table)
			assert.Equal(t, int64(5001), rows)
			assert.Equal(t, int64(5001), distinct)
			var last, old int
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FILTER (WHERE name = 'last'), count(*) FILTER (WHERE name = 'old') FROM "+table).Scan(&last, &old))
			if mode == "upsert" {
				assert.Equal(t, 5000, last)
				assert.Equal(t, 1, old, "5000 is not in the input")
			} else {
				assert.Equal(t, 4999, last)
				assert.Equal(t, 2, old, "existing rows are kept")
			}
		})
	}
}

// TestUpsertKeysThatPostgreSQLTakesAsOne upserts batches with two rows whose keys
// differ in Go but are one key to PostgreSQL: char(n) pads its values, and a unique
// index with NULLS NOT DISTINCT takes two NULLs as equal. The run used to fail ("ON
// CONFLICT DO UPDATE command cannot affect row a second time", fatal); now the last
// row of each key wins, and rows with a NULL key are all kept where the index lets them.
func TestUpsertKeysThatPostgreSQLTakesAsOne(t *testing.T) {
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name, column string
		in           []nullKeyRow
		want         []string // code=value, sorted
		dead         []string // code=value of the rows set aside
	}{
		{
			name: "char(n)", column: "code char(4) UNIQUE",
			in:   []nullKeyRow{{str("ab"), 1}, {str("cd"), 2}, {nil, 3}, {str("ab  "), 4}, {nil, 5}, {str("ab"), 6}, {str("cd "), 7}},
			want: []string{"<nil>=3", "<nil>=5", "ab  =6", "cd  =7"},
		},
		{
			name: "NULLS NOT DISTINCT", column: "code text UNIQUE NULLS NOT DISTINCT",
			in:   []nullKeyRow{{nil, 1}, {str("x"), 2}, {nil, 3}, {str("y"), 4}},
			want: []string{"<nil>=3", "x=2", "y=4"},
		},
		{
			name: "char(n) with a rejected row", column: "code char(4) UNIQUE CHECK (code <> 'bad')",
			in:   []nullKeyRow{{str("ab"), 1}, {str("bad"), 2}, {str("cd"), 3}, {str("ab "), 4}, {str("cd  "), 5}, {str("ab"), 6}},
			want: []string{"ab  =6", "cd  =5"},
			dead: []string{"bad=2"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newPool(t, 4)
			table := createTable(t, pool, "pgkeys", "("+tc.column+", value int NOT NULL)")
			var mu sync.Mutex
			var dead []string
			w := pgpipe.NewWriter(pool, table, pgpipe.Struct[nullKeyRow](), pgpipe.WithUpsert("code"), pgpipe.WithChunk(len(tc.in), 0),
				pgpipe.WithDeadLetter(func(_ context.Context, dl pipeline.DeadLetter[nullKeyRow]) error {
					mu.Lock()
					defer mu.Unlock()
					dead = append(dead, fmt.Sprintf("%s=%d", *dl.Item.Code, dl.Item.Value))
					return nil
				}))
			p := pipeline.New()
			w.To(pipeline.FromSlice(p, tc.in), "load", 1)
			require.NoError(t, p.Run(t.Context()))
			assert.Equal(t, tc.dead, dead)
			var got []string
			rows, err := pool.Query(t.Context(), "SELECT code, value FROM "+table)
			require.NoError(t, err)
			for rows.Next() {
				var r nullKeyRow
				require.NoError(t, rows.Scan(&r.Code, &r.Value))
				code := "<nil>"
				if r.Code != nil {
					code = *r.Code
				}
				got = append(got, fmt.Sprintf("%s=%d", code, r.Value))
			}
			require.NoError(t, rows.Err())
			slices.Sort(got)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestUpsertLanesGiveAKeyToOneWriter upserts, with four writers, pairs of rows whose
// keys differ in Go but are one key to PostgreSQL (a timestamp without time zone takes
// a time's wall clock, whatever its location; a date, its day; timestamp(p) rounds;
// char(n) drops trailing spaces, varchar(n) those past n; citext and a nondeterministic
// collation ignore case; float4 rounds), the
// second row of each pair later in the source, and checks that each key is written by
// one transaction and holds its later row. The lanes took such rows by their Go values: the two rows of a pair went
// to two writers, whose transactions wrote the key concurrently, in any order (and
// could deadlock each other).
func TestUpsertLanesGiveAKeyToOneWriter(t *testing.T) {
	wall := func(i int, loc *time.Location) time.Time { return time.Date(2026, 3, 1, i, 30, 0, 0, loc) }
	east, west := time.FixedZone("east", 5*3600), time.FixedZone("west", -7*3600)
	t.Run("timestamp", func(t *testing.T) {
		testLanesGiveAKeyToOneWriter(t, "timestamp", func(i int) [2]time.Time { return [2]time.Time{wall(i, time.UTC), wall(i, east)} })
	})
	t.Run("timestamptz", func(t *testing.T) {
		testLanesGiveAKeyToOneWriter(t, "timestamptz", func(i int) [2]time.Time {
			return [2]time.Time{wall(i, time.UTC), wall(i, time.UTC).In(west)}
		})
	})
	t.Run("timestamp(0)", func(t *testing.T) {
		// Rounded to the second, half away from 2000-01-01: 0.5 s before a second
		// goes with the 1.4 s before it, 0.5 s after with the 1.4 s after.
		testLanesGiveAKeyToOneWriter(t, "timestamp(0)", func(i int) [2]time.Time {
			at, half, more := time.Date(2000, 1, 1, 0, 0, i-16, 0, time.UTC), 500*time.Millisecond, 1400*time.Millisecond
			if i < 16 {
				half, more = -half, -more
			}
			second := at.Add(more)
			return [2]time.Time{at.Add(half), time.Date(second.Year(), second.Month(), second.Day(), second.Hour(), second.Minute(), second.Second(), second.Nanosecond(), east)}
		})
	})
	t.Run("timestamptz(3)", func(t *testing.T) { // rounded to the millisecond
		testLanesGiveAKeyToOneWriter(t, "timestamptz(3)", func(i int) [2]time.Time {
			return [2]time.Time{wall(i, time.UTC).Add(1600 * time.Microsecond), wall(i, time.UTC).Add(2400 * time.Microsecond).In(west)}
		})
	})
	t.Run("date", func(t *testing.T) {
		testLanesGiveAKeyToOneWriter(t, "date", func(i int) [2]time.Time {
			d := time.Date(2026, 3, 1+i, 1, 0, 0, 0, west)
			return [2]time.Time{d, d.Add(20 * time.Hour)}
		})
	})
	t.Run("char(n)", func(t *testing.T) {
		testLanesGiveAKeyToOneWriter(t, "char(8)", func(i int) [2]string { k := fmt.Sprintf("k%02d", i); return [2]string{k, k + "  "} })
	})
	t.Run("varchar(n)", func(t *testing.T) { // spaces past n are cut
		testLanesGiveAKeyToOneWriter(t, "varchar(4)", func(i int) [2]string { k := fmt.Sprintf("k%03d", i); return [2]string{k, k + "  "} })
	})
	t.Run("citext", func(t *testing.T) {
		mustExec(t, newPool(t, 1), "CREATE EXTENSION IF NOT EXISTS citext")
		testLanesGiveAKeyToOneWriter(t, "citext", func(i int) [2]string {
			return [2]string{fmt.Sprintf("Key%02d", i), fmt.Sprintf("kEY%02d", i)}
		})
	})
	t.Run("nondeterministic collation", func(t *testing.T) {
		mustExec(t, newPool(t, 1), `DO $$ BEGIN CREATE COLLATION pgpipe_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
			EXCEPTION WHEN duplicate_object THEN NULL; END $$`)
		testLanesGiveAKeyToOneWriter(t, "text COLLATE pgpipe_ci", func(i int) [2]string {
			return [2]string{fmt.Sprintf("Key%02d", i), fmt.Sprintf("kEY%02d", i)}
		})
	})
	t.Run("float4", func(t *testing.T) {
		testLanesGiveAKeyToOneWriter(t, "float4", func(i int) [2]float64 {
			x := float64(i) + 0.1
			return [2]float64{x, float64(float32(x))} // two float64s, one float4
		})
	})
}

// laneRow is a row of TestUpsertLanesGiveAKeyToOneWriter: a key of type K (a string or
// a float64 is read unboxed, a time.Time boxed) and the row's place in the source.
type laneRow[K any] struct {
	K K   `db:"k"`
	V int `db:"v"`
}

func testLanesGiveAKeyToOneWriter[K any](t *testing.T, column string, pair func(i int) [2]K) {
	t.Helper()
	const keys = 32
	ctx := t.Context()
	pool := newPool(t, 8)
	table := createTable(t, pool, "lanes", "(k "+column+" PRIMARY KEY, v int NOT NULL)")
	writes := createTable(t, pool, "writes", "(k text NOT NULL, xid bigint NOT NULL)")
	mustExec(t, pool, fmt.Sprintf(`CREATE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		INSERT INTO %[1]s VALUES (NEW.k::text, txid_current()); RETURN NEW; END $$`, writes))
	t.Cleanup(func() { mustExec(t, pool, "DROP FUNCTION IF EXISTS "+writes+"() CASCADE") })
	mustExec(t, pool, fmt.Sprintf("CREATE TRIGGER %s AFTER INSERT OR UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s()", writes, table, writes))

	in := make([]laneRow[K], 2*keys) // each key's first row, then each key's second
	for i := range keys {
		p := pair(i)
		in[i], in[keys+i] = laneRow[K]{p[0], i}, laneRow[K]{p[1], keys + i}
	}
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[laneRow[K]](), pgpipe.WithUpsert("k"), pgpipe.WithChunk(len(in), 0))
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, in), "load", 4)
	require.NoError(t, p.Run(ctx))

	rows, err := pool.Query(ctx, "SELECT k, count(DISTINCT xid) FROM "+writes+" GROUP BY k HAVING count(DISTINCT xid) > 1 ORDER BY k")
	require.NoError(t, err)
	shared, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var k string
		var n int
		err := r.Scan(&k, &n)
		return fmt.Sprintf("%s: %d transactions", k, n), err
	})
	require.NoError(t, err)
	assert.Empty(t, shared, "keys written by more than one writer's transaction")
	var n, stale int
	require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*), count(*) FILTER (WHERE v < %d) FROM %s", keys, table)).Scan(&n, &stale))
	assert.Equal(t, keys, n, "one row per key")
	assert.Zero(t, stale, "keys that hold their earlier row")
}

// TestUpsertTimestampKeyIsItsWallClock upserts rows whose time keys are one instant in
// three locations into a timestamp column without time zone, which keeps a time's
// wall clock: three keys to PostgreSQL, all written. The de-duplication took them by
// their instant, as one key, and kept only the last.
func TestUpsertTimestampKeyIsItsWallClock(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 4)
	table := createTable(t, pool, "wallkey", "(k timestamp PRIMARY KEY, v int NOT NULL)")
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	in := []laneRow[time.Time]{{at, 1}, {at.In(time.FixedZone("east", 5*3600)), 2}, {at.In(time.FixedZone("west", -7*3600)), 3}, {at, 4}}
	for _, workers := range []int{1, 4} {
		mustExec(t, pool, "TRUNCATE "+table)
		p := pipeline.New()
		pgpipe.NewWriter(pool, table, pgpipe.Struct[laneRow[time.Time]](), pgpipe.WithUpsert("k")).To(pipeline.FromSlice(p, in), "load", workers)
		require.NoError(t, p.Run(t.Context()))
		rows, err := pool.Query(t.Context(), "SELECT v FROM "+table+" ORDER BY k")
		require.NoError(t, err)
		vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		assert.Equal(t, []int32{3, 4, 2}, vs, "workers=%d: each wall clock's last row (05:00, 12:00, 17:00)", workers)
	}
}

// nullKeyRow is a row whose key may be NULL (a nil Code).
type nullKeyRow struct {
	Code  *string `db:"code"`
	Value int     `db:"value"`
}

// TestUpsertKeepsEveryRowWithANullKey checks that rows whose key is NULL are all
// written, with one worker and with lanes: ON CONFLICT never matches a NULL, so the
// table takes each of them, and the de-duplication must not keep only the last. A key
// that prints as NULL does ("<nil>") is a key like any other.
func TestUpsertKeepsEveryRowWithANullKey(t *testing.T) {
	a, printed := "a", "<nil>"
	in := []nullKeyRow{{nil, 1}, {&a, 2}, {nil, 3}, {&printed, 4}, {&a, 5}, {nil, 6}, {&printed, 7}}
	for _, mode := range []string{"upsert", "skip"} {
		for _, workers := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/workers=%d", mode, workers), func(t *testing.T) {
				pool := newPool(t, 8)
				table := createTable(t, pool, "nullkey", "(code text UNIQUE, value int NOT NULL)")
				opt := pgpipe.WithUpsert("code")
				if mode == "skip" {
					opt = pgpipe.WithSkipExisting("code")
				}
				w := pgpipe.NewWriter(pool, table, pgpipe.Struct[nullKeyRow](), opt)
				p := pipeline.New()
				w.To(pipeline.FromSlice(p, in), "load", workers)
				require.NoError(t, p.Run(t.Context()))
				rows, err := pool.Query(t.Context(), "SELECT coalesce(code, 'NULL'), value FROM "+table+" ORDER BY value")
				require.NoError(t, err)
				got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
					var code string
					var v int
					err := r.Scan(&code, &v)
					return fmt.Sprintf("%s=%d", code, v), err
				})
				require.NoError(t, err)
				assert.Equal(t, []string{"NULL=1", "NULL=3", "a=5", "NULL=6", "<nil>=7"}, got, "the table's rows, by value")
			})
		}
	}
}

// TestUpsertKeepsEveryRowWithANullValuedKey is the same with keys NULL through a value
// type: a sql.NullString that is not valid, and a nil []byte, which pgx writes as NULL.
// They were compared by their printed form, so the NULL-key rows but the last were lost.
func TestUpsertKeepsEveryRowWithANullValuedKey(t *testing.T) {
	t.Parallel()
	type nullString struct {
		Code  sql.NullString `db:"code"`
		Value int            `db:"value"`
	}
	type nullBytes struct {
		Code  []byte `db:"code"`
		Value int    `db:"value"`
	}
	a := sql.NullString{String: "a", Valid: true}
	for _, tc := range []struct {
		name  string
		write func(p *pipeline.Pipeline, pool *pgxpool.Pool, table string)
	}{
		{"sql.NullString", func(p *pipeline.Pipeline, pool *pgxpool.Pool, table string) {
			in := []nullString{{Value: 1}, {a, 2}, {Value: 3}, {a, 4}}
			pgpipe.NewWriter(pool, table, pgpipe.Struct[nullString](), pgpipe.WithUpsert("code")).To(pipeline.FromSlice(p, in), "load", 1)
		}},
		{"[]byte", func(p *pipeline.Pipeline, pool *pgxpool.Pool, table string) {
			in := []nullBytes{{nil, 1}, {[]byte("a"), 2}, {nil, 3}, {[]byte("a"), 4}}
			pgpipe.NewWriter(pool, table, pgpipe.Struct[nullBytes](), pgpipe.WithUpsert("code")).To(pipeline.FromSlice(p, in), "load", 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := newPool(t, 2)
			typ := "text"
			if tc.name == "[]byte" {
				typ = "bytea"
			}
			table := createTable(t, pool, "nullvalued", "(code "+typ+" UNIQUE, value int NOT NULL)")
			p := pipeline.New()
			tc.write(p, pool, table)
			require.NoError(t, p.Run(t.Context()))
			var nulls, rows int
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FILTER (WHERE code IS NULL), count(*) FROM "+table).Scan(&nulls, &rows))
			assert.Equal(t, 2, nulls, "both NULL-key rows")
			assert.Equal(t, 3, rows)
		})
	}
}

// TestUpsertTimeKeysInOneMicrosecond upserts rows whose timestamptz keys differ by less
// than a microsecond, which PostgreSQL keeps: one key to it, so the last row wins. They
// were two keys to the de-duplication, and PostgreSQL refused the batch (a row affected
// twice by ON CONFLICT DO UPDATE).
func TestUpsertTimeKeysInOneMicrosecond(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 2)
	table := createTable(t, pool, "tzkey", "(at timestamptz PRIMARY KEY, v int NOT NULL)")
	type row struct {
		At time.Time `db:"at"`
		V  int32     `db:"v"`
	}
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 1000, time.UTC)
	in := []row{{t0, 1}, {t0.Add(1), 2}, {t0.Add(time.Microsecond), 3}}
	p := pipeline.New()
	pgpipe.NewWriter(pool, table, pgpipe.Struct[row](), pgpipe.WithUpsert("at")).To(pipeline.FromSlice(p, in), "load", 1)
	require.NoError(t, p.Run(t.Context()))
	var vs []int32
	rows, err := pool.Query(t.Context(), "SELECT v FROM "+table+" ORDER BY at")
	require.NoError(t, err)
	vs, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	assert.Equal(t, []int32{2, 3}, vs, "the last row of the first microsecond, then the next")
}

// badRow is a row of a table with constraints a row can break.
type badRow struct {
	ID     int64   `db:"id"`
	Name   string  `db:"name"`
	Small  int64   `db:"small"`  // an int4 column: a larger value does not fit
	Amount float64 `db:"amount"` // numeric(8,2)
	Parent int32   `db:"parent"` // references a parent table
}

// TestBadRowsAreDeadLettered writes 20,000 rows in batches of 5,000, five of them bad,
// and checks that exactly those are dead-lettered, with their SQLSTATE and constraint,
// at a round-trip cost of O(k·log n).
func TestBadRowsAreDeadLettered(t *testing.T) {
	for _, mode := range []string{"insert", "upsert"} {
		t.Run(mode, func(t *testing.T) {
			testBadRows(t, mode)
		})
	}
}

func testBadRows(t *testing.T, mode string) {
	pool := newPool(t, 8)
	parent, table, dead := tableName("parent"), tableName("bad"), tableName("dead")
	mustExec(t, pool, "CREATE TABLE "+parent+" (id int PRIMARY KEY)")
	mustExec(t, pool, "INSERT INTO "+parent+" SELECT generate_series(0, 9)")
	mustExec(t, pool, fmt.Sprintf(`CREATE TABLE %s (id bigint CONSTRAINT %s_pk PRIMARY KEY, name text NOT NULL, small int4 NOT NULL,
		amount numeric(8,2) NOT NULL, parent int NOT NULL CONSTRAINT %s_fk REFERENCES %s (id))`, table, table, table, parent))
	t.Cleanup(func() { mustExec(t, pool, "DROP TABLE IF EXISTS "+table+", "+parent+", "+dead) })
	existing := int64(1_000_000)
	mustExec(t, pool, "INSERT INTO "+table+" VALUES ($1, 'there before', 0, 0, 0)", existing)

	const n, batch = 20000, 5000
	in := make([]badRow, n)
	for i := range in {
		in[i] = badRow{ID: int64(i), Name: fmt.Sprintf("row %d", i), Small: int64(i), Amount: float64(i) / 4, Parent: int32(i % 10)}
	}
	in[777].Name = "nul \x00 byte"     // 22021: not valid UTF-8 text
	in[1500].Small = math.MaxInt32 + 1 // the driver cannot encode it as int4
	in[2500].Amount = 1e9              // 22003: numeric field overflow
	in[8000].ID = existing             // 23505 in insert mode (updated in upsert mode)
	in[16000].Parent = 99              // 23503: no such parent
	want := map[int64]string{777: "22021", 1500: "", 2500: "22003", existing: "23505", 16000: "23503"}
	if mode == "upsert" {
		delete(want, existing)
	}

	dlt, err := pgpipe.OpenDeadLetterTable[badRow](t.Context(), pool, dead, nil)
	require.NoError(t, err)
	opts := []pgpipe.Option{pgpipe.WithDeadLetterTable(dlt), pgpipe.WithChunk(batch, 0)}
	if mode == "upsert" {
		opts = append(opts, pgpipe.WithUpsert("id"))
	}
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[badRow](), opts...)
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, in), "load", 4)
	require.NoError(t, p.Run(t.Context()))

	dls, err := dlt.Read(t.Context(), "load")
	require.NoError(t, err)
	got := map[int64]string{}
	for _, d := range dls {
		got[d.Item.ID] = d.LastError
	}
	var codes []string
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT array_agg(coalesce(sqlstate, '') ORDER BY coalesce(sqlstate, '')) FROM "+dead).Scan(&codes))
	var wantCodes []string
	for id, code := range want {
		wantCodes = append(wantCodes, code)
		assert.Contains(t, got, id, "row %d is dead-lettered", id)
	}
	slices.Sort(wantCodes)
	assert.Len(t, got, len(want), "only the bad rows are dead-lettered: %v", got)
	assert.Equal(t, wantCodes, codes)
	if mode == "insert" {
		assert.Contains(t, got[existing], table+"_pk")
		assert.Contains(t, got[16000], table+"_fk")
	}
	rows, distinct := count(t, pool, table)
	assert.Equal(t, rows, distinct)
	if mode == "insert" {
		assert.Equal(t, int64(n+1-len(want)), rows, "every good row is written, and the row there before")
	} else {
		assert.Equal(t, int64(n-len(want)), rows, "every good row is written; the one there before was updated")
	}

	// Cost: each batch with k bad rows of 5,000 costs O(k·log n) round trips.
	st := w.Stats()
	depth := int64(math.Ceil(math.Log2(batch)))
	bound := int64(4*8) + int64(len(want)+1)*2*depth*4 // four batches' fixed cost, plus each bad row's descent
	t.Logf("%s: %d bad rows in %d batches of %d: %d round trips in all (%d bisected batches), bound %d",
		mode, len(want), n/batch, batch, st.RoundTrips, st.Bisected, bound)
	assert.LessOrEqual(t, st.RoundTrips, bound)
	assert.Equal(t, int64(len(want)), st.DeadLettered)

	// The run's report says where the rejected rows went (it used to show none).
	rep := p.Report()
	load, ok := rep.Stage("load")
	require.True(t, ok)
	assert.Equal(t, int64(len(want)), load.SetAside, "rejected rows in the sink's row")
	assert.Equal(t, int64(len(want)), rep.DeadLettered())
	var causes int64
	for _, c := range load.Causes {
		assert.Equal(t, "*pgpipe.RowError", c.Type)
		causes += c.Count
	}
	assert.Equal(t, int64(len(want)), causes, "every rejected row among the causes: %v", load.Causes)
	assert.Contains(t, rep.String(), fmt.Sprintf("sink load: %d parts of its items set aside", len(want)))
}

// refRow is a row of a table with deferred foreign keys: to a parent table, and to a
// row of its own table.
type refRow struct {
	ID     int64  `db:"id"`
	Parent int32  `db:"parent"`
	Ref    *int64 `db:"ref"`
}

// TestDeferredConstraintRejectsOnlyItsRow writes a batch into a table whose foreign keys
// are checked at COMMIT (DEFERRABLE INITIALLY DEFERRED), with two rows that break them,
// and checks that exactly those are dead-lettered, whichever way the batch commits: the
// COMMIT used to fail the whole batch, after every savepoint of the bisection had passed.
// A row that refers to a row after it in the batch goes in, though the search splits
// the two.
func TestDeferredConstraintRejectsOnlyItsRow(t *testing.T) {
	for _, tc := range []struct {
		name, mode string // how the batch is written: a sink, a checkpointed sink, Writer.Write
		upsert     bool
	}{
		{"insert", "sink", false},
		{"upsert", "sink", true},
		{"checkpointed insert", "checkpoint", false},
		{"Write with a BatchTx", "write", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			pool := newPool(t, 4)
			parent, table, dead := tableName("parent"), tableName("deferred"), tableName("dead")
			mustExec(t, pool, "CREATE TABLE "+parent+" (id int PRIMARY KEY)")
			mustExec(t, pool, "INSERT INTO "+parent+" SELECT generate_series(0, 9)")
			mustExec(t, pool, fmt.Sprintf(`CREATE TABLE %[1]s (id bigint PRIMARY KEY,
				parent int NOT NULL CONSTRAINT %[1]s_parent REFERENCES %[2]s (id) DEFERRABLE INITIALLY DEFERRED,
				ref bigint CONSTRAINT %[1]s_ref REFERENCES %[1]s (id) DEFERRABLE INITIALLY DEFERRED)`, table, parent))
			t.Cleanup(func() { mustExec(t, pool, "DROP TABLE IF EXISTS "+table+", "+parent+", "+dead) })

			const n = 100
			in := make([]refRow, n)
			for i := range in {
				in[i] = refRow{ID: int64(i), Parent: int32(i % 10)}
			}
			forward, missing := int64(60), int64(999)
			in[3].Ref = &forward  // refers to a row later in the batch: goes in
			in[37].Parent = 99    // no such parent
			in[80].Ref = &missing // no such row
			dlt, err := pgpipe.OpenDeadLetterTable[refRow](ctx, pool, dead, nil)
			require.NoError(t, err)
			opts := []pgpipe.Option{pgpipe.WithDeadLetterTable(dlt), pgpipe.WithChunk(n, 0)}
			if tc.upsert {
				opts = append(opts, pgpipe.WithUpsert("id"))
			}
			switch tc.mode {
			case "sink":
				p := pipeline.New()
				pgpipe.NewWriter(pool, table, pgpipe.Struct[refRow](), opts...).To(pipeline.FromSlice(p, in), "load", 1)
				require.NoError(t, p.Run(ctx))
			case "checkpoint":
				ck := pgpipe.NewCheckpoint(pool, tableName("job"))
				p := pipeline.New()
				src := pipeline.FromCheckpoint(p, ck, func(_ context.Context, pos int64) iter.Seq2[refRow, error] {
					return func(yield func(refRow, error) bool) {
						for _, r := range in[pos:] {
							if !yield(r, nil) {
								return
							}
						}
					}
				})
				opts = append(opts, pgpipe.WithCheckpoint(ck))
				pgpipe.NewWriter(pool, table, pgpipe.Struct[refRow](), opts...).To(src, "load", 1)
				require.NoError(t, p.Run(ctx))
				pos, err := ck.Load(ctx)
				require.NoError(t, err)
				assert.Equal(t, int64(n), pos, "every position settled")
			case "write":
				w := pgpipe.NewWriter(pool, table, pgpipe.Struct[refRow](), opts...)
				require.NoError(t, w.Write(ctx, "load", in, pgpipe.BatchTx{}))
			}

			dls, err := dlt.Read(ctx, "load")
			require.NoError(t, err)
			got := map[int64]string{}
			for _, d := range dls {
				got[d.Item.ID] = d.LastError
			}
			require.Len(t, got, 2, "only the rows that break a key are dead-lettered: %v", got)
			assert.Contains(t, got[37], table+"_parent")
			assert.Contains(t, got[80], table+"_ref")
			rows, _ := count(t, pool, table)
			assert.Equal(t, int64(n-2), rows, "every other row is written")
		})
	}
}

// TestRewrittenBatchDeadLettersEachRowOnce writes a batch with a row that a CHECK
// rejects at its statement and one that a deferred foreign key rejects at COMMIT: the
// writer finds the first, has its COMMIT refused, and writes the batch again with every
// constraint immediate (and, with two rows PostgreSQL takes as one key, in distinct
// mode). Each rejected row must reach the dead-letter destination once: a WithDeadLetter
// function used to get the CHECK's row from the first write too, sent before a COMMIT
// that then rolled back.
func TestRewrittenBatchDeadLettersEachRowOnce(t *testing.T) {
	for _, tc := range []struct {
		name, how string // how: a sink, Writer.Write
		upsert    bool
		sameKey   bool // a row whose key PostgreSQL takes as an earlier row's (distinct mode)
		table     bool // a DeadLetterTable, not a function
	}{
		{name: "insert", how: "sink"},
		{name: "insert, table", how: "sink", table: true},
		{name: "upsert", how: "sink", upsert: true},
		{name: "upsert, table", how: "sink", upsert: true, table: true},
		{name: "upsert, distinct", how: "sink", upsert: true, sameKey: true},
		{name: "upsert, distinct, table", how: "sink", upsert: true, sameKey: true, table: true},
		{name: "Write with a BatchTx", how: "write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			pool := newPool(t, 4)
			parent, table, dead := tableName("parent"), tableName("rewrite"), tableName("dead")
			mustExec(t, pool, "CREATE TABLE "+parent+" (id int PRIMARY KEY)")
			mustExec(t, pool, "INSERT INTO "+parent+" SELECT generate_series(0, 9)")
			mustExec(t, pool, fmt.Sprintf(`CREATE TABLE %[1]s (id char(4) PRIMARY KEY,
				parent int NOT NULL CONSTRAINT %[1]s_parent REFERENCES %[2]s (id) DEFERRABLE INITIALLY DEFERRED,
				note text NOT NULL CONSTRAINT %[1]s_note CHECK (note <> 'bad'))`, table, parent))
			t.Cleanup(func() { mustExec(t, pool, "DROP TABLE IF EXISTS "+table+", "+parent+", "+dead) })

			const n = 20
			in := make([]checkedRow, n)
			for i := range in {
				in[i] = checkedRow{ID: fmt.Sprintf("k%02d", i), Parent: int32(i % 10), Note: "ok"}
			}
			in[5].Note = "bad" // rejected at its statement
			in[12].Parent = 99 // rejected at COMMIT
			want := n - 2
			if tc.sameKey {
				in = append(in, checkedRow{ID: "k01 ", Parent: 1, Note: "last"}) // k01 to PostgreSQL
			}
			var mu sync.Mutex
			var letters []string
			opts := []pgpipe.Option{pgpipe.WithChunk(len(in), 0)}
			if tc.upsert {
				opts = append(opts, pgpipe.WithUpsert("id"))
			}
			var dlt *pgpipe.DeadLetterTable[checkedRow]
			if tc.table {
				var err error
				dlt, err = pgpipe.OpenDeadLetterTable[checkedRow](ctx, pool, dead, nil)
				require.NoError(t, err)
				opts = append(opts, pgpipe.WithDeadLetterTable(dlt))
			} else {
				opts = append(opts, pgpipe.WithDeadLetter(func(_ context.Context, dl pipeline.DeadLetter[checkedRow]) error {
					mu.Lock()
					defer mu.Unlock()
					letters = append(letters, dl.Item.ID)
					return nil
				}))
			}
			w := pgpipe.NewWriter(pool, table, pgpipe.Struct[checkedRow](), opts...)
			switch tc.how {
			case "sink":
				p := pipeline.New()
				w.To(pipeline.FromSlice(p, in), "load", 1)
				require.NoError(t, p.Run(ctx))
			case "write":
				require.NoError(t, w.Write(ctx, "load", in, pgpipe.BatchTx{}))
			}
			if tc.table {
				dls, err := dlt.Read(ctx, "load")
				require.NoError(t, err)
				for _, d := range dls {
					letters = append(letters, d.Item.ID)
				}
			}
			slices.Sort(letters)
			assert.Equal(t, []string{"k05", "k12"}, letters, "each rejected row is dead-lettered once")
			assert.Equal(t, int64(2), w.Stats().DeadLettered)
			rows, _ := count(t, pool, table)
			assert.Equal(t, int64(want), rows, "every other row is written")
			if tc.sameKey {
				var note string
				require.NoError(t, pool.QueryRow(ctx, "SELECT note FROM "+table+" WHERE id = 'k01'").Scan(&note))
				assert.Equal(t, "last", note, "the key's last row wins")
			}
		})
	}
}

// TestDistinctUpsertTakesAForwardReferenceAgain upserts, in distinct mode (two rows
// PostgreSQL takes as one key), a batch with a row whose foreign key refers to a row
// later in the batch and a row that breaks a constraint: the search for the bad row
// splits the two, and the forward-referring row, rejected alone, must be tried again
// once the rest is in, as outside distinct mode. It used to be dead-lettered (no retake
// in distinct mode). A later row of its key wins over it, as the key's last row: it is
// then folded, neither written over that row nor dead-lettered. A row with a NULL key
// comes before it (every such row is written, unless the index takes NULLs as one key).
func TestDistinctUpsertTakesAForwardReferenceAgain(t *testing.T) {
	for _, tc := range []struct {
		name     string
		distinct bool // a row whose key PostgreSQL takes as an earlier row's
		later    bool // a row of the forward-referring row's key, later in the batch
		deferred bool // the foreign key is checked at COMMIT, and a row breaks it
		// nulls: the unique index takes NULLs as one key (NULLS NOT DISTINCT), a second
		// row has a NULL key, and the bad row breaks the foreign key (the CHECK's row,
		// rejected first, would have the batch searched before the NULLs meet)
		nulls bool
		// nullRef: the row with a NULL key refers to a later row too, and a second row
		// has a NULL key: whether the two are one key depends on the index, which the
		// writer does not know, so the first stays dead-lettered
		nullRef bool
		nul     bool // the bad row's note has a NUL byte, which the COPY itself rejects
	}{
		{name: "upsert"},
		{name: "distinct", distinct: true},
		{name: "distinct, a later row of its key", distinct: true, later: true},
		{name: "distinct, deferred", distinct: true, deferred: true},
		{name: "distinct, deferred, a later row of its key", distinct: true, later: true, deferred: true},
		{name: "distinct, NULLS NOT DISTINCT, a later row of its key", distinct: true, later: true, nulls: true},
		{name: "distinct, a NULL key refers to a later row", distinct: true, nullRef: true},
		{name: "distinct, a row the COPY rejects, a later row of its key", distinct: true, later: true, nul: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			pool := newPool(t, 4)
			deferred, nulls := "", ""
			if tc.deferred {
				deferred = " DEFERRABLE INITIALLY DEFERRED"
			}
			if tc.nulls {
				nulls = " NULLS NOT DISTINCT"
			}
			table := tableName("forward")
			mustExec(t, pool, fmt.Sprintf(`CREATE TABLE %[1]s (id char(4) UNIQUE%[3]s,
				ref char(4) CONSTRAINT %[1]s_ref REFERENCES %[1]s (id)%[2]s,
				note text NOT NULL CONSTRAINT %[1]s_note CHECK (note <> 'bad'))`, table, deferred, nulls))
			t.Cleanup(func() { mustExec(t, pool, "DROP TABLE IF EXISTS "+table) })

			str := func(s string) *string { return &s }
			const n = 20
			in := make([]refNoteRow, n)
			for i := range in {
				in[i] = refNoteRow{ID: str(fmt.Sprintf("k%02d", i)), Note: "ok"}
			}
			in[2].ID = nil         // a NULL key
			in[3].Ref = str("k15") // refers to a row later in the batch: goes in
			var want []string      // the rows dead-lettered
			switch {
			case tc.nul:
				in[8].Note = "a\x00b" // rejected by the COPY
				want = append(want, "k08")
			case !tc.nulls:
				in[8].Note = "bad" // rejected by the CHECK
				want = append(want, "k08")
			}
			if tc.deferred || tc.nulls {
				in[17].Ref = str("zz") // no such row (deferred: rejected at COMMIT, the batch written again)
				want = append(want, "k17")
			}
			rows := int64(n - len(want))
			if tc.nullRef {
				in[2].Ref = str("k16")
				want = append([]string{"<nil>"}, want...)
				rows-- // in[2]
			}
			if tc.distinct {
				in = append(in, refNoteRow{ID: str("k01 "), Note: "last"}) // k01 to PostgreSQL
			}
			if tc.later {
				in = append(in, refNoteRow{ID: str("k03 "), Note: "later"}) // k03 to PostgreSQL
			}
			if tc.nulls || tc.nullRef {
				in = append(in, refNoteRow{Note: "last null"}) // the NULL key's last row
				if tc.nullRef {
					rows++ // a key of its own
				}
			}
			var mu sync.Mutex
			var letters []string
			w := pgpipe.NewWriter(pool, table, pgpipe.Struct[refNoteRow](), pgpipe.WithUpsert("id"), pgpipe.WithChunk(len(in), 0),
				pgpipe.WithDeadLetter(func(_ context.Context, dl pipeline.DeadLetter[refNoteRow]) error {
					mu.Lock()
					defer mu.Unlock()
					id := "<nil>"
					if dl.Item.ID != nil {
						id = *dl.Item.ID
					}
					letters = append(letters, id)
					return nil
				}))
			p := pipeline.New()
			w.To(pipeline.FromSlice(p, in), "load", 1)
			require.NoError(t, p.Run(ctx))

			slices.Sort(letters)
			assert.Equal(t, want, letters, "only the rows that break a constraint are dead-lettered, once")
			assert.Equal(t, int64(len(want)), w.Stats().DeadLettered)
			load, ok := p.Report().Stage("load")
			require.True(t, ok)
			assert.Equal(t, int64(len(want)), load.SetAside, "rejected rows in the sink's row")
			var got int64
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&got))
			assert.Equal(t, rows, got, "every other row is written")
			var ref *string
			var note string
			require.NoError(t, pool.QueryRow(ctx, "SELECT ref, note FROM "+table+" WHERE id = 'k03'").Scan(&ref, &note))
			if tc.later {
				assert.Equal(t, "later", note, "the key's last row wins")
				assert.Nil(t, ref)
			} else {
				assert.Equal(t, "ok", note)
				require.NotNil(t, ref)
				assert.Equal(t, "k15 ", *ref, "the forward-referring row is written")
			}
			if tc.distinct {
				require.NoError(t, pool.QueryRow(ctx, "SELECT note FROM "+table+" WHERE id = 'k01'").Scan(&note))
				assert.Equal(t, "last", note, "the key's last row wins")
			}
			if tc.nulls || tc.nullRef {
				require.NoError(t, pool.QueryRow(ctx, "SELECT note FROM "+table+" WHERE id IS NULL").Scan(&note))
				assert.Equal(t, "last null", note, "the NULL key's last row")
			}
		})
	}
}

// refNoteRow is a row of a table with a foreign key to its own table on ref and a CHECK
// on note.
type refNoteRow struct {
	ID   *string `db:"id"`
	Ref  *string `db:"ref"`
	Note string  `db:"note"`
}

// checkedRow is a row of a table with a CHECK on note and a deferred foreign key on
// parent.
type checkedRow struct {
	ID     string `db:"id"`
	Parent int32  `db:"parent"`
	Note   string `db:"note"`
}

// TestFatalErrors checks that what no retry can fix stops the run at once, with a
// message naming the table, the column, the role or the database.
func TestFatalErrors(t *testing.T) {
	pool := newPool(t, 4)
	table := createEvents(t, pool, false)
	mustExec(t, pool, `DO $$ BEGIN CREATE ROLE pgpipe_reader LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`)
	withURL := func(t *testing.T, f func(u *url.URL)) *pgxpool.Pool {
		t.Helper()
		u, err := url.Parse(dbURL(t))
		require.NoError(t, err)
		f(u)
		cfg, err := pgxpool.ParseConfig(u.String())
		require.NoError(t, err)
		p, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	cases := []struct {
		name string
		run  func(t *testing.T) error
		want []string
	}{
		{"missing table", func(t *testing.T) error {
			return runEvents(t, pgpipe.NewWriter(pool, "no_such_table", pgpipe.Struct[event]()))
		}, []string{"no_such_table", "does not exist"}},
		{"missing column", func(t *testing.T) error {
			w := pgpipe.NewWriter(pool, table, pgpipe.Func([]string{"id", "name", "score", "no_such_column"},
				func(e event) []any { return []any{e.ID, e.Name, e.Score, 1} }))
			return runEvents(t, w)
		}, []string{table, "no_such_column"}},
		{"permission denied", func(t *testing.T) error {
			p := withURL(t, func(u *url.URL) { u.User = url.User("pgpipe_reader") })
			return runEvents(t, pgpipe.NewWriter(p, table, pgpipe.Struct[event]()))
		}, []string{`role "pgpipe_reader"`, table}},
		{"unknown role", func(t *testing.T) error {
			p := withURL(t, func(u *url.URL) { u.User = url.User("pgpipe_nobody") })
			return runEvents(t, pgpipe.NewWriter(p, table, pgpipe.Struct[event]()))
		}, []string{`role "pgpipe_nobody"`}},
		{"unknown database", func(t *testing.T) error {
			p := withURL(t, func(u *url.URL) { u.Path = "/pgpipe_no_such_db" })
			return runEvents(t, pgpipe.NewWriter(p, table, pgpipe.Struct[event]()))
		}, []string{`database "pgpipe_no_such_db"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.run(t)
			require.Error(t, err)
			for _, s := range c.want {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

func runEvents(t *testing.T, w *pgpipe.Writer[event]) error {
	t.Helper()
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, events(10)), "load", 1)
	err := p.Run(t.Context())
	assert.Zero(t, p.Report().Stages[1].Retried, "a fatal error is not retried")
	return err
}

// TestStructTypes writes a struct of every type the writer encodes itself, and of some
// it hands to pgx (a named type, a pointer, a time), and reads it back.
func TestStructTypes(t *testing.T) {
	type status string
	type allTypes struct {
		I64    int64
		I      int
		I32    int32
		I16    int16
		S      string
		V      string
		F64    float64
		F32    float32
		B      bool
		Bytes  []byte
		NilB   []byte
		Status status
		Ptr    *string
		NilPtr *int64
		At     time.Time
		Small  int64 // into int2
	}
	pool := newPool(t, 2)
	table := createTable(t, pool, "types", `(i64 bigint, i bigint, i32 int, i16 smallint, s text, v varchar(20),
		f64 float8, f32 float4, b bool, bytes bytea, nil_b bytea, status text, ptr text, nil_ptr bigint, at timestamptz, small int2)`)
	s := "pointed"
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	want := allTypes{
		I64: -1 << 40, I: 42, I32: -7, I16: 300, S: "héllo", V: "v", F64: 1.25, F32: -2.5, B: true,
		Bytes: []byte{0, 1, 2}, Status: "active", Ptr: &s, At: at, Small: -3,
	}
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[allTypes]())
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, []allTypes{want}), "load", 1)
	require.NoError(t, p.Run(t.Context()))
	var got allTypes
	var st string
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT i64, i, i32, i16, s, v, f64, f32, b, bytes, nil_b, status, ptr, nil_ptr, at, small FROM "+table).Scan(
		&got.I64, &got.I, &got.I32, &got.I16, &got.S, &got.V, &got.F64, &got.F32, &got.B, &got.Bytes, &got.NilB, &st, &got.Ptr, &got.NilPtr, &got.At, &got.Small))
	got.Status = status(st)
	got.At = got.At.UTC()
	assert.Equal(t, want, got)

	// A value out of range for its column is the row's fault, found without bisection.
	p = pipeline.New()
	bad := want
	bad.Small = 1 << 20
	dl := pipeline.NewDeadLetterBuffer[allTypes](10)
	w = pgpipe.NewWriter(pool, table, pgpipe.Struct[allTypes](), pgpipe.WithDeadLetter(dl.Add))
	w.To(pipeline.FromSlice(p, []allTypes{want, bad, want}), "load", 1)
	require.NoError(t, p.Run(t.Context()))
	require.Len(t, dl.Items(), 1)
	assert.Contains(t, dl.Items()[0].LastError, "out of range for int2")
	assert.Equal(t, int64(2), w.Stats().Rows)
}

// TestEncodeErrorNamesColumn writes an int4 overflow, which the driver rejects before
// sending, through a struct mapping and a func mapping: the error names the column
// ("small"), where it used to give its index ("column 2").
func TestEncodeErrorNamesColumn(t *testing.T) {
	pool := newPool(t, 2)
	table := createTable(t, pool, "enc", "(id bigint, name text, small int4)")
	type row struct {
		ID    int64  `db:"id"`
		Name  string `db:"name"`
		Small int64  `db:"small"`
	}
	mappings := map[string]pgpipe.Mapping[row]{
		"struct": pgpipe.Struct[row](),
		"func": pgpipe.Func([]string{"id", "name", "small"}, func(r row) []any {
			return []any{r.ID, r.Name, r.Small}
		}),
	}
	for name, m := range mappings {
		t.Run(name, func(t *testing.T) {
			in := []row{{1, "a", 1}, {2, "b", math.MaxInt32 + 1}, {3, "c", 3}}
			dl := pipeline.NewDeadLetterBuffer[row](10)
			w := pgpipe.NewWriter(pool, table, m, pgpipe.WithDeadLetter(dl.Add))
			p := pipeline.New()
			w.To(pipeline.FromSlice(p, in), "load", 1)
			require.NoError(t, p.Run(t.Context()))
			require.Len(t, dl.Items(), 1)
			assert.Contains(t, dl.Items()[0].LastError, `column "small"`)

			w = pgpipe.NewWriter(pool, table, m) // no dead-letter destination: the run fails
			p = pipeline.New()
			w.To(pipeline.FromSlice(p, in), "load", 1)
			err := p.Run(t.Context())
			re, ok := errors.AsType[*pgpipe.RowError](err)
			require.True(t, ok, "%v", err)
			assert.Equal(t, "small", re.Column)
			assert.Contains(t, re.Error(), `column "small"`)
		})
	}
}

// repeatedKeys returns n rows whose ids repeat: about share of them reuse an earlier
// id. Each row's name is its position, so the last row of each id is known.
func repeatedKeys(n int, share float64) (rows []event, last map[int64]string) {
	r := rand.New(rand.NewPCG(1, 2))
	rows = make([]event, n)
	last = map[int64]string{}
	next := int64(0)
	for i := range rows {
		id := next
		if i > 0 && r.Float64() < share {
			id = r.Int64N(next) // an earlier id
		} else {
			next++
		}
		rows[i] = event{ID: id, Name: "pos " + strconv.Itoa(i), Score: float64(i)}
		last[id] = rows[i].Name
	}
	return rows, last
}

// staleKeys returns how many ids of table do not hold their last value.
func staleKeys(t *testing.T, pool *pgxpool.Pool, table string, last map[int64]string) int {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT id, name FROM "+table)
	require.NoError(t, err)
	got := map[int64]string{}
	for rows.Next() {
		var (
			id   int64
			name string
		)
		require.NoError(t, rows.Scan(&id, &name))
		got[id] = name
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, len(last), "every id is in the table")
	stale := 0
	for id, want := range last {
		if got[id] != want {
			stale++
		}
	}
	return stale
}

// TestUpsertWritersMeetOnAConnection runs two upsert writers one after the other on a
// pool of one connection, where each stages its rows in a temporary table: writers of
// other columns of one table, and writers of two tables whose names met once "." was
// replaced ("s.t" and "s_t"). Each has its own temporary table: the second found the
// first's (same name), without its columns, and failed the run.
func TestUpsertWritersMeetOnAConnection(t *testing.T) {
	t.Parallel()
	type ra struct {
		ID int64  `db:"id"`
		A  string `db:"a"`
	}
	type rb struct {
		ID int64  `db:"id"`
		B  string `db:"b"`
	}
	t.Run("other columns of one table", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, 1)
		table := createTable(t, pool, "wide", "(id bigint PRIMARY KEY, a text, b text)")
		p := pipeline.New()
		pgpipe.NewWriter(pool, table, pgpipe.Struct[ra](), pgpipe.WithUpsert("id")).To(pipeline.FromSlice(p, []ra{{1, "a1"}, {2, "a2"}}), "a", 1)
		require.NoError(t, p.Run(t.Context()))
		p = pipeline.New()
		pgpipe.NewWriter(pool, table, pgpipe.Struct[rb](), pgpipe.WithUpsert("id")).To(pipeline.FromSlice(p, []rb{{1, "b1"}, {2, "b2"}}), "b", 1)
		require.NoError(t, p.Run(t.Context()))
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table+" WHERE a IS NOT NULL AND b IS NOT NULL").Scan(&n))
		assert.Equal(t, 2, n)
	})
	t.Run("tables whose names met", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, 1)
		schema := tableName("ws")
		_, err := pool.Exec(t.Context(), "CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+".t (id bigint PRIMARY KEY, a text); CREATE TABLE "+schema+"_t (id bigint PRIMARY KEY, b text)")
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE; DROP TABLE IF EXISTS "+schema+"_t")
			assert.NoError(t, err)
		})
		p := pipeline.New()
		pgpipe.NewWriter(pool, schema+".t", pgpipe.Struct[ra](), pgpipe.WithUpsert("id")).To(pipeline.FromSlice(p, []ra{{1, "a1"}}), "a", 1)
		require.NoError(t, p.Run(t.Context()))
		p = pipeline.New()
		pgpipe.NewWriter(pool, schema+"_t", pgpipe.Struct[rb](), pgpipe.WithUpsert("id")).To(pipeline.FromSlice(p, []rb{{1, "b1"}, {2, "b2"}}), "b", 1)
		require.NoError(t, p.Run(t.Context()))
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+schema+"_t").Scan(&n))
		assert.Equal(t, 2, n)
	})
}

// TestChunkBytesCountsEveryKindOfValue writes rows of about 2 KB each in a column of a
// named byte-slice type (json.RawMessage), an array and a map, with WithChunk's bound
// of 10,000 bytes: the batches keep to it (about 5 rows each). Only a plain string or
// []byte was measured, anything else counted 12 bytes: one batch of 200 KB.
func TestChunkBytesCountsEveryKindOfValue(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 2)
	table := createTable(t, pool, "chunky", "(id bigint, doc jsonb, tags text[], attrs jsonb)")
	type doc struct {
		ID    int64             `db:"id"`
		Doc   json.RawMessage   `db:"doc"`
		Tags  []string          `db:"tags"`
		Attrs map[string]string `db:"attrs"`
	}
	pad := strings.Repeat("x", 600)
	in := make([]doc, 100)
	for i := range in {
		in[i] = doc{int64(i), json.RawMessage(`{"pad":"` + pad + `"}`), []string{pad}, map[string]string{"pad": pad}}
	}
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[doc](), pgpipe.WithChunk(1000, 10_000))
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, in), "load", 1)
	require.NoError(t, p.Run(t.Context()))
	rows, _ := count(t, pool, table)
	require.Equal(t, int64(100), rows)
	assert.GreaterOrEqual(t, w.Stats().Batches, int64(20), "about 190 KB in batches of at most 10 KB")
}

// TestUpsertKeepsLastValuePerKey upserts 20,000 rows, 30 % of them repeating an earlier
// id, with 4 writers: without a checkpoint, with one, and with one while a trigger
// fails some batches now and then with a serialization failure (retried): every id
// holds the value of its last row in source order. Batches went to whichever writer
// was free, so a later batch could commit before an earlier one with the same id, and
// hundreds of ids held an older value.
func TestUpsertKeepsLastValuePerKey(t *testing.T) {
	for _, variant := range []string{"plain", "checkpoint", "retries"} {
		t.Run(variant, func(t *testing.T) {
			pool := newPool(t, 8)
			table := createEvents(t, pool, true)
			if variant == "retries" {
				// Each row with id%50 == 0 fails its transaction with a chance of 1 in 20,
				// drawn anew at every attempt: a part of k such rows fails an attempt
				// with 1-0.95^k (0.40 for the usual 10). (A sequence drawn by those rows,
				// failing at every 20th draw, failed every attempt of a part with 20 or
				// more of them while it ran alone: 30 attempts, and the run failed.)
				fail := table + "_fail"
				mustExec(t, pool, fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
					IF NEW.id %% 50 = 0 AND random() < 0.05 THEN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END IF;
					RETURN NEW; END $$`, fail))
				mustExec(t, pool, fmt.Sprintf("CREATE TRIGGER %s BEFORE INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s()", fail, table, fail))
				t.Cleanup(func() {
					mustExec(t, pool, "DROP TABLE IF EXISTS "+table)
					mustExec(t, pool, "DROP FUNCTION IF EXISTS "+fail+"()")
				})
			}
			in, last := repeatedKeys(20000, 0.3)
			p := pipeline.New()
			opts := []pgpipe.Option{pgpipe.WithUpsert("id"), pgpipe.WithChunk(500, 0), pgpipe.WithRetry(30, pipeline.ConstantBackoff(time.Millisecond))}
			var src *pipeline.Stream[event]
			if variant != "plain" {
				store := pgpipe.NewCheckpoint(pool, tableName("job"))
				opts = append(opts, pgpipe.WithCheckpoint(store))
				src = pipeline.FromCheckpoint(p, store, func(_ context.Context, pos int64) iter.Seq2[event, error] {
					return func(yield func(event, error) bool) {
						for _, e := range in[pos:] {
							if !yield(e, nil) {
								return
							}
						}
					}
				})
			} else {
				src = pipeline.FromSlice(p, in)
			}
			w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), opts...)
			w.To(src, "load", 4)
			require.NoError(t, p.Run(t.Context()))
			stale := staleKeys(t, pool, table, last)
			st, _ := p.Report().Stage("load")
			t.Logf("%d ids, %d hold an older value; %d parts retried; %+v", len(last), stale, st.Retried, w.Stats())
			assert.Zero(t, stale, "ids holding an older value")
			if variant == "retries" {
				assert.Positive(t, st.Retried, "the trigger failed some parts")
			}
		})
	}
}

// BenchmarkCheckpointedWriters writes 20,000 rows in checkpointed batches of 100, one
// transaction each, with 1 and 4 writers: with small batches the commits' round trips
// (and anything that makes one writer wait for another's) weigh most.
func BenchmarkCheckpointedWriters(b *testing.B) {
	const n, batch = 20000, 100
	pool := newPool(b, 8)
	table := createEvents(b, pool, false)
	in := events(n)
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("workers=%d/batch=%d", workers, batch), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				mustExec(b, pool, "TRUNCATE "+table)
				ck := pgpipe.NewCheckpoint(pool, tableName("bench_job"))
				p := pipeline.New()
				src := pipeline.FromCheckpoint(p, ck, func(_ context.Context, pos int64) iter.Seq2[event, error] {
					return func(yield func(event, error) bool) {
						for _, e := range in[pos:] {
							if !yield(e, nil) {
								return
							}
						}
					}
				}, pipeline.WithSaveEvery(batch))
				w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), pgpipe.WithCheckpoint(ck), pgpipe.WithChunk(batch, 0))
				w.To(src, "load", workers)
				b.StartTimer()
				if err := p.Run(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
