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
// be redone. Sinks must therefore be idempotent, or tolerate duplicates. Offsets
// committed in the sink's own transaction (PostgreSQL, Kafka transactions), which make
// a sink exactly once, are not part of this package yet.
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
// The source uses the classic consumer group protocol with franz-go's default
// cooperative-sticky balancer, offset commits with leader epochs and, for the
// dead-letter topic and the sink, the idempotent producer: Apache Kafka 2.5 or later
// (2.4 for cooperative rebalancing; 3.0 or later is what it is tested for), or
// Redpanda 22.1 or later. The tests run against kfake, franz-go's in-process cluster,
// through the same code paths as a real broker.
package kafka
