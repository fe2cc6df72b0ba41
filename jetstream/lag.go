package jetstream

import "github.com/gopipeline/pipeline"

// lag is the consumer's backlog for the pipeline's report ([pipeline.WithLag]): its
// num_pending as of the run's newest delivery (the highest consumer sequence: two
// clients' messages arrive interleaved), labeled "stream/consumer"; nil without a run
// or before its first message.
func (s *Source[T]) lag() []pipeline.PartitionLag {
	s.mu.Lock()
	f := s.feed
	s.mu.Unlock()
	n := s.pending.Load()
	if f == nil || n == 0 {
		return nil
	}
	label := s.cfg.name
	if f.stream != "" || f.name != "" {
		label = f.stream + "/" + f.name
	}
	return []pipeline.PartitionLag{{Partition: label, Lag: n - 1}}
}
