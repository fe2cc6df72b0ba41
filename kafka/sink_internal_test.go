package kafka

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/gopipeline/pipeline"
)

// TestProduceErrorClasses classifies a failed produce: a missing permission fails the
// run (it was Permanent, and WithDeadLetter set every batch aside), a record too large
// is the item's, a retriable error is transient.
func TestProduceErrorClasses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want pipeline.Class
	}{
		{kerr.TopicAuthorizationFailed, pipeline.ClassFatal},
		{kerr.ClusterAuthorizationFailed, pipeline.ClassFatal},
		{kerr.MessageTooLarge, pipeline.ClassItem},
		{kerr.NotLeaderForPartition, pipeline.ClassTransient},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			t.Parallel()
			got, ok := pipeline.ClassOf(produceError(context.Background(), tc.err))
			assert.True(t, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}
