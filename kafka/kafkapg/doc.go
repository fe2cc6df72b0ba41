// Package kafkapg writes Kafka records into PostgreSQL exactly once: each batch's rows
// and the consumed offsets it takes its partitions to commit in one transaction, and a
// [kafka.Source] with [kafka.WithOffsetStore] starts each partition it is assigned from
// the offset stored there, not from the group's.
//
//	store := kafkapg.NewOffsets(pool, "billing")
//	src := kafka.NewSource(opts, "billing", []string{"orders"}, codec, kafka.WithOffsetStore(store))
//	rows := pipeline.Then(src.Stream(p), pipeline.NewStage("price", 8, price, // Message[Order] -> Message[Invoice], origin kept
//		pipeline.WithKey(kafka.Message[Order].TopicPartition)))
//	pipeline.ToBatches(rows, 500, kafkapg.NewSink("invoices", src, pgpipe.NewWriter(pool, "invoices", pgpipe.Struct[Invoice]())),
//		pipeline.WithLinger(20*time.Millisecond))
//
// # Claims and fencing
//
// The offsets live in the table kafkapg_offsets, one row per (store name, topic,
// partition) with the next offset to consume and an epoch. When the group assigns a
// partition to a member, the member claims it: one transaction bumps the epoch of each
// partition assigned and reads its offset, and the member starts there (a partition
// with no row yet starts from the group's committed offset, or kgo.ConsumeResetOffset).
// Every batch's transaction then updates, per partition, the offset its records take
// it to, with GREATEST (never back) and only where the epoch is still the one its
// member claimed: an owner that lost its partitions (revoked while its transaction ran,
// a session that expired while it was paused) finds another epoch, updates nothing,
// and rolls the whole transaction back; its rows of that partition are written by the
// new owner, which starts from the offset the last committed transaction stored. A
// claim and a transaction that stores an offset lock the same row, so they serialize:
// a transaction that updated the row first commits before the claim reads it, and one
// whose update comes after the claim (or waits for it: READ COMMITTED evaluates the
// WHERE again on the new version) finds the new epoch.
//
// # Privileges
//
// The table is created when missing, by the first claim, in the first schema of the
// connection's search path (which needs the CREATE privilege there); once it exists,
// the role needs SELECT, INSERT and UPDATE on it, and what the writer needs on the
// output table.
package kafkapg
