package jetstream

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/gopipeline/pipeline"
)

// Bytes is a [pipeline.Codec] for raw message data: an item is the message's data, as
// it is (not copied).
type Bytes struct{}

// Marshal implements [pipeline.Codec].
func (Bytes) Marshal(v []byte) ([]byte, error) { return v, nil }

// Unmarshal implements [pipeline.Codec].
func (Bytes) Unmarshal(data []byte, v *[]byte) error {
	*v = data
	return nil
}

// NewSink returns a sink stage that publishes batches of items to subject through js:
// attach it with [pipeline.ToBatches] (or [pipeline.To] after [pipeline.Batch]). Each
// item is encoded by codec and published asynchronously with its Nats-Msg-Id header set
// to msgID(item), so that the stream stores a message published twice (a retried
// batch, a redelivered source message) once, within its duplicate window; the sink
// function returns once the stream acknowledged every message of the batch, so that a
// committed item is stored. A failed publish or PubAck fails the batch with a
// [pipeline.Transient] error: give the stage [pipeline.WithRetry] to publish it again.
//
// The acknowledgements pending at once are at most workers × the batch size, and js's
// own [natsjs.WithPublishAsyncMaxPending] bounds those of the connection as a whole.
// opts are the stage's options. It panics like [pipeline.NewSink], or if js, codec or
// msgID is nil or subject is empty.
func NewSink[T any](name string, workers int, js natsjs.JetStream, subject string, codec pipeline.Codec[T], msgID func(T) string, opts ...pipeline.StageOption) *pipeline.Stage[[]T, struct{}] {
	if js == nil || codec == nil || msgID == nil || subject == "" {
		panic(fmt.Sprintf("jetstream: NewSink(%q) needs a JetStream, a subject, a codec and a message id function", name))
	}
	return pipeline.NewSink(name, workers, func(ctx context.Context, batch []T) error {
		futures := make([]natsjs.PubAckFuture, 0, len(batch))
		var first error
		for _, v := range batch {
			data, err := codec.Marshal(v)
			if err != nil {
				first = pipeline.Permanent(fmt.Errorf("jetstream: encode: %w", err))
				break
			}
			msg := nats.NewMsg(subject)
			msg.Data = data
			msg.Header.Set(nats.MsgIdHdr, msgID(v))
			f, err := js.PublishMsgAsync(msg)
			if err != nil {
				first = pipeline.Transient(fmt.Errorf("jetstream: publish: %w", err))
				break
			}
			futures = append(futures, f)
		}
		// Wait for every publish sent, also after a failure: none is left behind.
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				if first == nil {
					first = pipeline.Transient(fmt.Errorf("jetstream: publish: %w", err))
				}
			case <-ctx.Done():
				if first == nil {
					first = context.Cause(ctx)
				}
			}
		}
		return first
	}, opts...)
}
