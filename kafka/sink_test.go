package kafka_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
)

// TestSinkProducesKeysAndHeaders produces 60 items in batches of 8: each record has
// the item's key and headers, and the records of a key are in the order of the items.
func TestSinkProducesKeysAndHeaders(t *testing.T) {
	t.Parallel()
	const n = 60
	ctx := t.Context()
	c := newCluster(t)
	prod := newClient(t, c)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	p := pipeline.New()
	meta := func(id int) ([]byte, []kgo.RecordHeader) {
		return []byte("g" + strconv.Itoa(id%5)), []kgo.RecordHeader{{Key: "id", Value: []byte(strconv.Itoa(id))}}
	}
	pipeline.ToBatches(pipeline.FromSlice(p, ids), 8, kafka.NewSink("out", 1, prod, outTopic, idCodec{}, meta),
		pipeline.WithLinger(10*time.Millisecond))
	require.NoError(t, p.Run(ctx))

	recs := readTopic(ctx, t, c, outTopic)
	require.Len(t, recs, n)
	last := map[string]int{}
	partitionOf := map[string]int32{}
	for _, r := range recs {
		id := idOf(t, r)
		key := string(r.Key)
		assert.Equal(t, "g"+strconv.Itoa(id%5), key)
		assert.Equal(t, strconv.Itoa(id), header(r, "id"))
		if prev, ok := last[key]; ok {
			assert.Greater(t, id, prev, "the records of key %s are out of order", key)
			assert.Equal(t, partitionOf[key], r.Partition, "key %s on two partitions", key)
		}
		last[key], partitionOf[key] = id, r.Partition
	}
}

// failingCodec cannot encode 3.
type failingCodec struct{ idCodec }

func (failingCodec) Marshal(v int) ([]byte, error) {
	if v == 3 {
		return nil, errors.New("three cannot be encoded")
	}
	return valueOf(v), nil
}

// TestSinkEncodeErrorIsPermanent gives the sink an item it cannot encode: its batch is
// dead-lettered after one attempt, retries notwithstanding, and the others are produced.
func TestSinkEncodeErrorIsPermanent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := newCluster(t)
	prod := newClient(t, c)
	var mu sync.Mutex
	var letters []pipeline.DeadLetter[[]int]
	p := pipeline.New()
	pipeline.ToBatches(pipeline.FromSlice(p, []int{0, 1, 2, 3, 4, 5}), 2, kafka.NewSink("out", 1, prod, outTopic, failingCodec{}, nil,
		pipeline.WithRetry(3, pipeline.ConstantBackoff(time.Millisecond)),
		pipeline.WithDeadLetter(func(_ context.Context, dl pipeline.DeadLetter[[]int]) error {
			mu.Lock()
			defer mu.Unlock()
			letters = append(letters, dl)
			return nil
		})))
	require.NoError(t, p.Run(ctx))
	require.Len(t, letters, 1)
	assert.Equal(t, []int{2, 3}, letters[0].Item)
	assert.Equal(t, 1, letters[0].Attempts)
	assert.Contains(t, letters[0].LastError, "three cannot be encoded")
	assert.Len(t, readTopic(ctx, t, c, outTopic), 4)
}

// TestNewSinkPanicsOnMisconfiguredClient refuses a client whose producer is not
// idempotent or is transactional, and missing arguments.
func TestNewSinkPanicsOnMisconfiguredClient(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	for _, tc := range []struct {
		name  string
		cl    func() *kgo.Client
		topic string
		want  string
	}{
		{name: "not idempotent", cl: func() *kgo.Client { return newClient(t, c, kgo.DisableIdempotentWrite()) }, topic: outTopic, want: "not idempotent"},
		{name: "transactional", cl: func() *kgo.Client { return newClient(t, c, kgo.TransactionalID("tx")) }, topic: outTopic, want: "transactional"},
		{name: "no client", cl: func() *kgo.Client { return nil }, topic: outTopic, want: "needs a client"},
		{name: "no topic", cl: func() *kgo.Client { return newClient(t, c) }, topic: "", want: "needs a client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl := tc.cl()
			defer func() {
				r := recover()
				require.NotNil(t, r, "no panic")
				assert.Contains(t, r, tc.want)
				assert.Contains(t, r, `kafka: NewSink("out")`)
			}()
			kafka.NewSink("out", 1, cl, tc.topic, idCodec{}, nil)
		})
	}
}
