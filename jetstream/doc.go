// Package jetstream connects pipelines to NATS JetStream, with exact acknowledgements.
//
// [Source] reads a durable pull consumer as an acknowledged source of a pipeline
// ([pipeline.FromAcked]): every message is acknowledged once, when the fate of its item
// is known, never when it is merely handed downstream. Committed (every item derived
// from it reached a sink that returned nil, or was filtered out): Ack. Dead-lettered: a
// copy goes to a dead-letter subject with headers saying why, and after the stream's
// PubAck, Term. Handed back by a stage ([pipeline.WithHandBack]): NakWithDelay, so a
// retry holds no worker. Not processed (the run stopped first): Nak, so that another
// process takes it at once. A crash acknowledges nothing it did not commit: the server
// redelivers the rest once AckWait passes.
//
// # Scale-out
//
// Several processes run the same pipeline against one durable consumer, each on its own
// connection; the server shares the messages between them. Nothing else is shared: the
// pipelines do not know of each other. A message can be delivered more than once (a
// process crashed, AckWait passed), so sinks must be idempotent: [NewSink] publishes
// with a Nats-Msg-Id derived from the item, so that the output stream stores each
// message once.
//
// # Backpressure
//
// A pipeline holds at most [WithMaxPending] unsettled messages (the consumer's
// MaxAckPending by default), and the client buffers at most [WithPullSize] more; the
// server hands out at most MaxAckPending unacknowledged messages to all processes
// together. A message held longer than a third of AckWait gets InProgress signals
// ([WithProgressEvery]), so that a slow stage does not cause a redelivery.
package jetstream
