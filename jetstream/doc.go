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
// MaxAckPending by default), and at most [WithPullSize] more wait for it: the source
// takes each message from the client as it arrives and asks the server for more only
// when there is room. The server hands out at most MaxAckPending unacknowledged
// messages to all processes together. Every message a run holds, in the pipeline or
// waiting for it, gets an InProgress signal every third of AckWait
// ([WithProgressEvery]), so that a slow stage does not cause a redelivery, whatever
// the pull size.
//
// # Failures
//
// A deleted consumer, or a deleted stream, fails the run with a [*ConsumerError] that
// names them (errors.Is natsjs.ErrConsumerDeleted): at once when the run waits for
// messages and the server tells it, otherwise within two [WithConsumerCheck] intervals,
// busy or idle (see [Source]).
// A closed connection fails the run too; a server that restarts does not: the client
// reconnects and the run goes on.
package jetstream
