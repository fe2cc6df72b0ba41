package pgpipe_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// keyRow has a field of each key type the writer reads unboxed, one of a named type and
// a pointer (read boxed), and a value that is not part of any key. The fields the
// mapping skips come first, so that a column's index is not its field's.
type keyRow struct {
	hidden int
	Skip   string `db:"-"`
	I64    int64
	S      string
	F      float64
	I32    int32
	U64    uint64
	I      int
	Named  label
	P      *string
	V      int
}

type label string

func keyRowID(r keyRow) int { return r.V }

// TestKeyUnboxedAgreesWithBoxed checks the upsert modes' reading of a row's key: read
// unboxed from a struct's fields, it keeps the rows and gives the lanes that boxing
// every column gives (the reference), rows with equal keys share a lane, and each lane's
// parts hold its rows in batch order; for keys of one and several columns, with many
// duplicates, zero of both signs, NaN, empty strings, and NULL beside the string
// "<nil>" (rows with a NULL in their key are all kept: ON CONFLICT never matches them).
func TestKeyUnboxedAgreesWithBoxed(t *testing.T) {
	floats := []float64{0, math.Copysign(0, -1), 1.5, -2, math.Inf(1), math.NaN()}
	strs := []string{"", "a", "b", "ab", "é", "<nil>", "A", "a  ", "É"}
	r := rand.New(rand.NewPCG(1, 2))
	batch := make([]keyRow, 2000)
	for i := range batch {
		batch[i] = keyRow{
			I64: r.Int64N(40) - 20, S: strs[r.IntN(len(strs))], F: floats[r.IntN(len(floats))],
			I32: int32(r.IntN(7)) - 3, U64: r.Uint64N(5) << 62, I: r.IntN(9), Named: label(strs[r.IntN(len(strs))]),
			V: i, hidden: -i, Skip: "skipped",
		}
		if j := r.IntN(len(strs) + 1); j < len(strs) {
			batch[i].P = &strs[j]
		}
	}
	for _, tc := range []struct {
		key     []string
		unboxed bool
	}{
		{[]string{"i64"}, true},
		{[]string{"s"}, true},
		{[]string{"f"}, true},
		{[]string{"i32", "u64", "i"}, true},
		{[]string{"s", "i64", "f"}, true},
		{[]string{"named"}, false},
		{[]string{"i64", "named"}, false},
		{[]string{"p"}, false},
		{[]string{"i32", "p"}, false},
	} {
		t.Run(fmt.Sprint(tc.key), func(t *testing.T) {
			for _, lanes := range []int{2, 4} {
				fast, ref, fastLanes, refLanes, unboxed, problem := pgpipe.KeyPaths(pgpipe.Struct[keyRow](), tc.key, nil, batch, lanes, keyRowID)
				require.Equal(t, tc.unboxed, unboxed, "read unboxed")
				assert.Empty(t, problem)
				assert.Equal(t, ref, fast, "rows kept")
				assert.Equal(t, refLanes, fastLanes, "lanes")
				assert.Less(t, len(fast), len(batch), "no duplicate key was dropped: the test proves nothing")
			}
		})
	}
	// The lanes take a key column's values as its type does (char(n), citext, float4, a
	// nondeterministic collation): unboxed as boxed.
	for _, types := range []map[string]string{
		{"s": "bpchar", "f": "float4"},
		{"s": "citext"},
		{"s": "nondeterministic"},
	} {
		t.Run(fmt.Sprint(types), func(t *testing.T) {
			for _, key := range [][]string{{"s"}, {"s", "i64", "f"}} {
				fast, ref, fastLanes, refLanes, unboxed, problem := pgpipe.KeyPaths(pgpipe.Struct[keyRow](), key, types, batch, 4, keyRowID)
				require.True(t, unboxed, "read unboxed")
				assert.Empty(t, problem)
				assert.Equal(t, ref, fast, "rows kept")
				assert.Equal(t, refLanes, fastLanes, "lanes")
			}
		})
	}
	t.Run("null", func(t *testing.T) {
		fast, _, _, _, _, _ := pgpipe.KeyPaths(pgpipe.Struct[keyRow](), []string{"p"}, nil, batch, 2, keyRowID)
		nulls, strings := 0, 0
		for _, row := range batch {
			if row.P == nil {
				nulls++
			}
		}
		for _, v := range fast { // the writer's rows kept
			if row := batch[v]; row.P == nil {
				nulls--
			} else if *row.P == "<nil>" {
				strings++
			}
		}
		assert.Zero(t, nulls, "rows with a NULL key dropped")
		assert.Equal(t, 1, strings, "rows with the key \"<nil>\" kept")
	})
	t.Run("pointer", func(t *testing.T) {
		ptrs := make([]*keyRow, len(batch))
		for i := range batch {
			ptrs[i] = &batch[i]
		}
		fast, ref, fastLanes, refLanes, unboxed, problem := pgpipe.KeyPaths(pgpipe.Struct[*keyRow](), []string{"s", "i64"}, nil, ptrs, 3, func(r *keyRow) int { return r.V })
		require.True(t, unboxed, "read unboxed")
		assert.Empty(t, problem)
		assert.Equal(t, ref, fast, "rows kept")
		assert.Equal(t, refLanes, fastLanes, "lanes")
		assert.Less(t, len(fast), len(batch), "no duplicate key was dropped: the test proves nothing")
	})
}

// FuzzKeyUnboxed checks TestKeyUnboxedAgreesWithBoxed's invariants on rows made from
// the fuzzer's bytes: each row takes 6 of them, for its int64, int32, uint64 and
// float64 fields (few values, so that keys repeat) and a string of up to 3 bytes; the
// first byte picks the key columns.
func FuzzKeyUnboxed(f *testing.F) {
	f.Add([]byte{0x0f, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 9, 9, 9, 9, 9, 9})
	f.Add([]byte{0x03, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	cols := []string{"i64", "s", "f", "i32", "u64"}
	floats := []float64{0, math.Copysign(0, -1), 1, -1, math.Inf(-1), math.MaxFloat64, math.NaN(), 0.1}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 7 {
			return
		}
		var key []string
		for j, c := range cols {
			if data[0]&(1<<j) != 0 {
				key = append(key, c)
			}
		}
		if len(key) == 0 {
			key = []string{"i64"}
		}
		var batch []keyRow
		for b := data[1:]; len(b) >= 6; b = b[6:] {
			batch = append(batch, keyRow{
				I64: int64(int8(b[0] & 0x87)), I32: int32(b[1] % 3), U64: uint64(b[1]>>6) << 62,
				F: floats[b[2]%8], S: string(b[3 : 3+(b[2]>>6)%4]), V: len(batch),
			})
		}
		fast, ref, fastLanes, refLanes, unboxed, problem := pgpipe.KeyPaths(pgpipe.Struct[keyRow](), key, nil, batch, 3, keyRowID)
		if !unboxed {
			t.Fatal("not read unboxed")
		}
		if problem != "" {
			t.Fatalf("key %v: %s", key, problem)
		}
		if !slices.Equal(fast, ref) {
			t.Fatalf("key %v: rows kept unboxed %v, boxed %v", key, fast, ref)
		}
		if !slices.Equal(fastLanes, refLanes) {
			t.Fatalf("key %v: lanes unboxed %v, boxed %v", key, fastLanes, refLanes)
		}
	})
}
