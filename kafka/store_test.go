package kafka_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
)

// memStore is an OffsetStore in memory: every partition starts at start, or claims
// fail with err.
type memStore struct {
	mu     sync.Mutex
	start  int64
	err    error
	next   map[kafka.TopicPartition]int64
	epochs map[kafka.TopicPartition]int64
}

func (m *memStore) Claim(_ context.Context, tps []kafka.TopicPartition) ([]kafka.Claim, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	var cs []kafka.Claim
	for _, tp := range tps {
		m.epochs[tp]++
		next, ok := m.next[tp]
		if !ok {
			next = m.start
		}
		cs = append(cs, kafka.Claim{TopicPartition: tp, Epoch: m.epochs[tp], Next: next})
	}
	return cs, nil
}

func (m *memStore) Save(_ context.Context, offs []kafka.StoreOffset) ([]kafka.TopicPartition, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var fenced []kafka.TopicPartition
	for _, o := range offs {
		if o.Epoch != m.epochs[o.TopicPartition] {
			fenced = append(fenced, o.TopicPartition)
			continue
		}
		m.next[o.TopicPartition] = max(m.next[o.TopicPartition], o.Next)
	}
	return fenced, nil
}

func newMemStore(start int64) *memStore {
	return &memStore{start: start, next: map[kafka.TopicPartition]int64{}, epochs: map[kafka.TopicPartition]int64{}}
}

// TestOffsetStoreStartsPartitionsFromItsOffsets gives a source a store that holds
// offset 50 for every partition: the source claims each partition once, emits only
// the records from 50 on, and saves the offsets they take the partitions to (no sink
// stores them here: they settle as filtered-out records do).
func TestOffsetStoreStartsPartitionsFromItsOffsets(t *testing.T) {
	ctx, c := clusterWithIDs(t, 1200) // 100 a partition
	store := newMemStore(50)
	src := kafka.NewSource(consumerOpts(c), "stored", []string{inTopic}, idCodec{},
		kafka.WithOffsetStore(store), kafka.WithCommitInterval(50*time.Millisecond))
	var mu sync.Mutex
	first := map[int32]int64{}
	n := 0
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("count", 1, func(_ context.Context, m kafka.Message[int]) error {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := first[m.Partition]; !ok {
			first[m.Partition] = m.Offset
		}
		n++
		if n == 600 {
			src.Stop()
		}
		return nil
	}))
	require.NoError(t, p.Run(ctx))
	assert.Equal(t, 600, n)
	for part := range int32(partitions) {
		assert.Equal(t, int64(50), first[part], "partition %d starts at the store's offset", part)
		assert.Equal(t, int64(100), store.next[kafka.TopicPartition{Topic: inTopic, Partition: part}], "partition %d's offset saved", part)
	}
	assert.Equal(t, int64(partitions), src.Stats().Claimed)
}

// TestOffsetStoreFatalClaimFailsRun fails the run when the store's claim fails with a
// fatal error (a missing privilege, say).
func TestOffsetStoreFatalClaimFailsRun(t *testing.T) {
	c := newCluster(t)
	store := newMemStore(0)
	denied := errors.New("permission denied for table offsets")
	store.err = pipeline.Fatal(denied)
	src := kafka.NewSource(consumerOpts(c), "denied", []string{inTopic}, idCodec{}, kafka.WithOffsetStore(store))
	p := pipeline.New()
	pipeline.To(src.Stream(p), pipeline.NewSink("count", 1, func(context.Context, kafka.Message[int]) error { return nil }))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.ErrorIs(t, p.Run(ctx), denied)
}

// TestWithOffsetStorePanicsOnMisuse refuses a nil store, and a store with a
// transactional id.
func TestWithOffsetStorePanicsOnMisuse(t *testing.T) {
	assert.PanicsWithValue(t, "kafka: WithOffsetStore(nil)", func() { kafka.WithOffsetStore(nil) })
	assert.PanicsWithValue(t, "kafka: NewSource: WithOffsetStore and WithTransactionalID: the offsets go to one place, the store or a Kafka transaction", func() {
		kafka.NewSource(nil, "g", []string{"t"}, idCodec{}, kafka.WithOffsetStore(newMemStore(0)), kafka.WithTransactionalID("x"))
	})
}
