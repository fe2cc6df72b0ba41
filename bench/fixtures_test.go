package bench

import (
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
)

// fixture is testdata/items.json: the failing items of the scenarios, drawn with
// SplitMix64 so that every implementation, in every language, fails the same items.
type fixture struct {
	Seed                   uint64   `json:"seed"`
	SplitMix64FirstOutputs []string `json:"splitmix64_first_outputs"`
	Scenario1              struct {
		NItems    int    `json:"n_items"`
		How       string `json:"how"`
		Permanent []int  `json:"permanent"`
		Transient []int  `json:"transient"`
		Hang      []int  `json:"hang"`
	} `json:"scenario1"`
	Scenario2 struct {
		NItems    int    `json:"n_items"`
		How       string `json:"how"`
		Fail2pct  []int  `json:"fail_2pct"`
		Fail50pct []int  `json:"fail_50pct"`
	} `json:"scenario2"`
}

var loadFixtureOnce = sync.OnceValues(func() (*fixture, error) {
	data, err := os.ReadFile("testdata/items.json")
	if err != nil {
		return nil, err
	}
	fx := new(fixture)
	if err := json.Unmarshal(data, fx); err != nil {
		return nil, err
	}
	return fx, nil
})

// loadFixture returns the parsed testdata/items.json, failing tb when it cannot be read.
func loadFixture(tb testing.TB) *fixture {
	tb.Helper()
	fx, err := loadFixtureOnce()
	if err != nil {
		tb.Fatalf("loading the fixture: %v", err)
	}
	return fx
}

// splitMix64 is Steele, Lea and Flood's SplitMix64 generator, as used to make the
// fixture.
type splitMix64 struct{ state uint64 }

func (s *splitMix64) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform returns a float64 in [0, 1) from the top 53 bits of the next output.
func (s *splitMix64) uniform() float64 {
	return float64(s.next()>>11) * 0x1p-53
}

// permutation returns a permutation of 0..n-1 by Fisher-Yates from the top:
// for i from n-1 down to 1, swap element i with element next() % (i+1).
func (s *splitMix64) permutation(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	for i := n - 1; i > 0; i-- {
		j := int(s.next() % uint64(i+1))
		p[i], p[j] = p[j], p[i]
	}
	return p
}

func sorted(s []int) []int {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestFixtures checks the SplitMix64 port against the outputs recorded in the fixture,
// and regenerates every list of failing ids the way the fixture's "how" fields
// describe them.
func TestFixtures(t *testing.T) {
	t.Parallel()
	fx := loadFixture(t)

	t.Run("splitmix64", func(t *testing.T) {
		t.Parallel()
		g := splitMix64{state: fx.Seed}
		for i, want := range fx.SplitMix64FirstOutputs {
			if got := strconv.FormatUint(g.next(), 10); got != want {
				t.Errorf("output %d = %s, want %s", i, got, want)
			}
		}
	})

	t.Run("scenario1", func(t *testing.T) {
		t.Parallel()
		s1 := fx.Scenario1
		if s1.NItems != 10_000 {
			t.Fatalf("n_items = %d, want 10000", s1.NItems)
		}
		g := splitMix64{state: fx.Seed}
		perm := g.permutation(s1.NItems)
		for _, c := range []struct {
			name   string
			lo, hi int
			want   []int
		}{
			{"permanent", 0, 100, s1.Permanent},
			{"transient", 100, 300, s1.Transient},
			{"hang", 300, 305, s1.Hang},
		} {
			if got := sorted(perm[c.lo:c.hi]); !slices.Equal(got, sorted(c.want)) {
				t.Errorf("%s: perm[%d:%d] sorted = %v, the fixture has %v", c.name, c.lo, c.hi, got, c.want)
			}
		}
	})

	t.Run("scenario2", func(t *testing.T) {
		t.Parallel()
		s2 := fx.Scenario2
		if s2.NItems != 2_000 {
			t.Fatalf("n_items = %d, want 2000", s2.NItems)
		}
		for _, c := range []struct {
			name string
			p    float64
			want []int
		}{
			{"fail_2pct", 0.02, s2.Fail2pct},
			{"fail_50pct", 0.50, s2.Fail50pct},
		} {
			g := splitMix64{state: fx.Seed}
			var got []int
			for i := range s2.NItems {
				if g.uniform() < c.p {
					got = append(got, i)
				}
			}
			if !slices.Equal(got, sorted(c.want)) {
				t.Errorf("%s: regenerated %d ids %v, the fixture has %d: %v", c.name, len(got), got, len(c.want), c.want)
			}
		}
	})
}
