package pgpipe

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"reflect"
	"time"
)

// In the upsert modes, a key's rows must be written in source order, also when several
// writers run: [Writer.To] makes batches of [WithChunk]'s rows (and bytes) times the
// lanes, one per worker, splits each by a hash of the key into its lanes' parts of at
// most the chunk's rows, and gives the sink [pipeline.WithPartition] on the part's lane,
// so that each lane's parts are written by its own worker, one after the other, in batch order
// (a part being retried holds up the lane's later parts; a part set aside lets them
// go). A key's rows are all in one lane, so its last row in source order is written
// last. A key is hashed as PostgreSQL takes it, by its columns' types (keyType): two
// rows that are one key to PostgreSQL but two to Go (a time of a timestamp column in
// two locations, char(n)'s trailing spaces, citext's letter case) must share a lane,
// or two writers would write the key at once, in any order.
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
	// types are the key columns' (keyTypes), read before the first split (splitOn):
	// values that PostgreSQL takes as one key hash alike. nil takes each as keyPlain.
	types []keyType
}

func newLanes[T any](w *Writer[T], n int) *lanes[T] {
	l := &lanes[T]{w: w, n: n, max: w.cfg.rows, seed: maphash.MakeSeed(), empty: make([][]T, n)}
	for i := range l.empty {
		l.empty[i] = make([]T, 0, i+1)
	}
	return l
}

// splitOn is split for the lanes' stage ([Writer.To]): it reads the key columns' types
// first, once.
func (l *lanes[T]) splitOn(ctx context.Context, batch []T) ([][]T, error) {
	if l.types == nil {
		types, err := l.w.keyTypes(ctx)
		if err != nil {
			return nil, l.w.classify(ctx, err)
		}
		l.types = types
	}
	return l.split(batch), nil
}

// split returns batch's parts: each lane's rows in batch order, in parts of at most
// max rows (an empty part for a lane without rows), lane after lane.
func (l *lanes[T]) split(batch []T) [][]T {
	var h maphash.Hash // one for the batch: a Hash is 160 bytes, and Reset keeps its seed
	h.SetSeed(l.seed)
	var keys, buf []any
	of := make([]int32, len(batch)) // each row's lane
	count := make([]int, l.n)
	for i := range batch {
		var k int
		k, keys, buf = l.of(&batch[i], &h, keys, buf)
		of[i] = int32(k)
		count[k]++
	}
	// Every lane's rows in one array, each lane's run of it sized to its count: rows
	// appended lane by lane grew (and copied) each lane's slice about log2(rows) times.
	all := make([]T, len(batch))
	byLane := make([][]T, l.n)
	at := 0
	for k, c := range count {
		byLane[k] = all[at : at : at+c]
		at += c
	}
	for i := range batch {
		byLane[of[i]] = append(byLane[of[i]], batch[i])
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

// lane returns the lane of a part (for pipeline.WithPartition).
func (l *lanes[T]) lane(part []T) int {
	if len(part) == 0 {
		return cap(part) - 1
	}
	var h maphash.Hash
	h.SetSeed(l.seed)
	k, _, _ := l.of(&part[0], &h, nil, nil)
	return k
}

// of returns the lane of row v, by the hash (h, reset first, seeded with l.seed) of its
// key's values; keys that the writer's de-duplication takes as equal hash alike. keys
// and buf are Mapping.key's, returned for reuse.
func (l *lanes[T]) of(v *T, h *maphash.Hash, keys, buf []any) (int, []any, []any) {
	h.Reset()
	if l.w.kinds != nil {
		rv := l.w.mapping.value(v)
		for j, c := range l.w.keyIdx {
			f := rv.Field(l.w.mapping.fields[c])
			t := l.typeOf(j)
			switch k := l.w.kinds[j]; { // hashKey, on the same values
			case t.kind == keyOpaque:
			case k == reflect.String:
				h.WriteString(t.str(f.String()))
			case k == reflect.Int:
				maphash.WriteComparable(h, int(f.Int()))
			case k == reflect.Int64:
				maphash.WriteComparable(h, f.Int())
			case k == reflect.Int32:
				maphash.WriteComparable(h, int32(f.Int()))
			case k == reflect.Uint64:
				maphash.WriteComparable(h, f.Uint())
			case k == reflect.Float64:
				maphash.WriteComparable(h, floatBits(t.float(f.Float())))
			}
			h.WriteByte(0xff)
		}
		return int(h.Sum64() % uint64(l.n)), keys, buf
	}
	keys, buf = l.w.mapping.key(v, l.w.keyIdx, keys[:0], buf)
	hashKey(h, keys, l.types)
	return int(h.Sum64() % uint64(l.n)), keys, buf
}

// typeOf returns the keyType of key column j.
func (l *lanes[T]) typeOf(j int) keyType {
	if l.types == nil {
		return keyType{}
	}
	return l.types[j]
}

// hashKey writes a key's boxed values to h, each as its column's type (types, nil for
// keyPlain) says: keys that compareValues takes as equal, column by column, write
// alike, and so do keys that PostgreSQL takes as equal (as far as the types tell).
func hashKey(h *maphash.Hash, keys []any, types []keyType) {
	for j, x := range keys {
		var t keyType
		if types != nil {
			t = types[j]
		}
		if t.kind == keyOpaque {
			h.WriteByte(0xff)
			continue
		}
		switch x := x.(type) {
		case nil:
			h.WriteByte(0)
		case string:
			h.WriteString(t.str(x))
		case []byte:
			h.Write(x)
		case time.Time:
			switch t.kind {
			case keyWall: // equal wall clocks in any location
				maphash.WriteComparable(h, t.micros(wallClock(x), x.Nanosecond()))
			case keyInstant:
				maphash.WriteComparable(h, t.micros(x.Unix(), x.Nanosecond()))
			case keyDay:
				maphash.WriteComparable(h, floorDiv(wallClock(x), 24*60*60))
			default:
				maphash.WriteComparable(h, x.UnixNano()) // equal instants in any location
			}
		case int:
			maphash.WriteComparable(h, x)
		case int64:
			maphash.WriteComparable(h, x)
		case int32:
			maphash.WriteComparable(h, x)
		case uint64:
			maphash.WriteComparable(h, x)
		case float64:
			maphash.WriteComparable(h, floatBits(t.float(x)))
		default: // what compareValues compares: the printed value (== may differ, or panic)
			_, _ = fmt.Fprint(h, x) // a maphash.Hash never fails
		}
		h.WriteByte(0xff)
	}
}

// wallClock returns the seconds of t's wall clock since 1970-01-01 00:00:00, which pgx
// writes into a timestamp without time zone (or, by its day, a date) whatever t's
// location.
func wallClock(t time.Time) int64 {
	_, offset := t.Zone()
	return t.Unix() + int64(offset)
}

// floorDiv is a/b rounded down.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// floatBits is what a key's float64 hashes as: its bits, with -0 as 0 and every NaN as
// one NaN, since compareValues (cmp.Compare) takes -0 and 0 as equal, and NaN as equal
// to NaN (so does PostgreSQL's float8). maphash.WriteComparable hashes each NaN anew: a
// NaN key got a lane at random, for its row and again for its part (lane).
func floatBits(f float64) uint64 {
	switch {
	case f == 0:
		return 0
	case f != f:
		return 0x7ff8000000000001
	}
	return math.Float64bits(f)
}
