package pgpipe

import (
	"fmt"
	"hash/maphash"
	"time"
)

// In the upsert modes, a key's rows must be written in source order, also when several
// writers run: [Writer.To] makes batches of [WithChunk]'s rows (and bytes) times the
// lanes, one per worker, splits each by a hash of the key into its lanes' parts of at
// most the chunk's rows, and gives the sink [pipeline.WithKey] on the part's lane, so
// that each lane's parts are written by one worker, one after the other, in batch order
// (a part being retried holds up the lane's later parts; a part set aside lets them
// go). A key's rows are all in one lane, so its last row in source order is written
// last.
//
// Every batch has a part in every lane, empty ones included: a batch's positions settle
// when its last part is written, so a batch can only settle after every earlier batch
// (each lane writes the earlier batch's part first), and a checkpoint never records a
// batch as written while an earlier one that shares a key with it may be redone on
// resume.

// lanes splits batches of T into parts by the hash of their key.
type lanes[T any] struct {
	w     *Writer[T]
	n     int // lanes
	max   int // rows in a part
	seed  maphash.Seed
	empty [][]T // empty[i] is lane i's empty part: its capacity, i+1, tells its lane
}

func newLanes[T any](w *Writer[T], n int) *lanes[T] {
	l := &lanes[T]{w: w, n: n, max: w.cfg.rows, seed: maphash.MakeSeed(), empty: make([][]T, n)}
	for i := range l.empty {
		l.empty[i] = make([]T, 0, i+1)
	}
	return l
}

// split returns batch's parts: each lane's rows in batch order, in parts of at most
// max rows (an empty part for a lane without rows), lane after lane.
func (l *lanes[T]) split(batch []T) [][]T {
	byLane := make([][]T, l.n)
	buf := make([]any, 0, len(l.w.columns))
	for i := range batch {
		var k int
		k, buf = l.of(&batch[i], buf)
		byLane[k] = append(byLane[k], batch[i])
	}
	parts := make([][]T, 0, l.n+1)
	for i, rows := range byLane {
		if len(rows) == 0 {
			parts = append(parts, l.empty[i])
		}
		for len(rows) > 0 {
			n := min(len(rows), l.max)
			parts = append(parts, rows[:n:n])
			rows = rows[n:]
		}
	}
	if len(parts) == len(batch) {
		// pipeline.Flatten would take the parts for the batch's items, settling one
		// position each: one part more makes them parts of the batch as a whole.
		parts = append(parts, l.empty[0])
	}
	return parts
}

// lane returns the lane of a part (for pipeline.WithKey).
func (l *lanes[T]) lane(part []T) int {
	if len(part) == 0 {
		return cap(part) - 1
	}
	k, _ := l.of(&part[0], nil)
	return k
}

// of returns the lane of row v, by the hash of its key's values; keys that the writer's
// de-duplication takes as equal hash alike.
func (l *lanes[T]) of(v *T, buf []any) (int, []any) {
	buf = l.w.mapping.fill(v, buf[:0])
	var h maphash.Hash
	h.SetSeed(l.seed)
	for _, c := range l.w.keyIdx {
		switch x := deref(buf[c]).(type) {
		case nil:
			h.WriteByte(0)
		case string:
			h.WriteString(x)
		case []byte:
			h.Write(x)
		case time.Time:
			maphash.WriteComparable(&h, x.UnixNano()) // equal instants in any location
		case int:
			maphash.WriteComparable(&h, x)
		case int64:
			maphash.WriteComparable(&h, x)
		case int32:
			maphash.WriteComparable(&h, x)
		case uint64:
			maphash.WriteComparable(&h, x)
		case float64:
			maphash.WriteComparable(&h, x)
		default: // what compareValues compares: the printed value (== may differ, or panic)
			_, _ = fmt.Fprint(&h, x) // a maphash.Hash never fails
		}
		h.WriteByte(0xff)
	}
	return int(h.Sum64() % uint64(l.n)), buf
}
