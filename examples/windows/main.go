// Command windows writes per-minute totals per customer into PostgreSQL from an
// out-of-order stream of orders, exactly once across a crash.
//
// The orders are generated from their position (-n of them, 10 ms of event time
// apart, one in 20 up to 5 s late), so that a resumed run reads the same stream. A
// Window stage sums them per customer and minute (tumbling windows, a watermark 10 s
// behind the latest order), and pgpipe upserts each window's total into the table
// windows_totals by customer and minute, with the run's checkpoint in the same
// transaction: an order settles once its minute is committed, and a resumed run reads
// again exactly the orders of the minutes not committed.
//
// -crash-after k makes the process exit at once (status 3, as a SIGKILL would leave
// it: no cleanup, transactions in flight rolled back) once k more rows are in the
// table; run it again without the flag and it resumes. A run that ends checks every
// row against the totals computed from the stream and prints how many windows there
// are; it exits 0 when every one is right, 1 otherwise.
//
//	export DATABASE_URL=$(scripts/postgres.sh start)
//	go run . -fresh -crash-after 100; go run .
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

const (
	table = "windows_totals"
	job   = "examples-windows"
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// order is an event of the stream: a customer's order at a moment.
type order struct {
	Customer string
	At       time.Time
	Cents    int64
}

// start is the event time of the first order.
var start = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)

// orderAt returns the order at position i: the stream is a function of the position.
func orderAt(i int64) order {
	at := start.Add(time.Duration(i) * 10 * time.Millisecond)
	if i%20 == 7 {
		at = at.Add(-time.Duration(i*37%5000) * time.Millisecond) // up to 5 s out of order
	}
	return order{Customer: fmt.Sprintf("c%02d", i*7919%50), At: at, Cents: 1 + i*31%997}
}

// total is a row of the table: a customer's orders in one minute.
type total struct {
	Customer string
	Minute   time.Time
	Cents    int64
	Orders   int
}

func realMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("windows", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int64("n", 100_000, "orders in the stream")
	db := fs.String("db", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
	fresh := fs.Bool("fresh", false, "start over: empty the table and forget the checkpoint")
	crashAfter := fs.Int64("crash-after", 0, "exit at once once this many more rows are in the table (0: never)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *db == "" {
		say(stderr, "windows: need -db or DATABASE_URL")
		return 2
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *db)
	if err != nil {
		say(stderr, "windows:", err)
		return 1
	}
	defer pool.Close()
	if err := prepare(ctx, pool, *fresh); err != nil {
		say(stderr, "windows:", err)
		return 1
	}
	store := pgpipe.NewCheckpoint(pool, job)

	p := pipeline.New()
	orders := pipeline.FromCheckpoint(p, store, func(_ context.Context, pos int64) iter.Seq2[order, error] {
		return func(yield func(order, error) bool) {
			for i := pos; i < *n; i++ {
				if !yield(orderAt(i), nil) {
					return
				}
			}
		}
	}, pipeline.WithSaveEvery(5000),
		pipeline.WithMaxRedo(200_000)) // room for the orders of the minutes open at once
	perMinute := pipeline.Window(orders, pipeline.Tumbling(time.Minute),
		func(o order) string { return o.Customer }, func(o order) time.Time { return o.At },
		pipeline.Fold(total{}, func(t total, o order) total { t.Cents += o.Cents; t.Orders++; return t }),
		pipeline.WithMaxDelay(10*time.Second))
	rows := pipeline.Map(perMinute, func(r pipeline.WindowResult[string, total]) total {
		return total{Customer: r.Key, Minute: r.Start, Cents: r.Value.Cents, Orders: r.Value.Orders}
	})
	w := pgpipe.NewWriter(pool, table, pgpipe.Func([]string{"customer", "minute", "cents", "orders"}, func(t total) []any {
		return []any{t.Customer, t.Minute, t.Cents, int32(t.Orders)}
	}), pgpipe.WithUpsert("customer", "minute"), pgpipe.WithCheckpoint(store), pgpipe.WithChunk(20, 0))
	w.To(rows, "totals", 1) // one writer: see TestSIGKILLAndResume

	if *crashAfter > 0 {
		go crash(ctx, pool, *crashAfter, stderr)
	}
	if err := p.Run(ctx); err != nil {
		say(stderr, "windows:", err)
		return 1
	}
	src, _ := p.Report().Stage("FromCheckpoint")
	s, _ := p.Report().Stage("Window")
	sayf(stdout, "run: %d orders read (%d settled by earlier runs), %d windows written, %d late\n",
		src.In, src.Resumed, s.Out, s.DeadLettered)
	return check(ctx, pool, *n, stdout, stderr)
}

// crash exits the process at once, as a SIGKILL would, once the table holds k rows
// more than when it started: the run is cut wherever it is.
func crash(ctx context.Context, pool *pgxpool.Pool, k int64, stderr io.Writer) {
	var base, n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&base); err != nil {
		return
	}
	for {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			return
		}
		if n-base >= k {
			say(stderr, "windows: crashing on purpose after", n-base, "rows")
			os.Exit(3)
		}
		time.Sleep(time.Millisecond)
	}
}

// say and sayf print a line of the command's output: a write error has nowhere to go.
func say(w io.Writer, a ...any)                 { _, _ = fmt.Fprintln(w, a...) }
func sayf(w io.Writer, format string, a ...any) { _, _ = fmt.Fprintf(w, format, a...) }

// prepare creates the table, or with fresh empties it and forgets the checkpoint.
func prepare(ctx context.Context, pool *pgxpool.Pool, fresh bool) error {
	stmts := []string{`CREATE TABLE IF NOT EXISTS ` + table + ` (
		customer text NOT NULL, minute timestamptz NOT NULL, cents bigint NOT NULL, orders int NOT NULL,
		PRIMARY KEY (customer, minute))`}
	if fresh {
		stmts = append(stmts, `TRUNCATE `+table,
			`DELETE FROM pgpipe_checkpoint WHERE job = '`+job+`'`,
			`DELETE FROM pgpipe_committed WHERE job = '`+job+`'`,
			`DELETE FROM pgpipe_commit_marks WHERE job = '`+job+`'`)
	}
	for _, q := range stmts {
		if _, err := pool.Exec(ctx, q); err != nil && !missingTable(err) {
			return err
		}
	}
	return nil
}

// missingTable tells an error of a fresh start before pgpipe made its tables.
func missingTable(err error) bool {
	var pe interface{ SQLState() string }
	return errors.As(err, &pe) && pe.SQLState() == "42P01"
}

// check compares every row of the table with the totals of the stream, computed here
// without windows (no order is later than the watermark's delay, so none is late).
func check(ctx context.Context, pool *pgxpool.Pool, n int64, stdout, stderr io.Writer) int {
	type key struct {
		customer string
		minute   time.Time
	}
	want := map[key]total{}
	for i := range n {
		o := orderAt(i)
		k := key{o.Customer, o.At.Truncate(time.Minute)}
		t := want[k]
		t.Cents += o.Cents
		t.Orders++
		want[k] = t
	}
	rows, err := pool.Query(ctx, `SELECT customer, minute, cents, orders FROM `+table)
	if err != nil {
		say(stderr, "windows:", err)
		return 1
	}
	defer rows.Close()
	got, bad := 0, 0
	for rows.Next() {
		var t total
		if err := rows.Scan(&t.Customer, &t.Minute, &t.Cents, &t.Orders); err != nil {
			say(stderr, "windows:", err)
			return 1
		}
		got++
		w, ok := want[key{t.Customer, t.Minute.UTC()}]
		if !ok || w.Cents != t.Cents || w.Orders != t.Orders {
			bad++
			if bad <= 5 {
				sayf(stderr, "windows: %s %s: %d cents in %d orders, want %d in %d\n",
					t.Customer, t.Minute.UTC().Format(time.RFC3339), t.Cents, t.Orders, w.Cents, w.Orders)
			}
		}
	}
	if err := rows.Err(); err != nil {
		say(stderr, "windows:", err)
		return 1
	}
	if bad > 0 || got != len(want) {
		sayf(stderr, "windows: %d rows, %d wrong; want %d\n", got, bad, len(want))
		return 1
	}
	sayf(stdout, "%d windows, every one equal to the total of its orders\n", got)
	return 0
}
