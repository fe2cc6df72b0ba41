package pgpipe_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// Order is the row type of the examples.
type Order struct {
	ID       int64  `db:"id"`
	Customer string `db:"customer"`
	Cents    int64  `db:"amount_cents"`
}

func orders(n int) []Order {
	out := make([]Order, n)
	for i := range out {
		out[i] = Order{ID: int64(i), Customer: fmt.Sprintf("c%d", i%10), Cents: int64(i) * 100}
	}
	return out
}

// fromPosition is a FromCheckpoint function over all: the orders from position pos on.
func fromPosition(all []Order) func(context.Context, int64) iter.Seq2[Order, error] {
	return func(_ context.Context, pos int64) iter.Seq2[Order, error] {
		return func(yield func(Order, error) bool) {
			for _, o := range all[pos:] {
				if !yield(o, nil) {
					return
				}
			}
		}
	}
}

// examplePool opens a pool on $DATABASE_URL; the examples need a server, so they are
// compiled but not run (they have no Output comment).
func examplePool(ctx context.Context) *pgxpool.Pool {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	return pool
}

// This example shows the whole connector: a checkpointed job that upserts orders with
// four writers, dead-letters the rows PostgreSQL rejects into a table, and records its
// progress in the same transactions, so that a restart resumes exactly.
func Example() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()

	dead, err := pgpipe.OpenDeadLetterTable[Order](ctx, pool, "orders_dead", nil)
	if err != nil {
		panic(err)
	}
	store := pgpipe.NewCheckpoint(pool, "import-orders")
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order](),
		pgpipe.WithUpsert("id"), pgpipe.WithCheckpoint(store), pgpipe.WithDeadLetterTable(dead),
		pgpipe.WithChunk(5000, 8<<20))

	all := orders(100000)
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, store, fromPosition(all))
	w.To(src, "load", 4)
	if err := p.Run(ctx); errors.Is(err, pgpipe.ErrFenced) {
		fmt.Println("another instance took the job over")
	} else if err != nil {
		panic(err)
	}
	fmt.Printf("%+v\n", w.Stats())
}

// This example shows a plain insert with a struct mapping: the columns come from the
// db tags.
func ExampleNewWriter() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order]())
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, orders(20000)), "load", 2)
	if err := p.Run(ctx); err != nil {
		panic(err)
	}
}

// This example shows the columns a struct mapping derives.
func ExampleStruct() {
	fmt.Println(pgpipe.Struct[Order]().Columns())
	type Event struct {
		EventID   int64
		UserName  string
		Internal  string `db:"-"`
		CreatedAt string
	}
	fmt.Println(pgpipe.Struct[Event]().Columns())
	// Output:
	// [id customer amount_cents]
	// [event_id user_name created_at]
}

// This example shows a mapping by function, for rows that are not structs.
func ExampleFunc() {
	m := pgpipe.Func([]string{"key", "value"}, func(kv [2]string) []any { return []any{kv[0], kv[1]} })
	fmt.Println(m.Columns())
	// Output: [key value]
}

// This example shows the column names of a mapping.
func ExampleMapping_Columns() {
	fmt.Println(len(pgpipe.Struct[Order]().Columns()))
	// Output: 3
}

// This example shows the writer's sink used with ToBatches directly.
func ExampleWriter_Sink() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order]())
	p := pipeline.New()
	pipeline.ToBatches(pipeline.FromSlice(p, orders(1000)), 250, w.Sink("load", 2))
	if err := p.Run(ctx); err != nil {
		panic(err)
	}
}

// This example shows a writer attached to a stream with To.
func ExampleWriter_To() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order](), pgpipe.WithChunk(10000, 0))
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, orders(50000)), "load", 1)
	if err := p.Run(ctx); err != nil {
		panic(err)
	}
}

// This example shows the writer's counts after a run.
func ExampleWriter_Stats() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order]())
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, orders(100)), "load", 1)
	_ = p.Run(ctx)
	st := w.Stats()
	fmt.Println(st.Rows, st.DeadLettered, st.Bisected, st.RoundTrips)
}

// This example shows an upsert: the last row of each key wins.
func ExampleWithUpsert() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order](), pgpipe.WithUpsert("id"))
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, []Order{{ID: 1, Cents: 100}, {ID: 1, Cents: 250}}), "load", 1)
	_ = p.Run(ctx) // order 1 costs 250 cents
}

// This example shows an insert that leaves rows already in the table alone.
func ExampleWithSkipExisting() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order](), pgpipe.WithSkipExisting("id"))
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, orders(10)), "load", 1)
	_ = p.Run(ctx)
}

// This example shows batches bounded by rows and by bytes.
func ExampleWithChunk() {
	_ = pgpipe.WithChunk(5000, 4<<20) // 5,000 rows or about 4 MiB, whichever comes first
}

// This example shows a retry policy that waits longer for a server to come back.
func ExampleWithRetry() {
	_ = pgpipe.WithRetry(100, pipeline.ExponentialBackoff(50*time.Millisecond, 5*time.Second))
}

// This example shows rejected rows sent to a function instead of a table.
func ExampleWithDeadLetter() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	buf := pipeline.NewDeadLetterBuffer[Order](100)
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order](), pgpipe.WithDeadLetter(buf.Add))
	p := pipeline.New()
	w.To(pipeline.FromSlice(p, orders(10)), "load", 1)
	_ = p.Run(ctx)
	for _, d := range buf.Items() {
		fmt.Println(d.Item.ID, d.LastError)
	}
}

// This example shows rejected rows dead-lettered in the batch's own transaction.
func ExampleWithDeadLetterTable() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	dead, err := pgpipe.OpenDeadLetterTable[Order](ctx, pool, "orders_dead", nil)
	if err != nil {
		panic(err)
	}
	_ = pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order](), pgpipe.WithDeadLetterTable(dead))
}

// This example shows the checkpoint given to the source and to the writer.
func ExampleWithCheckpoint() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	store := pgpipe.NewCheckpoint(pool, "nightly-import")
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order](), pgpipe.WithCheckpoint(store))
	p := pipeline.New()
	all := orders(1000)
	src := pipeline.FromCheckpoint(p, store, fromPosition(all))
	w.To(src, "load", 4)
	_ = p.Run(ctx)
}

// This example shows a checkpoint loaded by hand: Load takes the job over.
func ExampleNewCheckpoint() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	pos, err := pgpipe.NewCheckpoint(pool, "nightly-import").Load(ctx)
	fmt.Println(pos, err)
}

// This example shows the committed ranges a resumed run skips.
func ExampleCheckpoint_LoadCommitted() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	pos, above, err := pgpipe.NewCheckpoint(pool, "nightly-import").LoadCommitted(ctx)
	fmt.Println(pos, above, err)
}

// This example shows a checkpoint saved by hand (the pipeline does this itself).
func ExampleCheckpoint_Save() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	c := pgpipe.NewCheckpoint(pool, "nightly-import")
	if _, err := c.Load(ctx); err != nil {
		panic(err)
	}
	err := c.Save(ctx, 1000)
	fmt.Println(errors.Is(err, pgpipe.ErrFenced))
}

// This example shows the position and the ranges settled above it saved by hand (the
// pipeline saves them itself, so that a resumed run skips them).
func ExampleCheckpoint_SaveCommitted() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	c := pgpipe.NewCheckpoint(pool, "nightly-import")
	if _, err := c.Load(ctx); err != nil {
		panic(err)
	}
	err := c.SaveCommitted(ctx, 1000, []pipeline.PositionRange{{From: 1200, To: 1300}})
	fmt.Println(err)
}

// This example shows a stage whose dead letters are committed with the run's progress:
// a resumed run, even after a crash, never redoes or sets aside again an item it
// dead-lettered.
func ExampleDeadLetterTable_WithCheckpoint() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	dead, err := pgpipe.OpenDeadLetterTable[Order](ctx, pool, "orders_dead", nil)
	if err != nil {
		panic(err)
	}
	store := pgpipe.NewCheckpoint(pool, "check-orders")
	all := orders(1000)
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, store, fromPosition(all))
	checked := pipeline.Then(src, pipeline.NewStage("check", 4, func(_ context.Context, o Order) (Order, error) {
		if o.Cents == 0 {
			return o, pipeline.Permanent(errors.New("free order"))
		}
		return o, nil
	}, pipeline.WithDeadLetter(dead.WithCheckpoint(store).Add)))
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order](), pgpipe.WithUpsert("id"), pgpipe.WithCheckpoint(store))
	w.To(checked, "load", 2)
	fmt.Println(p.Run(ctx))
}

// This example shows a checkpoint loaded through Load.
func ExampleCheckpoint_Load() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	_, _ = pgpipe.NewCheckpoint(pool, "nightly-import").Load(ctx)
}

// This example shows a dead-letter table used by an ordinary stage, and read back.
func ExampleOpenDeadLetterTable() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	dead, err := pgpipe.OpenDeadLetterTable[Order](ctx, pool, "orders_dead", nil)
	if err != nil {
		panic(err)
	}
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, orders(10)), pipeline.NewSink("check", 1, func(_ context.Context, o Order) error {
		if o.Cents == 0 {
			return pipeline.Permanent(errors.New("free order"))
		}
		return nil
	}, pipeline.WithDeadLetter(dead.Add)))
	_ = p.Run(ctx)
}

// This example shows dead letters read back.
func ExampleDeadLetterTable_Read() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	dead, _ := pgpipe.OpenDeadLetterTable[Order](ctx, pool, "orders_dead", nil)
	dls, _ := dead.Read(ctx, "load")
	for _, d := range dls {
		fmt.Println(d.Item.ID, d.LastError)
	}
}

// This example shows a dead letter added by hand.
func ExampleDeadLetterTable_Add() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	dead, _ := pgpipe.OpenDeadLetterTable[Order](ctx, pool, "orders_dead", nil)
	_ = dead.Add(ctx, pipeline.DeadLetter[Order]{Stage: "manual", Item: Order{ID: 7}, Attempts: 1, LastError: "checked by hand"})
}

// This example shows the rejected rows fed through the writer again after a fix.
func ExampleReplay() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	dead, _ := pgpipe.OpenDeadLetterTable[Order](ctx, pool, "orders_dead", nil)
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order](), pgpipe.WithDeadLetterTable(dead))
	p := pipeline.New()
	w.To(pgpipe.Replay(p, dead, "load"), "reload", 1)
	_ = p.Run(ctx)
}

// This example shows how a rejected row's error reads.
func ExampleRowError() {
	err := &pgpipe.RowError{
		Code: "23505", Message: `duplicate key value violates unique constraint "orders_pkey"`,
		Constraint: "orders_pkey", Detail: "Key (id)=(7) already exists.",
	}
	fmt.Println(err)
	// Output: pgpipe: row rejected: duplicate key value violates unique constraint "orders_pkey" (SQLSTATE 23505), constraint orders_pkey: Key (id)=(7) already exists.
}

// This example shows the fencing error matched.
func ExampleErrFenced() {
	err := fmt.Errorf("run: %w", pgpipe.ErrFenced)
	fmt.Println(errors.Is(err, pgpipe.ErrFenced))
	// Output: true
}

// This example shows the error of a COMMIT whose outcome is unknown, matched.
func ExampleErrCommitUnknown() {
	err := fmt.Errorf("load: %w", pgpipe.ErrCommitUnknown)
	fmt.Println(errors.Is(err, pgpipe.ErrCommitUnknown))
	// Output: true
}

// This example shows one writer shared by two pipelines.
func ExampleWriter() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	w := pgpipe.NewWriter(pool, "orders", pgpipe.Struct[Order]())
	for _, part := range [][]Order{orders(10), orders(20)[10:]} {
		p := pipeline.New()
		w.To(pipeline.FromSlice(p, part), "load", 1)
		_ = p.Run(ctx)
	}
	fmt.Println(w.Stats().Rows)
}

// This example shows a checkpoint, the store of a job's progress in the database.
func ExampleCheckpoint() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	var store pipeline.CommittedStore = pgpipe.NewCheckpoint(pool, "nightly-import")
	_, _, _ = store.LoadCommitted(ctx)
}

// This example shows a dead-letter table as the destination of a stage.
func ExampleDeadLetterTable() {
	ctx := context.Background()
	pool := examplePool(ctx)
	defer pool.Close()
	dead, _ := pgpipe.OpenDeadLetterTable[Order](ctx, pool, "orders_dead", nil)
	_ = pipeline.WithDeadLetter(dead.Add)
}

// This example shows a mapping used by a writer.
func ExampleMapping() {
	m := pgpipe.Struct[Order]()
	fmt.Println(m.Columns()[0])
	// Output: id
}

// This example shows the counts a writer keeps.
func ExampleStats() {
	var st pgpipe.Stats
	fmt.Println(st.Batches, st.Rows)
	// Output: 0 0
}

// This example shows options collected for a writer.
func ExampleOption() {
	opts := []pgpipe.Option{pgpipe.WithUpsert("id"), pgpipe.WithChunk(5000, 0)}
	fmt.Println(len(opts))
	// Output: 2
}
