package ratelimit

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKeyedLimitersForget checks that the limiters of idle keys are dropped once their
// buckets have refilled (a new one would be the same), that a busy key's is kept, and
// that a key seen again starts with a full burst.
func TestKeyedLimitersForget(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		k := NewKeyed[int](100, 10) // refills in 100 ms
		wait := func(key int) error {
			_, err := k.WaitAtMost(t.Context(), key, 0)
			return err
		}
		for key := range 1000 {
			require.NoError(t, wait(key))
		}
		assert.Equal(t, 1000, k.size())
		for range 20 { // key 7 is busy: its bucket empties, at 110 ms of virtual time
			require.NoError(t, wait(7))
		}
		require.NoError(t, wait(8))
		assert.Equal(t, 2, k.size(), "every idle key but 7 (its bucket is not full yet) and 8 dropped")
		time.Sleep(time.Second)
		t0 := time.Now()
		for range 10 {
			require.NoError(t, wait(7))
		}
		assert.Zero(t, time.Since(t0), "a full burst again")
		assert.Equal(t, 1, k.size())
	})
}
