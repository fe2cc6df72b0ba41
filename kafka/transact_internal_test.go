package kafka

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestTransactionHoldsBackRecordsPastAnUnproducedOne gives a transaction's prospect a
// partition whose records 10 ... 14 were polled again after a rewind, and a batch with
// the stale messages of 12 and 13 (those of 10 and 11 reached the sink before their
// replays were polled): 12 and 13 must not be produced, since the transaction could
// commit the offset only up to 10, and whoever redoes the partition from there would
// produce them again (issue 22's duplicate). A batch of 10 ... 12 is produced and
// commits 13. A record's own message held back is emitted again when it settles,
// not counted done.
func TestTransactionHoldsBackRecordsPastAnUnproducedOne(t *testing.T) {
	t.Parallel()
	tp := TopicPartition{"in", 0}
	newSession := func() (*session[int], []*entry) { return pendingSession(tp, 10, 15) }
	recs := func(offsets ...int64) []txnRecord {
		var rs []txnRecord
		for _, o := range offsets {
			rs = append(rs, txnRecord{from: tp, offset: o, rec: &kgo.Record{Value: []byte{byte(o)}}})
		}
		return rs
	}

	ss, es := newSession()
	offs, _, live, _ := ss.prospect(recs(12, 13))
	assert.Empty(t, live, "records past 10 and 11, neither settled nor produced")
	assert.Empty(t, offs, "no offset to commit")
	assert.Equal(t, int64(2), ss.s.outOfOrder.Load(), "records held back")

	// 12's own message was held back: when it settles, it is emitted again.
	checkTwelveEmittedAgain(t, ss, es[2])

	ss, _ = newSession()
	offs, marks, live, _ := ss.prospect(recs(10, 11, 12))
	assert.Len(t, live, 3, "10 ... 12, in order")
	assert.Equal(t, map[string]map[int32]kgo.EpochOffset{"in": {0: {Offset: 13}}}, offs)
	assert.Equal(t, map[*part]int64{ss.parts[tp]: 13}, marks)
	assert.Zero(t, ss.s.outOfOrder.Load())
}

// TestTransactionCommitsPastEveryRecordItProduces runs a transaction's prospect over
// every mix of settled, in-pipeline and waiting (handed back, dead letter failed)
// records 10 ... 14 and every batch of them, in offset order and reversed: the
// offset it commits passes each record it produces. So a produced record (txnDone)
// that then waits for a retry is already behind the committed offset of its own
// transaction, its output committed with it: a later one that counts it done commits
// nothing its own did not.
func TestTransactionCommitsPastEveryRecordItProduces(t *testing.T) {
	t.Parallel()
	tp := TopicPartition{"in", 0}
	states := [...]uint8{settled, inPipeline, waitingRetry}
	const n = 5
	mixes := 1
	for range n {
		mixes *= len(states)
	}
	for mix := range mixes {
		for set := range 1 << n {
			for _, reversed := range []bool{false, true} {
				ss, es := pendingSession(tp, 10, 10+n)
				p := ss.parts[tp]
				for i, m := 0, mix; i < n; i, m = i+1, m/len(states) {
					switch states[m%len(states)] {
					case settled:
						p.settle(es[i])
					case waitingRetry:
						p.toRetry(es[i])
					}
				}
				var batch []txnRecord
				for i := range n {
					if set&(1<<i) != 0 {
						batch = append(batch, txnRecord{from: tp, offset: es[i].offset, rec: &kgo.Record{}})
					}
				}
				if reversed {
					slices.Reverse(batch)
				}
				_, marks, live, inTxn := ss.prospect(batch)
				require.Len(t, inTxn, len(live), "mix %d, batch %05b", mix, set)
				for e := range inTxn {
					require.Greater(t, marks[p], e.offset, "mix %d, batch %05b, reversed %v: record %d produced, committed offset %d", mix, set, reversed, e.offset, marks[p])
				}
			}
		}
	}
}
