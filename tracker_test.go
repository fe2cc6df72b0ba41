package pipeline

import (
	"testing"
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
