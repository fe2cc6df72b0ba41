package pipeline

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzWatermark drives the checkpoint tracker with positions that split into several
// derived items (flat-map outputs, tee branches), some of them grouped into batches,
// settling in an order the fuzzer picks. After every step the watermark must be exactly
// the end of the longest prefix of positions whose derived items have all settled: it
// never passes an unsettled item, and it never lags behind a settled prefix.
func FuzzWatermark(f *testing.F) {
	f.Add([]byte{3, 1, 2, 0, 4, 9, 7}, uint64(0))
	f.Add([]byte{0, 0, 0, 0}, uint64(5))
	f.Add([]byte{255, 128, 3, 3, 3, 17, 42, 1, 1, 1, 1}, uint64(100))
	f.Fuzz(func(t *testing.T, data []byte, start uint64) {
		start %= 1 << 40
		if len(data) == 0 {
			return
		}
		n := min(len(data), 64) // positions
		tr := newCheckpointTracker(start, 1<<30)
		// Derived items: each position splits into data[i]%4 items (0 settles at once).
		var items []uint64
		pending := make([]int, n) // derived items not yet settled, per position
		for i := range n {
			pos := start + uint64(i)
			k := int(data[i] % 4)
			tr.split(pos, k)
			pending[i] = k
			for range k {
				items = append(items, pos)
			}
		}
		// Group some consecutive derived items into batches.
		var units [][]uint64 // each unit settles at once: one item, or a batch
		for i := 0; i < len(items); {
			size := 1
			if b := data[i%len(data)]; b%3 == 0 {
				size = 1 + int(b%5)
			}
			size = min(size, len(items)-i)
			units = append(units, items[i:i+size])
			i += size
		}
		ids := make([]uint64, len(units))
		for i, u := range units {
			if len(u) == 1 {
				ids[i] = u[0]
			} else {
				ids[i] = tr.group(append([]uint64(nil), u...))
			}
		}
		check := func() {
			want := start + uint64(n)
			for i, p := range pending {
				if p > 0 {
					want = start + uint64(i)
					break
				}
			}
			if got := uint64(tr.watermark()); got != want {
				t.Fatalf("watermark %d, want %d (pending %v)", got, want, pending)
			}
		}
		check()
		// Settle the units in an order chosen by the data.
		order := make([]int, len(units))
		for i := range order {
			order[i] = i
		}
		for i := len(order) - 1; i > 0; i-- {
			j := int(data[i%len(data)]) % (i + 1)
			order[i], order[j] = order[j], order[i]
		}
		for _, u := range order {
			tr.settle(ids[u])
			for _, pos := range units[u] {
				pending[pos-start]--
				if pending[pos-start] < 0 {
					t.Fatalf("position %d settled too often", pos)
				}
			}
			check()
		}
		if len(tr.settled) != 0 || len(tr.refs) != 0 || len(tr.groups) != 0 {
			t.Fatalf("tracker keeps state after everything settled: %d settled, %d refs, %d groups",
				len(tr.settled), len(tr.refs), len(tr.groups))
		}
	})
}

// TestSenderPassesOverNoPos has a sender with no tracker at all derive and settle items
// of no position: an untracked run's items make no call to a tracker, so a nil one is
// never reached (a call would panic).
func TestSenderPassesOverNoPos(t *testing.T) {
	t.Parallel()
	var snd sender[int] // no tracker: any call to one panics
	pos := noPos
	assert.NotPanics(t, func() {
		snd.split(noPos, 0)
		snd.split(noPos, 3)
		assert.Nil(t, snd.ungroup(noPos, 2))
		snd.settle(noPos)
		snd.setAside(noPos, &ackMark{back: true})
		ctx := t.Context()
		assert.Equal(t, ctx, snd.scope(ctx, &pos))
	})
}

// TestNoTrackTracksNothing checks that the tracker of an untracked run does nothing and
// never waits: admit lets every position through, nothing is skipped, no batch is told
// to flush, and there is nothing to commit or to finish.
func TestNoTrackTracksNothing(t *testing.T) {
	t.Parallel()
	var tr tracker = noTrack{}
	ctx := t.Context()
	tr.split(1, 3)
	tr.settle(1)
	tr.setAside(1, &ackMark{})
	assert.Nil(t, tr.ungroup(tr.group([]uint64{1, 2}), 2))
	bound, err := tr.admit(ctx, 1<<40, nil)
	require.NoError(t, err)
	assert.Equal(t, noPos, bound)
	assert.False(t, tr.skipped(0))
	assert.Nil(t, tr.hungry())
	holds, moved := tr.holdsHead([]uint64{0})
	assert.False(t, holds)
	assert.Nil(t, moved)
	pos := uint64(0)
	assert.Equal(t, ctx, tr.scope(ctx, &pos))
	assert.False(t, tr.handsBack(0))
	assert.NoError(t, tr.finish(nil))
}

// TestTrackerAdmitWaits drives the one wait loop both trackers share: a checkpointed
// source past its bound waits for a save, an acknowledged one at its bound of pending
// items waits for a settlement. While it waits, batches are told to flush (hungry is
// closed); it stops waiting when the tracker makes room, when the run stops (its
// cause), or when a budget drains (errDraining).
func TestTrackerAdmitWaits(t *testing.T) {
	t.Parallel()
	errStop := errors.New("stop")
	type kind struct {
		name string
		// full returns a tracker whose source waits to admit the position returned,
		// and room, which lets it go on.
		full func(drain <-chan struct{}) (tr tracker, pos uint64, room func())
	}
	kinds := []kind{
		{"checkpoint", func(drain <-chan struct{}) (tracker, uint64, func()) {
			ck := newCheckpointTracker(10, 1<<30)
			ck.limit, ck.drain = 2, drain
			return ck, 12, func() { ck.markSaved(11) }
		}},
		{"acknowledged", func(drain <-chan struct{}) (tracker, uint64, func()) {
			ak := newAckTracker()
			ak.max, ak.drain = 1, drain
			ak.entries.size(ak.max)
			ak.entries.put(0, ackEntry{}) // emitted, not settled
			return ak, 1, func() { ak.settle(0) }
		}},
	}
	for _, k := range kinds {
		for _, end := range []string{"room", "stop", "drain"} {
			t.Run(k.name+"/"+end, func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					drain := make(chan struct{})
					tr, pos, room := k.full(drain)
					ctx, cancel := context.WithCancelCause(t.Context())
					defer cancel(nil)
					var err error
					admitted := make(chan struct{})
					go func() {
						defer close(admitted)
						_, err = tr.admit(ctx, pos, nil)
					}()
					synctest.Wait()
					select {
					case <-admitted:
						t.Fatal("admit did not wait")
					case <-tr.hungry():
					default:
						t.Fatal("a source waits, and hungry is not closed")
					}
					switch end {
					case "room":
						room()
					case "stop":
						cancel(errStop)
					case "drain":
						close(drain)
					}
					<-admitted
					switch end {
					case "room":
						require.NoError(t, err)
						select {
						case <-tr.hungry():
							t.Fatal("the source goes on, and hungry is still closed")
						default:
						}
					case "stop":
						require.ErrorIs(t, err, errStop)
					case "drain":
						require.ErrorIs(t, err, errDraining)
					}
				})
			})
		}
	}
}

// TestAckTrackerKeepsItsOwnMark sets aside one of two items derived from a source item
// and then reuses the mark it gave (as a worker reuses its item's fate): the source
// item's settlement is the record given, and the tracker keeps nothing once it fired.
func TestAckTrackerKeepsItsOwnMark(t *testing.T) {
	t.Parallel()
	ak := newAckTracker()
	ak.max = 4
	var got []Settlement
	_, err := ak.admit(t.Context(), 0, func(s Settlement) { got = append(got, s) })
	require.NoError(t, err)
	ak.split(0, 2)
	m := ackMark{dl: DeadLetter[struct{}]{Stage: "parse"}}
	ak.setAside(0, &m)
	m.dl.Stage, m.back = "reused", true // the worker's next item
	assert.Empty(t, got)
	ak.settle(0)
	require.Len(t, got, 1)
	assert.Equal(t, DeadLettered, got[0].Outcome)
	assert.Equal(t, "parse", got[0].DeadLetter.Stage)
	assert.Zero(t, ak.entries.len())
	assert.Empty(t, ak.refs)
	assert.Zero(t, ak.firing)
}

// TestAckTableSpillsPositionsWhoseSlotIsTaken holds position 0 while positions past the
// table's slots come and go: those that meet its slot (n, 2n, 3n, held too) go to the
// map, every one is found and taken once, and the positions left come out in order.
func TestAckTableSpillsPositionsWhoseSlotIsTaken(t *testing.T) {
	t.Parallel()
	var a ackTable
	a.size(1)
	n := uint64(len(a.slots))
	a.put(0, ackEntry{})
	for p := uint64(1); p <= 3*n; p++ {
		a.put(p, ackEntry{})
		if p%n != 0 { // the others settle at once
			_, ok := a.take(p)
			require.True(t, ok, "position %d", p)
		}
	}
	assert.Len(t, a.more, 3, "n, 2n and 3n met 0's slot")
	m := &ackMark{back: true}
	a.mark(2*n, m)
	assert.Same(t, m, a.get(2*n).mark)
	assert.Nil(t, a.get(0).mark)
	want := []uint64{0, n, 2 * n, 3 * n}
	assert.Equal(t, want, a.positions())
	assert.Equal(t, len(want), a.len())
	for _, p := range want {
		_, ok := a.take(p)
		require.True(t, ok, "position %d", p)
		_, ok = a.take(p)
		require.False(t, ok, "position %d taken twice", p)
	}
	assert.Zero(t, a.len())
	assert.Empty(t, a.more)
	assert.Nil(t, a.get(0))
}
