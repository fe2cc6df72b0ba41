// Package kafka connects pipelines to Apache Kafka (and to brokers that speak its
// protocol, such as Redpanda), through franz-go, with offsets that follow each item's
// outcome.
//
// [Source] consumes topics as a member of a consumer group, as an acknowledged source
// of a pipeline ([pipeline.FromAcked]): each record is one [Message], and a
// partition's committed offset is its first record whose item has not settled
// (committed by a sink, filtered out, or dead-lettered), never a record that was only
// fetched or handed downstream. Records settle in any order; the source keeps a
// watermark per partition and commits it on an interval, at every revoke and at the
// end of a run. Dead-lettered records go to a dead-letter topic ([WithDeadLetterTopic])
// with headers that say why and where they came from, and settle only once the
// broker acknowledged that produce. [NewSink] produces batches of items to a topic
// with an idempotent producer.
//
// # At least once
//
// A crash or a rebalance never loses a record: what the group committed was settled.
// It may repeat one: a record whose item settled after the last commit of its
// partition (a crash, a member removed from the group, an item slower than
// [WithRevokeTimeout] at a revoke) is processed again by the partition's next owner.
// [Stats].Stale and [Stats].Uncommitted count, on the old owner, the records left to
// be redone. Sinks must therefore be idempotent, or tolerate duplicates.
//
// # Exactly once, Kafka to Kafka
//
// With [WithTransactionalID], the source's client is a transactional producer, and
// [NewTransactSink] produces each batch in a Kafka transaction that also commits the
// offsets its records take the group to: a consumer downstream that reads committed
// sees each input record's output once, across rebalances and crashes. A rebalance
// or a failed produce aborts the open transaction, and the source takes its
// partitions back to their committed offsets (a message from before that rewind and
// its replay name the same record: the first to reach the sink in its partition's
// order is produced, and that output is the record's one outcome: the other message
// is not produced, emitted again or dead-lettered to [WithDeadLetterTopic]). It needs
// each partition's records to reach the sink in offset order (a stage keyed by
// partition) and every output of a record in one batch; dead letters stay at least
// once. What other branches of a [pipeline.Tee] do is not in the transaction: one
// that hands an item back after the transaction committed its record's offset is
// redone by that run only, and lost if the run stops first ([NewTransactSink] says
// more).
//
// # Exactly once into PostgreSQL
//
// With [WithOffsetStore], the consumed offsets live in an [OffsetStore] beside the
// sink's outputs: on each assignment the source claims the partitions there (a new
// epoch per partition, which fences every earlier owner) and starts each one from the
// offset stored, and the sink stores, in the transaction of each batch's outputs, the
// offset the batch takes each partition to, only under the claimed epoch
// ([Source.BeginStoreTxn]). The package kafkapg does it in PostgreSQL: its NewSink
// writes each batch with a pgpipe writer in one transaction with the offsets, so each
// record's row is written once, across crashes, rebalances and an owner paused past
// its session (its transaction finds the epoch moved and rolls back). As with
// [NewTransactSink], each partition's records must reach the sink in offset order,
// and the work of other branches of a [pipeline.Tee] is not in the transaction.
//
// # Rebalances
//
// On a revoke the source stops emitting the records of the revoked partitions, waits
// (at most [WithRevokeTimeout]) for their items in the pipeline to settle, commits
// their watermarks and only then lets the rebalance go on. Commits carry the group's
// generation, so a member that lost its partitions (its session expired) cannot
// commit over their new owner; a partition assigned back to the same member starts
// from the group's committed offset, not from an offset the member remembers.
//
// # Versions
//
// The source uses the classic consumer group protocol (not KIP-848) with franz-go's
// default cooperative-sticky balancer (a client-side protocol), offset commits that
// carry leader epochs (Kafka 2.1 or later), and, for the dead-letter topic and the
// sink, the idempotent producer (which needs the IDEMPOTENT_WRITE permission before
// Kafka 3.0). So it needs Apache Kafka 2.1 or later (3.x recommended) or a broker that
// speaks the same APIs, such as Redpanda; [NewTransactSink] needs Kafka 2.5 or later
// (KIP-447: transactional offset commits fenced by the group's generation). It has no path of its own for a test
// cluster: its tests run against kfake, franz-go's in-process cluster, and no real
// broker was at hand to run them against.
package kafka
