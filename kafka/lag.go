package kafka

import (
	"cmp"
	"maps"
	"slices"
	"strconv"

	"github.com/gopipeline/pipeline"
)

// partitionLag is s.lag() for the pipeline's report ([pipeline.WithLag]): by topic and
// partition, labeled "topic/partition"; nil without a run.
func (s *Source[T]) partitionLag() []pipeline.PartitionLag {
	lag := s.lag()
	if lag == nil {
		return nil
	}
	tps := slices.SortedFunc(maps.Keys(lag), func(a, b TopicPartition) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	out := make([]pipeline.PartitionLag, len(tps))
	for i, tp := range tps {
		out[i] = pipeline.PartitionLag{Partition: tp.Topic + "/" + strconv.Itoa(int(tp.Partition)), Lag: lag[tp]}
	}
	return out
}
