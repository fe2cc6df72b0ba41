package kafka

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
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

// TestSetAsideAfterAFenceIsDeadLetteredOnlyIfNoOneRedoesIt ends a claimed partition's
// assignment (a store transaction finds it fenced) while records 10 and 11 are in the
// pipeline, 10 written by an earlier store transaction (its offset stored past it), 11
// by none (the fenced one wrote nothing); then both are set aside. 11's dead letter is not produced (Stale): the new
// owner redoes it from the stored offset. 10's is, if its output came from its own
// message (another branch of a Tee: no stale message of it, staleTo below it), since
// no one reads it again; not if a stale message may have written it (at or below
// staleTo): that output is its outcome.
func TestSetAsideAfterAFenceIsDeadLetteredOnlyIfNoOneRedoesIt(t *testing.T) {
	t.Parallel()
	tp := TopicPartition{"in", 0}
	for _, tc := range []struct {
		name    string
		staleTo int64
		dead    int64 // dead-lettered: 10's
	}{
		{name: "no stale message", staleTo: -1, dead: 1},
		{name: "a stale message of 10", staleTo: 10, dead: 0},
	} {
		ss, es := pendingSession(tp, 10, 12)
		ss.s.cfg.store, ss.s.cfg.maxPending = nopStore{}, 1000
		ss.s.open = ss
		ss.outstanding = 2
		p := ss.parts[tp]
		p.claimed, p.epoch, p.stored, p.staleTo = true, 3, 10, tc.staleTo
		txn, err := ss.s.BeginStoreTxn([]Origin{{TopicPartition: tp, Offset: 10}})
		require.NoError(t, err)
		require.Equal(t, []bool{true}, txn.Keep, "%s: 10 written", tc.name)
		txn.End(true, nil)
		txn, err = ss.s.BeginStoreTxn([]Origin{{TopicPartition: tp, Offset: 11}})
		require.NoError(t, err)
		txn.End(true, []TopicPartition{tp}) // claimed by another owner since: 11 not written
		require.False(t, p.live, "%s: the assignment ended", tc.name)

		for _, e := range es {
			ss.settle(e, pipeline.Settlement{Outcome: pipeline.DeadLettered})
		}
		assert.Equal(t, tc.dead, ss.s.deadLettered.Load(), "%s: dead-lettered", tc.name)
		assert.Equal(t, int64(2), ss.s.stale.Load(), "%s: stale", tc.name)
	}
}

// nopStore is an OffsetStore that stores nothing.
type nopStore struct{}

func (nopStore) Claim(context.Context, []TopicPartition) ([]Claim, error) { return nil, nil }

func (nopStore) Save(context.Context, []StoreOffset) ([]TopicPartition, error) { return nil, nil }
