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

// keyRow has a field of each key type the writer reads unboxed, one of a named type
// (read boxed), and a value that is not part of any key.
type keyRow struct {
	I64   int64
	S     string
	F     float64
	I32   int32
	U64   uint64
	I     int
	Named label
	V     int
}

type label string

// TestKeyUnboxedAgreesWithBoxed checks that the upsert modes' unboxed reading of a
// struct's key fields (lanes and de-duplication) gives what boxing every value gives:
// the same rows kept, in the same order, and the same lane for every row, for keys of
// one and several columns, with many duplicates, zero of both signs and empty strings.
func TestKeyUnboxedAgreesWithBoxed(t *testing.T) {
	floats := []float64{0, math.Copysign(0, -1), 1.5, -2, math.Inf(1)}
	strs := []string{"", "a", "b", "ab", "é"}
	r := rand.New(rand.NewPCG(1, 2))
	batch := make([]keyRow, 2000)
	for i := range batch {
		batch[i] = keyRow{
			I64: r.Int64N(40) - 20, S: strs[r.IntN(len(strs))], F: floats[r.IntN(len(floats))],
			I32: int32(r.IntN(7)) - 3, U64: r.Uint64N(5) << 62, I: r.IntN(9), Named: label(strs[r.IntN(len(strs))]),
			V: i,
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
	} {
		t.Run(fmt.Sprint(tc.key), func(t *testing.T) {
			for _, lanes := range []int{2, 4} {
				fast, boxed, fastLanes, boxedLanes, unboxed := pgpipe.KeyPaths(pgpipe.Struct[keyRow](), tc.key, batch, lanes)
				require.Equal(t, tc.unboxed, unboxed, "read unboxed")
				assert.Equal(t, boxed, fast, "rows kept")
				assert.Equal(t, boxedLanes, fastLanes, "lanes")
				assert.Less(t, len(fast), len(batch), "no duplicate key was dropped: the test proves nothing")
			}
		})
	}
	t.Run("pointer", func(t *testing.T) {
		ptrs := make([]*keyRow, len(batch))
		for i := range batch {
			ptrs[i] = &batch[i]
		}
		fast, boxed, fastLanes, boxedLanes, unboxed := pgpipe.KeyPaths(pgpipe.Struct[*keyRow](), []string{"s", "i64"}, ptrs, 3)
		require.True(t, unboxed, "read unboxed")
		assert.Equal(t, boxed, fast, "rows kept")
		assert.Equal(t, boxedLanes, fastLanes, "lanes")
	})
}

// FuzzKeyUnboxed checks TestKeyUnboxedAgreesWithBoxed's invariant on rows made from
// the fuzzer's bytes: each row takes 6 of them, for its int64, int32, uint64 and
// float64 fields (few values, so that keys repeat) and a string of up to 3 bytes; the
// first byte picks the key columns.
func FuzzKeyUnboxed(f *testing.F) {
	f.Add([]byte{0x0f, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 9, 9, 9, 9, 9, 9})
	f.Add([]byte{0x03, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	cols := []string{"i64", "s", "f", "i32", "u64"}
	floats := []float64{0, math.Copysign(0, -1), 1, -1, math.Inf(-1), math.MaxFloat64, math.SmallestNonzeroFloat64, 0.1}
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
				F: floats[b[2]%8], S: string(b[3 : 3+b[2]>>6%4]), V: len(batch),
			})
		}
		fast, boxed, fastLanes, boxedLanes, unboxed := pgpipe.KeyPaths(pgpipe.Struct[keyRow](), key, batch, 3)
		if !unboxed {
			t.Fatal("not read unboxed")
		}
		if !slices.Equal(fast, boxed) {
			t.Fatalf("key %v: rows kept unboxed %v, boxed %v", key, fast, boxed)
		}
		if !slices.Equal(fastLanes, boxedLanes) {
			t.Fatalf("key %v: lanes unboxed %v, boxed %v", key, fastLanes, boxedLanes)
		}
	})
}
