package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
)

// Bytes is a [pipeline.Codec] for raw record values: an item is the record's value, as
// it is (not copied).
type Bytes struct{}

// Marshal implements [pipeline.Codec].
func (Bytes) Marshal(v []byte) ([]byte, error) { return v, nil }

// Unmarshal implements [pipeline.Codec].
func (Bytes) Unmarshal(data []byte, v *[]byte) error {
	*v = data
	return nil
}

// NewSink returns a sink stage that produces batches of items to topic through cl:
// attach it with [pipeline.ToBatches] (or [pipeline.To] after [pipeline.Batch]). Each
// item is encoded by codec into a record's value; meta, if not nil, gives the record's
// key (which picks its partition with cl's partitioner: the same key, the same
// partition) and headers. The sink function returns once the broker acknowledged
// every record of the batch, so that a committed item is stored: records in flight are
// at most workers × the batch size (and cl's kgo.MaxBufferedRecords bounds those of the
// client as a whole). cl must have its idempotent producer (franz-go's default: no
// kgo.DisableIdempotentWrite), so that a retried produce request does not write a
// record twice and the records of a partition keep the order they were produced in; a
// batch that fails and is retried as a whole ([pipeline.WithRetry]) can still write
// again the records that had been acknowledged: the sink is at least once. A failed
// produce fails the batch with a [pipeline.Transient] error, a [pipeline.Fatal] one
// that fails the run when a permission is missing (kerr.TopicAuthorizationFailed and
// the like: no batch could go, and a dead-letter destination would set every one
// aside), or a [pipeline.Permanent] one when the broker's error is not retriable (a
// record too large) or an item cannot be encoded. opts are the stage's options. It panics like [pipeline.NewSink], if cl or
// codec is nil or topic is empty, or if cl's producer is not idempotent or is
// transactional.
func NewSink[T any](name string, workers int, cl *kgo.Client, topic string, codec pipeline.Codec[T], meta func(T) (key []byte, headers []kgo.RecordHeader), opts ...pipeline.StageOption) *pipeline.Stage[[]T, struct{}] {
	if cl == nil || codec == nil || topic == "" {
		panic(fmt.Sprintf("kafka: NewSink(%q) needs a client, a topic and a codec", name))
	}
	checkProducer(fmt.Sprintf("NewSink(%q)", name), cl)
	return pipeline.NewSink(name, workers, func(ctx context.Context, batch []T) error {
		recs := make([]*kgo.Record, len(batch))
		for i, v := range batch {
			data, err := codec.Marshal(v)
			if err != nil {
				return pipeline.Permanent(fmt.Errorf("kafka: encode: %w", err))
			}
			r := &kgo.Record{Topic: topic, Value: data}
			if meta != nil {
				r.Key, r.Headers = meta(v)
			}
			recs[i] = r
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return produceError(ctx, err)
		}
		return nil
	}, opts...)
}

// checkProducer panics unless cl is a plain idempotent producer: not transactional
// (every produce outside a transaction fails), and not kgo.DisableIdempotentWrite
// (which kgo.RequiredAcks other than all needs): a retried request could write a
// record twice, or, without acknowledgements, not at all.
func checkProducer(what string, cl *kgo.Client) {
	if off, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		panic(fmt.Sprintf("kafka: %s: the client's producer is not idempotent (kgo.DisableIdempotentWrite)", what))
	}
	if v := cl.OptValues(kgo.TransactionalID); len(v) == 2 {
		if set, _ := v[1].(bool); set {
			panic(fmt.Sprintf("kafka: %s: the client is transactional (kgo.TransactionalID): give it a plain producing client", what))
		}
	}
}

// produceError classifies a failed produce.
func produceError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	err = fmt.Errorf("kafka: produce: %w", err)
	if unauthorized(err) { // a permission missing: no batch can go, none should be set aside
		return pipeline.Fatal(err)
	}
	if unrecoverable(err) {
		return pipeline.Permanent(err)
	}
	return pipeline.Transient(err)
}

// unauthorized reports whether err, a failed produce, says a permission is missing.
func unauthorized(err error) bool {
	for _, auth := range []error{kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed, kerr.TransactionalIDAuthorizationFailed, kerr.SaslAuthenticationFailed} {
		if errors.Is(err, auth) {
			return true
		}
	}
	return false
}

// unrecoverable reports whether err, a failed produce, cannot pass by trying again: a
// permission missing, or a broker error Kafka marks not retriable (a record too large,
// an invalid record, ...).
func unrecoverable(err error) bool {
	if unauthorized(err) {
		return true
	}
	ke, ok := errors.AsType[*kerr.Error](err)
	return ok && !ke.Retriable
}
