package pgpipe_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// TestReplay dead-letters rows with a NUL byte, then replays them from the dead-letter
// table through a fix and the same writer.
func TestReplay(t *testing.T) {
	pool := newPool(t, 4)
	table, dead := createEvents(t, pool, true), tableName("dead")
	t.Cleanup(func() { mustExec(t, pool, "DROP TABLE IF EXISTS "+dead) })
	dlt, err := pgpipe.OpenDeadLetterTable[event](t.Context(), pool, dead, nil)
	require.NoError(t, err)
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), pgpipe.WithDeadLetterTable(dlt), pgpipe.WithUpsert("id"))
	in := events(1000)
	for _, i := range []int{3, 500, 999} {
		in[i].Name = "bad\x00name"
	}
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, in), "load", 2)
	require.NoError(t, p.Run(t.Context()))
	rows, _ := count(t, pool, table)
	require.Equal(t, int64(997), rows)

	p = pipeline.New()
	fixed := pipeline.Map(pgpipe.Replay(p, dlt, "load"), func(e event) event {
		e.Name = strings.ReplaceAll(e.Name, "\x00", "")
		return e
	})
	w.To(fixed, "reload", 1)
	require.NoError(t, p.Run(t.Context()))
	rows, _ = count(t, pool, table)
	assert.Equal(t, int64(1000), rows)
	var name string
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT name FROM "+table+" WHERE id = 500").Scan(&name))
	assert.Equal(t, "badname", name)
	dls, err := dlt.Read(t.Context(), "")
	require.NoError(t, err)
	assert.Len(t, dls, 3, "replaying does not delete")
}

// TestMisuse checks that misconfiguration panics at construction with a pgpipe: message.
func TestMisuse(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never connects
	require.NoError(t, err)
	defer pool.Close()
	m := pgpipe.Struct[event]()
	cases := map[string]func(){
		"nil pool":          func() { pgpipe.NewWriter(nil, "t", m) },
		"no table":          func() { pgpipe.NewWriter(pool, "", m) },
		"no mapping":        func() { pgpipe.NewWriter(pool, "t", pgpipe.Mapping[event]{}) },
		"key not mapped":    func() { pgpipe.NewWriter(pool, "t", m, pgpipe.WithUpsert("nope")) },
		"no key":            func() { pgpipe.WithUpsert() },
		"no skip key":       func() { pgpipe.WithSkipExisting() },
		"chunk":             func() { pgpipe.WithChunk(0, 0) },
		"retry":             func() { pgpipe.WithRetry(0, nil) },
		"nil checkpoint":    func() { pgpipe.WithCheckpoint(nil) },
		"dead letter type":  func() { pgpipe.NewWriter(pool, "t", m, pgpipe.WithDeadLetter(pipeline.DiscardDeadLetter[int])) },
		"dead letter table": func() { pgpipe.NewWriter(pool, "t", m, pgpipe.WithDeadLetterTable(&pgpipe.DeadLetterTable[int]{})) },
		"nil option":        func() { pgpipe.NewWriter(pool, "t", m, nil) },
		"not a struct":      func() { pgpipe.Struct[int]() },
		"no fields":         func() { pgpipe.Struct[struct{ x int }]() },
		"unwritable field": func() {
			pgpipe.Struct[struct {
				ID   int64
				Done chan int
			}]()
		},
		"duplicate column":   func() { pgpipe.Func([]string{"a", "a"}, func(int) []any { return nil }) },
		"nil values":         func() { pgpipe.Func[int]([]string{"a"}, nil) },
		"checkpoint without": func() { pgpipe.NewCheckpoint(pool, "") },
		"replay nil":         func() { pgpipe.Replay[int](pipeline.New(), nil, "") },
	}
	for name, f := range cases {
		func() {
			defer func() {
				v := recover()
				msg, ok := v.(string)
				if assert.True(t, ok, "%s: want a panic with a message, got %#v", name, v) {
					assert.True(t, strings.HasPrefix(msg, "pgpipe:") || strings.HasPrefix(msg, "pipeline:"), "%s: %s", name, msg)
				}
			}()
			f()
		}()
	}
}

// TestChunkBytes bounds batches by bytes as well as rows.
func TestChunkBytes(t *testing.T) {
	pool := newPool(t, 4)
	table := createEvents(t, pool, false)
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[event](), pgpipe.WithChunk(1000, 4000))
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, events(5000)), "load", 2)
	require.NoError(t, p.Run(t.Context()))
	rows, _ := count(t, pool, table)
	assert.Equal(t, int64(5000), rows)
	// About 40 bytes a row: about 100 rows a batch, not 1,000.
	assert.Greater(t, w.Stats().Batches, int64(40))
	rep, _ := p.Report().Stage("Batch")
	assert.Positive(t, rep.Flushes.Bytes)
}

// TestMappingFailure checks that a mapping that panics, or returns the wrong number of
// values, fails the run with a fatal error instead of crashing the process or blaming
// a row.
func TestMappingFailure(t *testing.T) {
	pool := newPool(t, 2)
	table := createEvents(t, pool, false)
	for name, values := range map[string]func(event) []any{
		"panics": func(e event) []any {
			if e.ID == 7 {
				panic("boom")
			}
			return []any{e.ID, e.Name, e.Score}
		},
		"short": func(e event) []any { return []any{e.ID} },
	} {
		w := pgpipe.NewWriter(pool, table, pgpipe.Func([]string{"id", "name", "score"}, values),
			pgpipe.WithDeadLetter(pipeline.DiscardDeadLetter[event]))
		p := pipeline.New()
		w.To(pipeline.FromSlice(p, events(100)), "load", 1)
		err := p.Run(t.Context())
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "row mapping", name)
		assert.Zero(t, w.Stats().DeadLettered, name)
	}
}

// TestStringsIntoOtherTypes writes strings into numeric and date columns, which
// PostgreSQL reads as text, as pgx's own CopyFrom does.
func TestStringsIntoOtherTypes(t *testing.T) {
	pool := newPool(t, 2)
	table := createTable(t, pool, "text", "(n int, amount numeric(8,2), day date)")
	type csvRow struct {
		N      string `db:"n"`
		Amount string `db:"amount"`
		Day    string `db:"day"`
	}
	dl := pipeline.NewDeadLetterBuffer[csvRow](10)
	for _, m := range []pgpipe.Mapping[csvRow]{
		pgpipe.Struct[csvRow](),
		pgpipe.Func([]string{"n", "amount", "day"}, func(r csvRow) []any { return []any{r.N, r.Amount, r.Day} }),
	} {
		w := pgpipe.NewWriter(pool, table, m, pgpipe.WithDeadLetter(dl.Add))
		p := pipeline.New()
		w.To(pipeline.FromSlice(p, []csvRow{{"42", "12.50", "2026-12-01"}, {"x", "1", "2026-12-01"}}), "load", 1)
		require.NoError(t, p.Run(t.Context()))
	}
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table+" WHERE n = 42 AND amount = 12.5 AND day = '2026-12-01'").Scan(&n))
	assert.Equal(t, 2, n)
	assert.Len(t, dl.Items(), 2, "\"x\" is not an int")
}
