package pipeline

import (
	"testing"
)

// FuzzBudget feeds a random sequence of outcomes into a budget and compares it with a
// naive reference that recounts the whole sample (or window) at every step: the
// counts are never negative, the budget trips exactly at the first outcome after which
// seen >= MinSample and failed/seen > MaxRatio, and it never trips twice.
func FuzzBudget(f *testing.F) {
	f.Add(uint8(51), uint8(5), uint8(0), []byte{0, 0, 1, 0, 1, 1, 1, 1})
	f.Add(uint8(0), uint8(1), uint8(0), []byte{0, 0, 0, 1})
	f.Add(uint8(25), uint8(4), uint8(4), []byte{1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1})
	f.Add(uint8(128), uint8(10), uint8(20), []byte("\x00\x01\x00\x01\x01\x01\x00\x01\x01\x01\x01\x01\x01\x01"))
	f.Add(uint8(255), uint8(3), uint8(3), []byte{1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, ratio, minSample, window uint8, outcomes []byte) {
		b := Budget{
			MaxRatio:  float64(ratio) / 256, // in [0, 1)
			MinSample: max(1, int(minSample)%64),
		}
		if window > 0 {
			b.Window = b.MinSample + int(window)%64
		}
		s := newBudgetState(b)
		var history []bool
		tripped := false
		for i, o := range outcomes {
			failed := o&1 == 1
			history = append(history, failed)
			got := s.record(failed)

			if s.seen < 0 || s.failed < 0 || s.failed > s.seen {
				t.Fatalf("outcome %d: bad counts failed=%d seen=%d", i, s.failed, s.seen)
			}
			// The reference: recount the sample.
			sample := history
			if b.Window > 0 && len(sample) > b.Window {
				sample = sample[len(sample)-b.Window:]
			}
			var nf int64
			for _, f := range sample {
				if f {
					nf++
				}
			}
			seen := int64(len(sample))
			over := seen >= int64(b.MinSample) && float64(nf)/float64(seen) > b.MaxRatio
			switch {
			case tripped:
				if got != nil {
					t.Fatalf("outcome %d: tripped twice", i)
				}
				continue
			case over && got == nil:
				t.Fatalf("outcome %d: %d/%d failed over a budget of %v (min %d, window %d), but it did not trip",
					i, nf, seen, b.MaxRatio, b.MinSample, b.Window)
			case !over && got != nil:
				t.Fatalf("outcome %d: tripped at %d/%d failed, within a budget of %v (min %d, window %d)",
					i, got.Failed, got.Seen, b.MaxRatio, b.MinSample, b.Window)
			case got != nil:
				tripped = true
				want := BudgetError{Failed: nf, Seen: seen, MaxRatio: b.MaxRatio, Window: b.Window}
				if *got != want {
					t.Fatalf("outcome %d: got %+v, want %+v", i, *got, want)
				}
			}
			if s.seen != seen || s.failed != nf {
				t.Fatalf("outcome %d: counts failed=%d seen=%d, want %d/%d", i, s.failed, s.seen, nf, seen)
			}
		}
	})
}
