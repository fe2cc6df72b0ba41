package kafka

import (
	"slices"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
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

// TestSettleOfARecordInATransactionWaitsForItsEnd dead-letters the message of record
// 10 while a transaction holds a stale message of the same record (produced, not yet
// committed): the settle waits for the transaction's end, and then the record's
// outcome is the transaction's: done if it committed (no dead letter), the dead letter
// if it did not. A record whose dead letter is under way is not taken by a later
// transaction either. (Either way the record had an output and a dead letter.)
func TestSettleOfARecordInATransactionWaitsForItsEnd(t *testing.T) {
	t.Parallel()
	tp := TopicPartition{"in", 0}
	batch := []txnRecord{{from: tp, offset: 10, rec: &kgo.Record{}}}
	// replayed returns a session whose record 10 is in the pipeline, with a message of
	// an earlier assignment that may still be (staleTo).
	replayed := func() (*session[int], *entry) {
		ss, es := pendingSession(tp, 10, 11)
		ss.s.cfg.txnID, ss.s.cfg.maxPending = "member", 1000
		ss.parts[tp].staleTo = 10
		ss.outstanding = 1
		return ss, es[0]
	}
	for _, committed := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			ss, e := replayed()
			_, _, live, inTxn := ss.prospect(batch) // the stale message's transaction
			require.Len(t, live, 1)
			returned := make(chan struct{})
			go func() {
				defer close(returned)
				ss.settle(e, pipeline.Settlement{Outcome: pipeline.DeadLettered})
			}()
			synctest.Wait()
			select {
			case <-returned:
				t.Fatal("the settle did not wait for the transaction")
			default:
			}
			if committed {
				ss.mu.Lock()
				ss.txnDone = map[*entry]bool{e: true}
				ss.mu.Unlock()
			}
			ss.leaveTxn(inTxn)
			<-returned
			assert.Equal(t, settled, e.state)
			if committed {
				assert.Equal(t, int64(1), ss.s.committed.Load(), "committed: its output")
				assert.Zero(t, ss.s.deadLettered.Load(), "dead-lettered")
			} else {
				assert.Zero(t, ss.s.committed.Load(), "committed")
				assert.Equal(t, int64(1), ss.s.deadLettered.Load(), "dead-lettered: the transaction did not commit")
			}
		})
	}

	// A dead letter under way (outputCommitted said no): a stale message of the
	// record reaching the sink now is not produced.
	ss, e := replayed()
	require.False(t, ss.outputCommitted(e))
	_, _, live, _ := ss.prospect(batch)
	assert.Empty(t, live, "a record whose dead letter is under way, produced")
}

// TestRecordWithNoStaleMessageIsDeadLetteredAfterItsOutput settles record 10, whose
// output a transaction committed, as dead-lettered or handed back by its own message
// (another branch of a Tee than the sink's): no message of an earlier assignment can
// have produced that output, so the outcome stands: the dead letter, or a retry.
func TestRecordWithNoStaleMessageIsDeadLetteredAfterItsOutput(t *testing.T) {
	t.Parallel()
	tp := TopicPartition{"in", 0}
	for _, outcome := range []pipeline.Outcome{pipeline.DeadLettered, pipeline.HandedBack} {
		ss, es := pendingSession(tp, 10, 11)
		ss.s.cfg.txnID, ss.s.cfg.maxPending = "member", 1000
		ss.outstanding = 1
		ss.txnDone = map[*entry]bool{es[0]: true}
		ss.settle(es[0], pipeline.Settlement{Outcome: outcome})
		assert.Zero(t, ss.s.committed.Load(), "%v: committed", outcome)
		if outcome == pipeline.DeadLettered {
			assert.Equal(t, int64(1), ss.s.deadLettered.Load(), "dead-lettered")
		} else {
			assert.Equal(t, waitingRetry, es[0].state, "handed back")
		}
	}
}

// TestHeldBackRecordOnItsWayToARetryIsNotProduced settles record 11, held back by a
// transaction (past 10), as committed: it is to be emitted again, and a stale message
// of it that reaches the sink meanwhile is not produced (its output would be
// committed, and the record emitted again all the same).
func TestHeldBackRecordOnItsWayToARetryIsNotProduced(t *testing.T) {
	t.Parallel()
	tp := TopicPartition{"in", 0}
	ss, es := pendingSession(tp, 10, 12)
	ss.s.cfg.txnID, ss.s.cfg.maxPending = "member", 1000
	_, _, live, _ := ss.prospect([]txnRecord{{from: tp, offset: 11, rec: &kgo.Record{}}})
	require.Empty(t, live, "11, past 10")
	require.False(t, ss.committedDone(es[1], nil), "11 settled, unproduced")
	_, _, live, _ = ss.prospect([]txnRecord{{from: tp, offset: 10, rec: &kgo.Record{}}, {from: tp, offset: 11, rec: &kgo.Record{}}})
	assert.Len(t, live, 1, "10 only: 11 waits for its retry")
}
