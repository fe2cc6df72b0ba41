package pgpipe_test

import (
	"fmt"
	"math"
	"math/rand/v2"
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
