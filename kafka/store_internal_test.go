package kafka

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestStoreTxnHoldsBackRecordsPastAnUnwrittenOne gives a store transaction's prospect a
// claimed partition whose records 10 ... 14 are in the pipeline, and a batch with the
// messages of 12 and 13 only: they must not be written, since the transaction could
// store the offset only up to 10, and whoever redoes the partition from there would
// write them again. A record's own message held back is emitted again when it settles,
// not counted done. A batch of 10 ... 12 is written and stores 13.
func TestStoreTxnHoldsBackRecordsPastAnUnwrittenOne(t *testing.T) {
	t.Parallel()
	tp := TopicPartition{"in", 0}
	newSession := func() (*session[int], []*entry) {
		ss, es := pendingSession(tp, 10, 15)
		p := ss.parts[tp]
		p.claimed, p.epoch, p.stored = true, 3, 10
		return ss, es
	}
	from := func(offsets ...int64) []Origin {
		var os []Origin
		for _, o := range offsets {
			os = append(os, Origin{TopicPartition: tp, Offset: o})
		}
		return os
	}

	ss, es := newSession()
	offs, keep, _, _, kept := ss.storeProspect(from(12, 13))
	assert.Equal(t, []bool{false, false}, keep, "records past 10 and 11, neither settled nor written")
	assert.Empty(t, kept)
	assert.Empty(t, offs, "no offset moves")
	assert.Equal(t, int64(2), ss.s.outOfOrder.Load(), "records held back")

	// 12's own message was held back: when it settles, it is emitted again.
	checkTwelveEmittedAgain(t, ss, es[2])

	ss, _ = newSession()
	offs, keep, _, marks, kept := ss.storeProspect(from(10, 11, 12))
	assert.Equal(t, []bool{true, true, true}, keep, "10 ... 12, in order")
	assert.Len(t, kept, 3)
	assert.Equal(t, []StoreOffset{{TopicPartition: tp, Epoch: 3, Next: 13}}, offs)
	assert.Equal(t, map[*part]int64{ss.parts[tp]: 13}, marks)
	assert.Zero(t, ss.s.outOfOrder.Load())
}
