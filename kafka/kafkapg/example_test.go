package kafkapg_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
	"github.com/gopipeline/pipeline/kafka/kafkapg"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// Order is what the topic "orders" holds, as JSON; Invoice is the row written for it.
type Order struct {
	ID    int64 `json:"id"`
	Cents int64 `json:"cents"`
}

type Invoice struct {
	OrderID int64 `db:"order_id"`
	Cents   int64 `db:"cents"`
}

// This example writes a consumer group's records into PostgreSQL exactly once: each
// batch's invoices and the offsets they take their partitions to commit in one
// transaction, and every member of the group (run it N times) starts each partition it
// is assigned from the offset stored there. It needs a Kafka cluster and a PostgreSQL
// server ($DATABASE_URL), so it is compiled but not run (it has no Output comment).
func ExampleNewSink() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	store := kafkapg.NewOffsets(pool, "billing")
	src := kafka.NewSource([]kgo.Opt{kgo.SeedBrokers("localhost:9092")}, "billing", []string{"orders"},
		pipeline.JSONCodec[Order]{}, kafka.WithOffsetStore(store))
	p := pipeline.New()
	invoices := pipeline.Then(src.Stream(p), pipeline.NewStage("price", 8,
		func(_ context.Context, m kafka.Message[Order]) (kafka.Message[Invoice], error) {
			// Topic, Partition and Offset stay those of the input record.
			return kafka.Message[Invoice]{
				Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
				Value: Invoice{OrderID: m.Value.ID, Cents: m.Value.Cents},
			}, nil
		},
		pipeline.WithKey(kafka.Message[Order].TopicPartition))) // each partition in offset order
	w := pgpipe.NewWriter(pool, "invoices", pgpipe.Struct[Invoice](), pgpipe.WithSkipExisting("order_id"))
	pipeline.ToBatches(invoices, 500, kafkapg.NewSink("invoices", src, w), pipeline.WithLinger(20*time.Millisecond))
	if err := p.Run(ctx); err != nil {
		fmt.Println(err)
	}
}
