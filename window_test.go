package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// ev is an event of the window tests: a key, an event time and a value.
type ev struct {
	Key int
	T   time.Time
	V   int
}

func evKey(e ev) int                      { return e.Key }
func evTime(e ev) time.Time               { return e.T }
func evSum(s int, e ev) int               { return s + e.V }
func addInts(a, b int) int                { return a + b }
func sumAgg() pipeline.Aggregate[ev, int] { return pipeline.FoldMerge(0, evSum, addInts) }

// epoch is the event time of offset 0 in the window tests.
var epoch = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)

func tsec(s float64) time.Time { return epoch.Add(time.Duration(s * float64(time.Second))) }

// wkey names a window of the model: its key and start.
type wkey struct {
	key   int
	start time.Time
}

// wval is a window's value in the model: the sum and count of its items, and its end.
type wval struct {
	end    time.Time
	sum, n int
	writes int // the table's: times the window's row was written
}

// winSpec is a window kind with the parameters the model needs.
type winSpec struct {
	name             string
	size, slide, gap time.Duration
}

func (w winSpec) kind() pipeline.WindowKind {
	switch {
	case w.gap > 0:
		return pipeline.Session(w.gap)
	case w.slide == w.size:
		return pipeline.Tumbling(w.size)
	default:
		return pipeline.Sliding(w.size, w.slide)
	}
}

// model computes, item by item in arrival order and without the stage's code, each
// window's sum and count, and the late items: an aligned item is late when the earliest
// window holding it ended at or before the watermark less the lateness; the watermark is
// the greatest event time seen less the delay. Sessions are computed offline from the
// sorted times of each key: the model holds for sessions when no item is late (a delay
// at least the input's disorder).
func model(spec winSpec, evs []ev, delay, lateness time.Duration) (map[wkey]wval, int) {
	out := map[wkey]wval{}
	if spec.gap > 0 {
		byKey := map[int][]ev{}
		for _, e := range evs {
			byKey[e.Key] = append(byKey[e.Key], e)
		}
		for k, es := range byKey {
			sort.SliceStable(es, func(i, j int) bool { return es[i].T.Before(es[j].T) })
			var cur wkey
			var v wval
			for i, e := range es {
				if i == 0 || e.T.Sub(es[i-1].T) >= spec.gap {
					if i > 0 {
						out[cur] = v
					}
					cur, v = wkey{k, e.T}, wval{}
				}
				v.sum += e.V
				v.n++
				v.end = e.T.Add(spec.gap)
			}
			out[cur] = v
		}
		return out, 0
	}
	late := 0
	wm := time.Time{}
	seen := false
	var maxT time.Time
	for _, e := range evs {
		var starts []time.Time
		// every start aligned to the slide, from the epoch, with start <= t < start+size
		base := time.Unix(0, 0).UTC()
		k := int64(e.T.Sub(base) / spec.slide)
		for s := base.Add(time.Duration(k) * spec.slide); e.T.Before(s.Add(spec.size)); s = s.Add(-spec.slide) {
			starts = append([]time.Time{s}, starts...)
		}
		if seen && !starts[0].Add(spec.size).Add(lateness).After(wm) {
			late++
		} else {
			for _, s := range starts {
				v := out[wkey{e.Key, s}]
				v.sum += e.V
				v.n++
				v.end = s.Add(spec.size)
				out[wkey{e.Key, s}] = v
			}
		}
		if !seen || e.T.After(maxT) {
			maxT, seen = e.T, true
			if w := e.T.Add(-delay); w.After(wm) || wm.IsZero() {
				wm = w
			}
		}
	}
	return out, late
}

// stream returns n events over keys keys, in arrival order, with event times that
// grow by up to step and are each up to disorder behind the latest one before it.
func stream(rng *rand.Rand, n, keys int, step, disorder time.Duration) []ev {
	evs := make([]ev, n)
	base := tsec(0)
	for i := range evs {
		base = base.Add(time.Duration(rng.Int64N(int64(step) + 1)))
		t := base
		if disorder > 0 && rng.IntN(3) == 0 {
			t = t.Add(-time.Duration(rng.Int64N(int64(disorder) + 1)))
		}
		evs[i] = ev{Key: rng.IntN(keys), T: t, V: 1 + rng.IntN(9)}
	}
	return evs
}

var winSpecs = []winSpec{
	{name: "tumbling", size: 10 * time.Second, slide: 10 * time.Second},
	{name: "sliding", size: 10 * time.Second, slide: 4 * time.Second},
	{name: "session", gap: 3 * time.Second},
}

// windowPath is one of the two ways a one-worker Window stage runs: inline, folding its
// items in the goroutine that produces them (what it does when it can: see Window), or
// queued, in a goroutine of its own behind its input queue (a WithBuffer of its own asks
// for the queue). Every test of a one-worker stage whose configuration allows both runs
// on both (a subtest per path, named for it), and they must give the same results and
// figures.
type windowPath struct {
	name string
	opts []pipeline.WindowOption
}

var windowPaths = []windowPath{
	{"inline", nil},
	{"queued", []pipeline.WindowOption{pipeline.WithBuffer(pipeline.DefaultBuffer)}},
}

// onWindowPaths runs f in a parallel subtest for each of windowPaths, named after it,
// with its options.
func onWindowPaths(t *testing.T, f func(t *testing.T, path ...pipeline.WindowOption)) {
	t.Helper()
	for _, wp := range windowPaths {
		t.Run(wp.name, func(t *testing.T) {
			t.Parallel()
			f(t, wp.opts...)
		})
	}
}

// with returns opts followed by more, in a new slice.
func with(opts []pipeline.WindowOption, more ...pipeline.WindowOption) []pipeline.WindowOption {
	return slices.Concat(opts, more)
}

// checkWindows runs one random stream of a few keys through a Window stage and
// compares its results with the model's (checkStream). It returns the results and the
// stage's report.
func checkWindows(t *testing.T, spec winSpec, seed uint64, delay, lateness time.Duration, path ...pipeline.WindowOption) ([]pipeline.WindowResult[int, int], pipeline.StageReport) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b9))
	evs := stream(rng, rng.IntN(300), 1+rng.IntN(4), 2*time.Second, 6*time.Second)
	return checkStream(t, spec, evs, seed, delay, lateness, path...)
}

// checkStream runs evs through a Window stage and compares its results with the
// model's: the last result of each window equals the model's, each window has exactly
// one first result, and late items are dead-lettered and counted.
func checkStream(t *testing.T, spec winSpec, evs []ev, seed uint64, delay, lateness time.Duration, path ...pipeline.WindowOption) ([]pipeline.WindowResult[int, int], pipeline.StageReport) {
	t.Helper()
	if spec.gap > 0 {
		delay = max(delay, 6*time.Second) // the session model holds without late items
		lateness = 0
	}
	want, wantLate := model(spec, evs, delay, lateness)
	p := pipeline.New()
	dl := pipeline.NewDeadLetterBuffer[ev](max(1000, len(evs)))
	res, err := pipeline.Collect(t.Context(), pipeline.Window(pipeline.FromSlice(p, evs), spec.kind(), evKey, evTime, sumAgg(),
		with(path, pipeline.WithMaxDelay(delay), pipeline.WithAllowedLateness(lateness), pipeline.WithLateItems(dl.Add))...))
	require.NoError(t, err)
	got := map[wkey]wval{}
	firsts := map[wkey]int{}
	var lastEnd time.Time
	for _, r := range res {
		k := wkey{r.Key, r.Start}
		if !r.Update {
			firsts[k]++
			if lateness == 0 {
				assert.False(t, r.End.Before(lastEnd), "first results come in order of end: %v after %v", r.End, lastEnd)
				lastEnd = r.End
			}
		} else {
			assert.Positive(t, lateness, "an update without allowed lateness")
			assert.Equal(t, 1, firsts[k], "an update before the first result")
		}
		got[k] = wval{end: r.End, sum: r.Value, n: r.Count}
	}
	assert.Equal(t, want, got, "seed %d", seed)
	for k, n := range firsts {
		assert.Equal(t, 1, n, "window %v fired %d times", k, n)
	}
	assert.Len(t, dl.Items(), wantLate)
	for _, d := range dl.Items() {
		assert.Equal(t, "late", d.ErrType)
	}
	rep := p.Report()
	checkAccounting(t, rep)
	s, ok := rep.Stage("Window")
	require.True(t, ok)
	assert.Equal(t, int64(wantLate), s.DeadLettered)
	require.NotNil(t, s.Windows)
	assert.Equal(t, int64(wantLate), s.Windows.Late)
	assert.Zero(t, s.Windows.Open)
	assert.Equal(t, int64(len(res)), s.Out)
	return res, s
}

func TestWindowMatchesModel(t *testing.T) {
	t.Parallel()
	for _, spec := range winSpecs {
		for _, d := range []struct{ delay, lateness time.Duration }{{0, 0}, {2 * time.Second, 0}, {6 * time.Second, 0}, {time.Second, 3 * time.Second}} {
			for _, path := range windowPaths {
				t.Run(fmt.Sprintf("%s/delay=%v/lateness=%v/%s", spec.name, d.delay, d.lateness, path.name), func(t *testing.T) {
					t.Parallel()
					for seed := range uint64(25) {
						checkWindows(t, spec, seed, d.delay, d.lateness, path.opts...)
					}
				})
			}
		}
	}
}

// TestWindowManyKeysMatchModel checks streams of many keys against the model: a bucket
// of windows (window_state.go) then holds enough keys to grow its table, and windows
// forgotten one by one (fired with the allowed lateness kept, or late) move the entries
// after them.
func TestWindowManyKeysMatchModel(t *testing.T) {
	t.Parallel()
	for _, spec := range winSpecs {
		for _, d := range []struct{ delay, lateness time.Duration }{{0, 0}, {2 * time.Second, 0}, {time.Second, 3 * time.Second}} {
			for _, path := range windowPaths {
				t.Run(fmt.Sprintf("%s/delay=%v/lateness=%v/%s", spec.name, d.delay, d.lateness, path.name), func(t *testing.T) {
					t.Parallel()
					for seed, keys := range []int{17, 100, 400} {
						rng := rand.New(rand.NewPCG(uint64(seed), 99))
						evs := stream(rng, 4000, keys, 30*time.Millisecond, 6*time.Second)
						checkStream(t, spec, evs, uint64(seed), d.delay, d.lateness, path.opts...)
					}
				})
			}
		}
	}
}

// TestWindowManyKeysAtTheBound runs many keys against a small WithMaxWindows, on one
// worker (both paths) and three: windows are forced out of their buckets one by one,
// and every item ends in exactly one window's last result or late, nothing held.
func TestWindowManyKeysAtTheBound(t *testing.T) {
	t.Parallel()
	for _, lateness := range []time.Duration{0, 3 * time.Second} {
		for _, extra := range []struct {
			name string
			opts []pipeline.WindowOption
		}{{"inline", nil}, {"queued", windowPaths[1].opts}, {"workers=3", []pipeline.WindowOption{pipeline.WithWindowWorkers(3)}}} {
			t.Run(fmt.Sprintf("lateness=%v/%s", lateness, extra.name), func(t *testing.T) {
				t.Parallel()
				for seed, keys := range []int{17, 100, 400} {
					rng := rand.New(rand.NewPCG(uint64(seed), 5))
					evs := stream(rng, 4000, keys, 30*time.Millisecond, 6*time.Second)
					p := pipeline.New()
					dl := pipeline.NewDeadLetterBuffer[ev](len(evs))
					opts := with(extra.opts, pipeline.WithMaxWindows(30+7*seed), pipeline.WithMaxDelay(time.Second),
						pipeline.WithAllowedLateness(lateness), pipeline.WithLateItems(dl.Add))
					res, err := pipeline.Collect(t.Context(), pipeline.Window(pipeline.FromSlice(p, evs), pipeline.Tumbling(10*time.Second), evKey, evTime, sumAgg(), opts...))
					require.NoError(t, err)
					last := map[wkey]pipeline.WindowResult[int, int]{}
					firsts := map[wkey]int{}
					for _, r := range res {
						k := wkey{r.Key, r.Start}
						if !r.Update {
							firsts[k]++
						}
						last[k] = r
					}
					n, sum, total := 0, 0, 0
					for k, r := range last {
						assert.Equal(t, 1, firsts[k], "first results of %v", k)
						n += r.Count
						sum += r.Value
					}
					for _, e := range evs {
						total += e.V
					}
					for _, d := range dl.Items() {
						sum += d.Item.V
					}
					assert.Equal(t, len(evs), n+len(dl.Items()), "items in last results or late, keys %d", keys)
					assert.Equal(t, total, sum, "keys %d", keys)
					rep := p.Report()
					checkAccounting(t, rep)
					s, _ := rep.Stage("Window")
					assert.Zero(t, s.Window, "held")
					assert.Zero(t, s.Windows.Open)
					if keys > 50 {
						assert.Positive(t, s.Windows.Forced, "keys %d", keys)
					}
				}
			})
		}
	}
}

// TestWindowManyKeysCheckpointed runs many keys in a checkpointed run that saves often:
// every item settles once every window it fell into has fired (and, kept for late items,
// been forgotten), so the checkpoint reaches the end.
func TestWindowManyKeysCheckpointed(t *testing.T) {
	t.Parallel()
	for _, spec := range winSpecs {
		for _, lateness := range []time.Duration{0, 3 * time.Second} {
			if spec.gap > 0 && lateness > 0 {
				continue // a session keeps itself for its gap, not for an allowed lateness
			}
			t.Run(fmt.Sprintf("%s/lateness=%v", spec.name, lateness), func(t *testing.T) {
				t.Parallel()
				for seed, keys := range []int{17, 100, 400} {
					rng := rand.New(rand.NewPCG(uint64(seed), 5))
					evs := stream(rng, 3000, keys, 30*time.Millisecond, 6*time.Second)
					p := pipeline.New()
					src := checkpointedEvents(t, p, evs, pipeline.WithSaveEvery(50), pipeline.WithMaxRedo(300))
					dl := pipeline.NewDeadLetterBuffer[ev](len(evs))
					_, err := pipeline.Collect(t.Context(), pipeline.Window(src, spec.kind(), evKey, evTime, sumAgg(),
						pipeline.WithLateItems(dl.Add), pipeline.WithMaxDelay(time.Second), pipeline.WithAllowedLateness(lateness)))
					require.NoError(t, err)
					rep := p.Report()
					checkAccounting(t, rep)
					s, _ := rep.Stage("Window")
					assert.Zero(t, s.Window, "held, keys %d", keys)
					assert.Zero(t, s.Windows.Open)
					assert.Equal(t, int64(len(evs)), rep.Checkpoint, "keys %d", keys)
				}
			})
		}
	}
}

// TestWindowNaNKeys checks keys that equal nothing, not even themselves (a float NaN):
// as with a Go map, no item finds another's window, and each window is forgotten.
func TestWindowNaNKeys(t *testing.T) {
	t.Parallel()
	for _, path := range windowPaths {
		for _, lateness := range []time.Duration{0, 3 * time.Second} {
			t.Run(fmt.Sprintf("%s/lateness=%v", path.name, lateness), func(t *testing.T) {
				t.Parallel()
				evs := stream(rand.New(rand.NewPCG(1, 2)), 3000, 50, 30*time.Millisecond, 0)
				p := pipeline.New()
				key := func(e ev) float64 {
					if e.Key%3 == 0 {
						return math.NaN()
					}
					return float64(e.Key)
				}
				res, err := pipeline.Collect(t.Context(), pipeline.Window(pipeline.FromSlice(p, evs), pipeline.Sliding(10*time.Second, 5*time.Second), key, evTime, sumAgg(),
					with(path.opts, pipeline.WithAllowedLateness(lateness), pipeline.WithMaxWindows(500))...))
				require.NoError(t, err)
				n := 0
				for _, r := range res {
					if math.IsNaN(r.Key) {
						assert.Equal(t, 1, r.Count, "a NaN key's window")
					}
					n += r.Count
				}
				assert.Equal(t, 2*len(evs), n, "each item in two sliding windows")
				rep := p.Report()
				checkAccounting(t, rep)
				s, _ := rep.Stage("Window")
				assert.Zero(t, s.Window, "held")
				assert.Zero(t, s.Windows.Open)
			})
		}
	}
}

func FuzzWindow(f *testing.F) {
	f.Add(uint64(1), uint8(0), uint8(0), uint8(0))
	f.Add(uint64(2), uint8(1), uint8(2), uint8(0))
	f.Add(uint64(3), uint8(2), uint8(6), uint8(0))
	f.Add(uint64(4), uint8(0), uint8(1), uint8(3))
	f.Add(uint64(5), uint8(1), uint8(1), uint8(5))
	f.Fuzz(func(t *testing.T, seed uint64, kind, delay, lateness uint8) {
		spec := winSpecs[int(kind)%len(winSpecs)]
		d, l := time.Duration(delay%10)*time.Second, time.Duration(lateness%10)*time.Second
		inline, si := checkWindows(t, spec, seed, d, l, windowPaths[0].opts...)
		queued, sq := checkWindows(t, spec, seed, d, l, windowPaths[1].opts...)
		assert.Equal(t, spans(queued), spans(inline), "the same results in the same order on both paths")
		assert.Equal(t, figures(sq, false), figures(si, false))
	})
}

// figures are the counts of a window stage's report that do not depend on its path.
// When the run failed, so do In and NotStarted: they count the items the producer had
// handed on when the run stopped, and a queue takes more of them than an inline stage.
func figures(s pipeline.StageReport, failed bool) string {
	w := s.Windows
	f := fmt.Sprintf("out %d ok %d dead %d failed %d window %d; open %d wm %v max %v late %d updates %d forced %d",
		s.Out, s.Succeeded, s.DeadLettered, s.Failed, s.Window, w.Open, w.Watermark, w.MaxEventTime, w.Late, w.Updates, w.Forced)
	if !failed {
		f += fmt.Sprintf("; in %d notstarted %d", s.In, s.NotStarted)
	}
	return f
}

// collectWindows runs evs through a Window stage and returns its results and report.
func collectWindows(t *testing.T, evs []ev, kind pipeline.WindowKind, opts ...pipeline.WindowOption) ([]pipeline.WindowResult[int, int], pipeline.StageReport, error) {
	t.Helper()
	p := pipeline.New()
	res, err := pipeline.Collect(t.Context(), pipeline.Window(pipeline.FromSlice(p, evs), kind, evKey, evTime, sumAgg(), opts...))
	s, _ := p.Report().Stage("Window")
	checkAccounting(t, p.Report())
	return res, s, err
}

// span is a result as "key [start, end) sum/count", times in seconds from epoch.
func span(r pipeline.WindowResult[int, int]) string {
	s := fmt.Sprintf("%d [%g, %g) %d/%d", r.Key, r.Start.Sub(epoch).Seconds(), r.End.Sub(epoch).Seconds(), r.Value, r.Count)
	if r.Update {
		s += " update"
	}
	return s
}

func spans(rs []pipeline.WindowResult[int, int]) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = span(r)
	}
	return out
}

func TestWindowBoundaries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		kind pipeline.WindowKind
		evs  []ev
		want []string
	}{
		{"no items", pipeline.Tumbling(10 * time.Second), nil, []string{}},
		{"one item", pipeline.Tumbling(10 * time.Second), []ev{{0, tsec(3), 5}}, []string{"0 [0, 10) 5/1"}},
		{
			"an item on a boundary starts the next window; empty windows emit nothing",
			pipeline.Tumbling(10 * time.Second),
			[]ev{{0, tsec(0), 1}, {0, tsec(9.999999999), 2}, {0, tsec(10), 4}, {0, tsec(40), 8}},
			[]string{"0 [0, 10) 3/2", "0 [10, 20) 4/1", "0 [40, 50) 8/1"},
		},
		{
			"sliding: an item is in every window holding it, a boundary in the later one",
			pipeline.Sliding(10*time.Second, 5*time.Second),
			[]ev{{0, tsec(5), 1}, {0, tsec(12), 2}},
			[]string{"0 [0, 10) 1/1", "0 [5, 15) 3/2", "0 [10, 20) 2/1"},
		},
		{
			"sessions: items exactly a gap apart are two sessions, closer ones one",
			pipeline.Session(3 * time.Second),
			[]ev{{0, tsec(0), 1}, {0, tsec(3), 2}, {0, tsec(5.5), 4}, {1, tsec(5.5), 8}},
			[]string{"0 [0, 3) 1/1", "0 [3, 8.5) 6/2", "1 [5.5, 8.5) 8/1"},
		},
		{
			"sessions: an item that closes the gap merges two sessions",
			pipeline.Session(3 * time.Second),
			[]ev{{0, tsec(10), 1}, {0, tsec(15), 2}, {0, tsec(12.5), 4}},
			[]string{"0 [10, 18) 7/3"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, wp := range windowPaths {
				t.Run(wp.name, func(t *testing.T) {
					t.Parallel()
					path := wp.opts
					res, _, err := collectWindows(t, tc.evs, tc.kind, with(path, pipeline.WithMaxDelay(10*time.Second))...)
					require.NoError(t, err)
					assert.Equal(t, tc.want, spans(res))
				})
			}
		})
	}
}

func TestWindowLateItems(t *testing.T) {
	t.Parallel()
	onWindowPaths(t, testWindowLateItems)
}

func testWindowLateItems(t *testing.T, path ...pipeline.WindowOption) {
	// The watermark is 15 s after the item at 25 s: the window [0, 10) has fired, and
	// the item at 9 s is late; the one at 12 s is not.
	evs := []ev{{0, tsec(1), 1}, {0, tsec(25), 2}, {0, tsec(9), 4}, {0, tsec(12), 8}}
	t.Run("set aside with class late and counted", func(t *testing.T) {
		t.Parallel()
		dl := pipeline.NewDeadLetterBuffer[ev](10)
		res, s, err := collectWindows(t, evs, pipeline.Tumbling(10*time.Second), with(path, pipeline.WithMaxDelay(10*time.Second), pipeline.WithLateItems(dl.Add))...)
		require.NoError(t, err)
		assert.Equal(t, []string{"0 [0, 10) 1/1", "0 [10, 20) 8/1", "0 [20, 30) 2/1"}, spans(res))
		require.Len(t, dl.Items(), 1)
		d := dl.Items()[0]
		assert.Equal(t, ev{0, tsec(9), 4}, d.Item)
		assert.Equal(t, "late", d.ErrType)
		assert.Equal(t, pipeline.ClassItem, d.Class)
		assert.Equal(t, int64(1), s.DeadLettered)
		assert.Equal(t, int64(1), s.Windows.Late)
		require.Len(t, s.Causes, 1)
		assert.Equal(t, "late", s.Causes[0].Type)
	})
	t.Run("without a destination the run fails with ErrLate", func(t *testing.T) {
		t.Parallel()
		_, s, err := collectWindows(t, evs, pipeline.Tumbling(10*time.Second), with(path, pipeline.WithMaxDelay(10*time.Second))...)
		require.ErrorIs(t, err, pipeline.ErrLate)
		assert.Equal(t, int64(1), s.Failed-s.Window, "the late item, besides the items of open windows")
	})
	t.Run("within the allowed lateness an item updates its window", func(t *testing.T) {
		t.Parallel()
		res, s, err := collectWindows(t, evs, pipeline.Tumbling(10*time.Second), with(path, pipeline.WithMaxDelay(10*time.Second), pipeline.WithAllowedLateness(20*time.Second))...)
		require.NoError(t, err)
		assert.Equal(t, []string{"0 [0, 10) 1/1", "0 [0, 10) 5/2 update", "0 [10, 20) 8/1", "0 [20, 30) 2/1"}, spans(res))
		assert.Equal(t, int64(1), s.Windows.Updates)
		assert.Zero(t, s.DeadLettered)
	})
	t.Run("a session item that reaches a fired session is late", func(t *testing.T) {
		t.Parallel()
		dl := pipeline.NewDeadLetterBuffer[ev](10)
		// [0, 3) fires when the watermark reaches 3 (item at 4); 2.5 would extend it.
		res, _, err := collectWindows(t, []ev{{0, tsec(0), 1}, {0, tsec(4), 2}, {0, tsec(3.5), 4}, {0, tsec(2.5), 8}},
			pipeline.Session(3*time.Second), with(path, pipeline.WithMaxDelay(time.Second), pipeline.WithLateItems(dl.Add))...)
		require.NoError(t, err)
		assert.Equal(t, []string{"0 [0, 3) 1/1", "0 [3.5, 7) 6/2"}, spans(res))
		require.Len(t, dl.Items(), 1)
		assert.Equal(t, 8, dl.Items()[0].Item.V)
	})
}

func TestWindowMaxWindows(t *testing.T) {
	t.Parallel()
	// At most two windows, a delay of 100 s: the third window fires the one due first
	// early (the watermark moves to its end, 60 s), and a later item of it is late.
	evs := []ev{{0, tsec(1), 1}, {0, tsec(70), 2}, {1, tsec(75), 4}, {0, tsec(30), 8}, {1, tsec(80), 16}}
	t.Run("fires the window due first", func(t *testing.T) {
		t.Parallel()
		for _, wp := range windowPaths {
			t.Run(wp.name, func(t *testing.T) {
				t.Parallel()
				path := wp.opts
				p := pipeline.New()
				dl := pipeline.NewDeadLetterBuffer[ev](10)
				var maxOpen int64
				var res []string
				pipeline.To(pipeline.Window(pipeline.FromSlice(p, evs), pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(),
					with(path, pipeline.WithMaxDelay(100*time.Second), pipeline.WithMaxWindows(2), pipeline.WithLateItems(dl.Add))...),
					pipeline.NewSink("sink", 1, func(_ context.Context, r pipeline.WindowResult[int, int]) error {
						s, _ := p.Snapshot().Stage("Window")
						maxOpen = max(maxOpen, s.Windows.Open)
						res = append(res, span(r))
						return nil
					}))
				require.NoError(t, p.Run(t.Context()))
				assert.Equal(t, []string{"0 [0, 60) 1/1", "0 [60, 120) 2/1", "1 [60, 120) 20/2"}, res)
				assert.LessOrEqual(t, maxOpen, int64(2))
				s, _ := p.Report().Stage("Window")
				assert.Equal(t, int64(1), s.Windows.Forced)
				require.Len(t, dl.Items(), 1)
				assert.Equal(t, 8, dl.Items()[0].Item.V)
				checkAccounting(t, p.Report())
			})
		}
	})
	t.Run("backpressure waits for the idle clock", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			var fired []time.Duration
			p := pipeline.New()
			pipeline.To(pipeline.Window(pipeline.FromSlice(p, evs[:2]), pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(),
				pipeline.WithMaxDelay(100*time.Second), pipeline.WithMaxWindows(1), pipeline.WithWindowBackpressure(), pipeline.WithIdleTimeout(time.Second)),
				pipeline.NewSink("sink", 1, func(context.Context, pipeline.WindowResult[int, int]) error {
					fired = append(fired, time.Since(start))
					return nil
				}))
			require.NoError(t, p.Run(t.Context()))
			// The first window is due at 60 s and the watermark is -99 s: the idle clock
			// reaches 60 s 159 s after the idle timeout of 1 s; the second window fires
			// at the end of the input, at once.
			assert.Equal(t, []time.Duration{160 * time.Second, 160 * time.Second}, fired)
			s, _ := p.Report().Stage("Window")
			assert.Zero(t, s.Windows.Forced)
			assert.Zero(t, s.Windows.Late)
		})
	})
}

func TestWindowIdleTimeoutAdvancesTheWatermark(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		got := make(chan time.Duration, 2)
		p := pipeline.New()
		src := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
			if err := emit(ev{0, tsec(30), 1}); err != nil {
				return err
			}
			<-ctx.Done() // an idle source, which never ends by itself
			return nil
		})
		pipeline.To(pipeline.Window(src, pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(),
			pipeline.WithMaxDelay(10*time.Second), pipeline.WithIdleTimeout(5*time.Second)),
			pipeline.NewSink("sink", 1, func(_ context.Context, r pipeline.WindowResult[int, int]) error {
				got <- time.Since(start)
				return nil
			}))
		ctx, cancel := context.WithCancel(t.Context())
		done := runAsync(ctx, p)
		// the watermark is 20 s: it reaches the window's end, 60 s, 40 s after the idle
		// timeout of 5 s.
		assert.Equal(t, 45*time.Second, <-got)
		synctest.Wait()
		s, _ := p.Snapshot().Stage("Window")
		assert.Equal(t, tsec(60), s.Windows.Watermark)
		assert.Equal(t, tsec(30), s.Windows.MaxEventTime)
		assert.Zero(t, s.Windows.Open)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
}

func TestWindowReportWhileOpen(t *testing.T) {
	for _, wp := range windowPaths {
		t.Run(wp.name, func(t *testing.T) {
			testWindowReportWhileOpen(t, wp.opts...)
		})
	}
}

func testWindowReportWhileOpen(t *testing.T, path ...pipeline.WindowOption) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		src := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
			for _, e := range []ev{{0, tsec(1), 1}, {1, tsec(12), 2}, {0, tsec(20), 4}} {
				if err := emit(e); err != nil {
					return err
				}
			}
			<-ctx.Done()
			return nil
		})
		pipeline.To(pipeline.Window(src, pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(), with(path, pipeline.WithMaxDelay(5*time.Second))...),
			pipeline.NewSink("sink", 1, func(context.Context, pipeline.WindowResult[int, int]) error { return nil }))
		ctx, cancel := context.WithCancel(t.Context())
		done := runAsync(ctx, p)
		synctest.Wait()
		s, _ := p.Snapshot().Stage("Window")
		assert.Equal(t, pipeline.KindWindow, s.Kind)
		assert.Equal(t, &pipeline.WindowReport{Open: 2, Watermark: tsec(15), MaxEventTime: tsec(20), Lag: 5 * time.Second}, s.Windows)
		assert.Equal(t, int64(3), s.Window, "items held in open windows")
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		rep := p.Report()
		checkAccounting(t, rep)
		s, _ = rep.Stage("Window")
		assert.Equal(t, int64(3), s.Failed, "the items of windows open when the run stopped")
	})
}

// TestWindowReportOpenExcludesFiredWindows reads the report from the sink as each
// result arrives, the source waiting for it before the next minute's item: only the
// window of that next item is open, never the one whose result is in the sink's hands.
func TestWindowReportOpenExcludesFiredWindows(t *testing.T) {
	t.Parallel()
	onWindowPaths(t, testWindowReportOpenExcludesFiredWindows)
}

func testWindowReportOpenExcludesFiredWindows(t *testing.T, path ...pipeline.WindowOption) {
	const minutes = 40
	got := make(chan struct{})
	p := pipeline.New()
	src := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
		for m := range minutes {
			if err := emit(ev{0, tsec(float64(60*m + 30)), 1}); err != nil {
				return err
			}
			if m == 0 {
				continue
			}
			select { // the result of minute m-1 is in the sink's hands
			case <-got:
			case <-ctx.Done():
				return nil
			}
		}
		return nil
	})
	var opens []int64
	pipeline.To(pipeline.Window(src, pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(), path...),
		pipeline.NewSink("sink", 1, func(context.Context, pipeline.WindowResult[int, int]) error {
			s, _ := p.Snapshot().Stage("Window")
			opens = append(opens, s.Windows.Open)
			if len(opens) < minutes {
				got <- struct{}{}
			}
			return nil
		}))
	require.NoError(t, p.Run(t.Context()))
	want := slices.Repeat([]int64{1}, minutes)
	want[minutes-1] = 0 // the last fires when the input ends
	assert.Equal(t, want, opens)
}

func TestWindowMisuse(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	src := func() *pipeline.Stream[ev] { return pipeline.FromSlice(p, []ev{}) }
	for _, f := range []func(){
		func() { pipeline.Tumbling(0) },
		func() { pipeline.Sliding(time.Second, 2*time.Second) },
		func() { pipeline.Session(-1) },
		func() { pipeline.Window(src(), pipeline.WindowKind{}, evKey, evTime, sumAgg()) },
		func() { pipeline.Window(src(), pipeline.Tumbling(time.Second), (func(ev) int)(nil), evTime, sumAgg()) },
		func() { pipeline.Window(src(), pipeline.Session(time.Second), evKey, evTime, pipeline.Fold(0, evSum)) },
		func() {
			pipeline.Window(src(), pipeline.Session(time.Second), evKey, evTime, sumAgg(), pipeline.WithAllowedLateness(time.Second))
		},
		func() {
			pipeline.Window(src(), pipeline.Tumbling(time.Second), evKey, evTime, sumAgg(), pipeline.WithWindowBackpressure())
		},
		func() {
			pipeline.Window(src(), pipeline.Tumbling(time.Second), evKey, evTime, sumAgg(), pipeline.WithLateItems(pipeline.NewDeadLetterBuffer[int](1).Add))
		},
		func() { pipeline.WithMaxWindows(0) },
		func() {
			pipeline.Window(src(), pipeline.Tumbling(time.Second), evKey, evTime, sumAgg(), pipeline.WithMaxWindows(2), pipeline.WithWindowWorkers(3))
		},
		func() { pipeline.WithWindowWorkers(0) },
		func() { pipeline.WithIdleTimeout(0) },
		func() { pipeline.WithMaxDelay(-1) },
		func() { pipeline.WithWatermarkPer(0, evKey) },
		func() { pipeline.WithWatermarkPer[ev](2, nil) },
		func() {
			pipeline.Window(src(), pipeline.Tumbling(time.Second), evKey, evTime, sumAgg(), pipeline.WithWatermarkPer(2, func(int) int { return 0 }))
		},
		func() {
			q := pipeline.New()
			s := pipeline.FromCheckpoint(q, &memStore{}, func(context.Context, int64) iter.Seq2[ev, error] { return nil })
			pipeline.Window(s, pipeline.Tumbling(time.Second), evKey, evTime, sumAgg())
		},
	} {
		assertPanicsPipeline(t, f)
	}
}

// winTable is a CommittedStore in memory that also holds a table of window rows,
// written with the progress in one "transaction" (Commit's fn), as a database sink
// does.
type winTable struct {
	memCommitted
	rows     map[wkey]wval
	keepMore bool // upsert only a row with a larger count (sliding windows)
}

// write upserts r's row and records pr, in one step.
func (s *winTable) write(pr pipeline.Progress, r pipeline.WindowResult[int, int]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := wkey{r.Key, r.Start}
	old, ok := s.rows[k]
	if !ok || !s.keepMore || r.Count > old.n {
		s.rows[k] = wval{end: r.End, sum: r.Value, n: r.Count, writes: old.writes + 1}
	}
	s.recordLocked(pr)
}

// TestWindowExactlyOnceAcrossKills stops a checkpointed run at random points (from the
// source, or from the sink after a commit) and resumes it until a run ends: every
// window's row equals the model's, and for tumbling and session windows was written
// once; sliding windows keep the row with the larger count. Odd seeds run two workers.
func TestWindowExactlyOnceAcrossKills(t *testing.T) {
	t.Parallel()
	for _, spec := range winSpecs {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel()
			for seed := range uint64(12) {
				rng := rand.New(rand.NewPCG(seed, 7))
				evs := stream(rng, 200+rng.IntN(200), 1+rng.IntN(5), 2*time.Second, 6*time.Second)
				delay := 6 * time.Second // no item is late: every run sees the same windows
				want, _ := model(spec, evs, delay, 0)
				table := &winTable{rows: map[wkey]wval{}, keepMore: spec.slide != spec.size && spec.gap == 0}
				var ctx context.Context
				var cancel context.CancelFunc
				var killAt, emitted, commits int
				p := pipeline.New()
				src := pipeline.FromCheckpoint(p, table, func(_ context.Context, pos int64) iter.Seq2[ev, error] {
					return func(yield func(ev, error) bool) {
						for _, e := range evs[pos:] {
							emitted++
							if emitted == killAt {
								cancel()
							}
							if !yield(e, nil) {
								return
							}
						}
					}
				}, pipeline.WithSaveEvery(7), pipeline.WithMaxRedo(1<<20)) // room for every open window's items
				var mu sync.Mutex
				workers := 1 + int(seed%2)
				pipeline.To(pipeline.Window(src, spec.kind(), evKey, evTime, sumAgg(), pipeline.WithMaxDelay(delay), pipeline.WithWindowWorkers(workers)),
					pipeline.NewSink("table", 2, func(ctx context.Context, r pipeline.WindowResult[int, int]) error {
						err := pipeline.Commit(ctx, func(_ context.Context, pr pipeline.Progress) error {
							table.write(pr, r)
							return nil
						})
						mu.Lock()
						commits++
						if commits == -killAt {
							cancel()
						}
						mu.Unlock()
						return err
					}))
				for run := 0; ; run++ {
					require.Less(t, run, 100, "seed %d: no run ended", seed)
					ctx, cancel = context.WithCancel(t.Context())
					emitted, commits = 0, 0
					switch rng.IntN(3) {
					case 0:
						killAt = 1 + rng.IntN(len(evs)) // from the source
					case 1:
						killAt = -(1 + rng.IntN(len(want)+1)) // from the sink
					default:
						killAt = math.MaxInt // let it end
					}
					err := p.Run(ctx)
					cancel()
					checkAccounting(t, p.Report())
					if err == nil {
						break
					}
					require.ErrorIs(t, err, context.Canceled)
				}
				got := map[wkey]wval{}
				for k, v := range table.rows {
					if spec.slide == spec.size || spec.gap > 0 {
						assert.Equal(t, 1, v.writes, "seed %d: window %v written %d times", seed, k, v.writes)
					}
					v.writes = 0
					got[k] = v
				}
				assert.Equal(t, want, got, "seed %d", seed)
			}
		})
	}
}

// TestWindowMergedInputs feeds a window from two sources merged, each in event-time
// order, taking turns item by item, the second's clock 5 s behind the first's: the
// consumer sees them skewed by at most a sender's chunk (64 items, up to 2 s apart)
// more, and a delay that covers that skew makes the results equal the model's (see
// docs/windows.md, "Merged inputs").
func TestWindowMergedInputs(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 3))
	a := stream(rng, 300, 3, 2*time.Second, 0)
	b := stream(rng, 300, 3, 2*time.Second, 0)
	for i := range b {
		b[i].T = b[i].T.Add(-5 * time.Second)
	}
	turn := []chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1)}
	turn[0] <- struct{}{}
	p := pipeline.New()
	from := func(me int, evs []ev) *pipeline.Stream[ev] {
		return pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
			defer close(turn[1-me]) // the other one goes on alone
			for _, e := range evs {
				select {
				case <-turn[me]:
				case <-ctx.Done():
					return ctx.Err()
				}
				err := emit(e)
				turn[1-me] <- struct{}{}
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	merged := pipeline.Merge(from(0, a), from(1, b))
	res, err := pipeline.Collect(t.Context(), pipeline.Window(merged, pipeline.Tumbling(10*time.Second), evKey, evTime, sumAgg(),
		pipeline.WithMaxDelay(5*time.Second+64*2*time.Second)))
	require.NoError(t, err)
	want, late := model(winSpecs[0], slices.Concat(a, b), time.Hour, 0)
	require.Zero(t, late)
	got := map[wkey]wval{}
	for _, r := range res {
		got[wkey{r.Key, r.Start}] = wval{end: r.End, sum: r.Value, n: r.Count}
	}
	assert.Equal(t, want, got)
}

// TestWindowProcessingTime windows by the clock: the event time is time.Now, and the
// idle timeout fires the last window of a quiet source (synctest's clock starts on a
// minute).
func TestWindowProcessingTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		type fired struct {
			at    time.Duration
			value int
		}
		got := make(chan fired, 3)
		p := pipeline.New()
		src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
			for _, d := range []time.Duration{0, 30 * time.Second, 40 * time.Second} { // at 0, 30 s and 70 s
				time.Sleep(d) // the events' own pace, on the bubble's clock
				if err := emit(1); err != nil {
					return err
				}
			}
			<-ctx.Done()
			return nil
		})
		w := pipeline.Window(src, pipeline.Tumbling(time.Minute), func(int) string { return "all" },
			func(int) time.Time { return time.Now() }, pipeline.Reduce(addInts), pipeline.WithIdleTimeout(time.Second))
		pipeline.To(w, pipeline.NewSink("sink", 1, func(_ context.Context, r pipeline.WindowResult[string, int]) error {
			got <- fired{time.Since(start), r.Value}
			return nil
		}))
		ctx, cancel := context.WithCancel(t.Context())
		done := runAsync(ctx, p)
		// The idle clock fires [0, 60) 1 s after the item at 30 s plus the 30 s the
		// watermark lacks; [60, 120) likewise after the item at 70 s.
		assert.Equal(t, fired{61 * time.Second, 2}, <-got)
		assert.Equal(t, fired{121 * time.Second, 1}, <-got)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
}

// checkpointedEvents is a source of evs checkpointed in a file of the test's, resuming
// at the position it saved.
func checkpointedEvents(t *testing.T, p *pipeline.Pipeline, evs []ev, opts ...pipeline.CheckpointOption) *pipeline.Stream[ev] {
	t.Helper()
	return pipeline.FromCheckpoint(p, pipeline.NewFileCheckpoint(t.TempDir()+"/ck"), func(_ context.Context, pos int64) iter.Seq2[ev, error] {
		return func(yield func(ev, error) bool) {
			for _, e := range evs[pos:] {
				if !yield(e, nil) {
					return
				}
			}
		}
	}, opts...)
}

// TestWindowFiresEarlyForACheckpointSave: a checkpointed source waits for a save that
// needs the items of an open window (WithMaxRedo smaller than the window's items); the
// stage fires that window early rather than stall, and every item is accounted for.
func TestWindowFiresEarlyForACheckpointSave(t *testing.T) {
	t.Parallel()
	evs := make([]ev, 200)
	for i := range evs {
		evs[i] = ev{Key: i % 2, T: tsec(float64(i) / 10), V: 1} // all in one minute
	}
	p := pipeline.New()
	src := checkpointedEvents(t, p, evs, pipeline.WithSaveEvery(10), pipeline.WithMaxRedo(20))
	dl := pipeline.NewDeadLetterBuffer[ev](len(evs))
	res, err := pipeline.Collect(t.Context(), pipeline.Window(src, pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(), pipeline.WithLateItems(dl.Add)))
	require.NoError(t, err)
	n := 0
	for _, r := range res {
		n += r.Count
	}
	assert.Equal(t, len(evs), n+len(dl.Items()), "every item in a result or set aside")
	rep := p.Report()
	checkAccounting(t, rep)
	s, _ := rep.Stage("Window")
	assert.Positive(t, s.Windows.Forced)
	assert.Equal(t, int64(len(evs)), rep.Checkpoint)
}

func TestWindowReportLine(t *testing.T) {
	t.Parallel()
	onWindowPaths(t, testWindowReportLine)
}

func testWindowReportLine(t *testing.T, path ...pipeline.WindowOption) {
	dl := pipeline.NewDeadLetterBuffer[ev](10)
	p := pipeline.New()
	_, err := pipeline.Collect(t.Context(), pipeline.Window(pipeline.FromSlice(p, []ev{{0, tsec(1), 1}, {0, tsec(25), 2}, {0, tsec(9), 4}}),
		pipeline.Tumbling(10*time.Second), evKey, evTime, sumAgg(), with(path, pipeline.WithMaxDelay(10*time.Second), pipeline.WithLateItems(dl.Add))...))
	require.NoError(t, err)
	assert.Contains(t, p.Report().String(),
		"window Window: 2 results (0 updates), 0 open, watermark 2026-12-02T00:00:15Z, lag 10s, 1 late, 0 fired early\n")
}

// TestWindowWorkers spreads the keys over three workers, each with its own watermark:
// with a delay that covers the input's disorder no item is late, whatever the keys'
// spread, and the results equal the model's.
func TestWindowWorkers(t *testing.T) {
	t.Parallel()
	for _, spec := range winSpecs {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel()
			for seed := range uint64(10) {
				rng := rand.New(rand.NewPCG(seed, 11))
				evs := stream(rng, 500, 1+rng.IntN(8), 2*time.Second, 6*time.Second)
				want, _ := model(spec, evs, 6*time.Second, 0)
				res, s, err := collectWindows(t, evs, spec.kind(), pipeline.WithMaxDelay(6*time.Second), pipeline.WithWindowWorkers(3))
				require.NoError(t, err)
				got := map[wkey]wval{}
				for _, r := range res {
					assert.False(t, r.Update)
					got[wkey{r.Key, r.Start}] = wval{end: r.End, sum: r.Value, n: r.Count}
				}
				assert.Equal(t, want, got, "seed %d", seed)
				assert.Equal(t, 3, s.Workers)
				assert.Zero(t, s.Windows.Open)
				assert.Zero(t, s.Windows.Late)
			}
		})
	}
}

// TestWindowWorkersShareTheBound holds windows of many keys over two workers with a
// bound of three: the workers' shares add up to the bound, so the stage never holds
// more (shares rounded up held four).
func TestWindowWorkersShareTheBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		release := make(chan struct{})
		src := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
			for k := range 20 {
				if err := emit(ev{k, tsec(float64(60*k + 1)), 1}); err != nil {
					return err
				}
			}
			select { // hold the input open: the windows stay held
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
		pipeline.To(pipeline.Window(src, pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(),
			pipeline.WithMaxDelay(time.Hour), pipeline.WithMaxWindows(3), pipeline.WithWindowWorkers(2)),
			pipeline.NewSink("sink", 1, func(context.Context, pipeline.WindowResult[int, int]) error { return nil }))
		done := runAsync(t.Context(), p)
		synctest.Wait()
		s, _ := p.Snapshot().Stage("Window")
		assert.Equal(t, int64(3), s.Windows.Open, "windows held at once")
		close(release)
		require.NoError(t, <-done)
		checkAccounting(t, p.Report())
	})
}

// TestWindowReportWatermarkIsEveryWorkers reads the report's watermark while a worker,
// or an input, has none: the stage has none either (that worker takes an item of any
// time as on time), and once it has one it never goes back. The least over the workers
// that had seen an item went back when another saw its first, and with a watermark per
// input the report read a date in 1677.
func TestWindowReportWatermarkIsEveryWorkers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		opts  []pipeline.WindowOption
		first []ev // then, after a look at the report, keys 1 to 8 at 10 s
	}{
		{name: "workers", opts: []pipeline.WindowOption{pipeline.WithWindowWorkers(2)}, first: []ev{{0, tsec(100), 1}}},
		{name: "inputs", opts: []pipeline.WindowOption{pipeline.WithWatermarkPer(2, func(e ev) int { return min(e.Key, 1) })}, first: []ev{{0, tsec(100), 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				p := pipeline.New()
				phase := make(chan struct{})
				src := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
					for _, e := range tc.first {
						if err := emit(e); err != nil {
							return err
						}
					}
					<-phase
					for k := 1; k <= 8; k++ {
						if err := emit(ev{k, tsec(10), 1}); err != nil {
							return err
						}
					}
					<-phase
					return nil
				})
				opts := append([]pipeline.WindowOption{pipeline.WithLateItems(pipeline.DiscardDeadLetter[ev])}, tc.opts...)
				pipeline.To(pipeline.Window(src, pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(), opts...),
					pipeline.NewSink("sink", 1, func(context.Context, pipeline.WindowResult[int, int]) error { return nil }))
				done := runAsync(t.Context(), p)
				synctest.Wait()
				s, _ := p.Snapshot().Stage("Window")
				assert.True(t, s.Windows.Watermark.IsZero(), "a watermark %v while a worker or input has none", s.Windows.Watermark)
				assert.Zero(t, s.Windows.Lag)
				assert.Equal(t, tsec(100), s.Windows.MaxEventTime)
				phase <- struct{}{}
				synctest.Wait()
				s, _ = p.Snapshot().Stage("Window")
				assert.Equal(t, tsec(10), s.Windows.Watermark, "the least of every worker's or input's")
				if tc.name == "inputs" { // the second input had no watermark: none was late (with workers, key 0's worker's are)
					assert.Zero(t, s.Windows.Late)
				}
				close(phase)
				require.NoError(t, <-done)
			})
		})
	}
}

// TestWindowForcedCountsEachWindow reaches the bound with three windows of one end (one
// per key): the watermark moves to that end and fires all three before their time, and
// Forced counts three windows, not one act.
func TestWindowForcedCountsEachWindow(t *testing.T) {
	t.Parallel()
	evs := []ev{{0, tsec(1), 1}, {1, tsec(1), 1}, {2, tsec(1), 1}, {0, tsec(70), 1}}
	res, s, err := collectWindows(t, evs, pipeline.Tumbling(time.Minute), pipeline.WithMaxDelay(time.Hour), pipeline.WithMaxWindows(3))
	require.NoError(t, err)
	assert.Len(t, res, 4)
	assert.Equal(t, int64(3), s.Windows.Forced)
}

// TestWindowStopsWhileAtTheBound cancels a run while the stage waits at its bound
// (backpressure): the item it held counts as failed, and the accounting adds up.
func TestWindowStopsWhileAtTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		src := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
			for _, e := range []ev{{0, tsec(1), 1}, {0, tsec(70), 2}} {
				if err := emit(e); err != nil {
					return err
				}
			}
			<-ctx.Done()
			return nil
		})
		pipeline.To(pipeline.Window(src, pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(), pipeline.WithMaxDelay(time.Hour),
			pipeline.WithMaxWindows(1), pipeline.WithWindowBackpressure(), pipeline.WithIdleTimeout(time.Hour)),
			pipeline.NewSink("sink", 1, func(context.Context, pipeline.WindowResult[int, int]) error { return nil }))
		ctx, cancel := context.WithCancel(t.Context())
		done := runAsync(ctx, p)
		synctest.Wait() // the second item waits for room
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		rep := p.Report()
		checkAccounting(t, rep)
		s, _ := rep.Stage("Window")
		assert.Equal(t, int64(2), s.In)
		assert.Equal(t, int64(2), s.Failed, "the item of the open window and the one waiting for room")
	})
}

// TestWindowBoundHoldsAnItemsWindows: an item of a sliding window falls into up to
// ceil(size/slide) windows, open at once; a bound per worker (WithMaxWindows over
// WithWindowWorkers) below that panics when the stage is built (it failed the run
// with an index out of range when the first such item came).
func TestWindowBoundHoldsAnItemsWindows(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind pipeline.WindowKind
		opts []pipeline.WindowOption
	}{
		{"bound", pipeline.Sliding(10*time.Second, time.Second), []pipeline.WindowOption{pipeline.WithMaxWindows(2)}},
		{"bound over workers", pipeline.Sliding(2*time.Second, time.Second), []pipeline.WindowOption{pipeline.WithMaxWindows(4), pipeline.WithWindowWorkers(4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pipeline.New()
			defer func() {
				msg, _ := recover().(string)
				assert.Contains(t, msg, "pipeline: Window: an item falls into up to")
			}()
			pipeline.Window(pipeline.FromSlice(p, []ev{{0, tsec(5), 1}}), tc.kind, evKey, evTime, sumAgg(), tc.opts...)
			t.Fatal("no panic")
		})
	}
	assert.NotPanics(t, func() { // 2 windows an item, 2 a worker
		pipeline.Window(pipeline.FromSlice(pipeline.New(), []ev{{0, tsec(5), 1}}), pipeline.Sliding(2*time.Second, time.Second),
			evKey, evTime, sumAgg(), pipeline.WithMaxWindows(8), pipeline.WithWindowWorkers(4))
	})
}

// TestWindowFailureCountsResultsItHeld: when the stage fails (a late item without
// WithLateItems), the results it had emitted but not yet handed on are counted as
// never sent, so that its Out is what its consumer's In has (four results vanished
// from the counts).
func TestWindowFailureCountsResultsItHeld(t *testing.T) {
	for _, wp := range windowPaths {
		t.Run(wp.name, func(t *testing.T) {
			testWindowFailureCountsResultsItHeld(t, wp.opts...)
		})
	}
}

func testWindowFailureCountsResultsItHeld(t *testing.T, path ...pipeline.WindowOption) {
	evs := []ev{{0, tsec(1), 1}, {1, tsec(2), 1}, {0, tsec(61), 1}, {1, tsec(62), 1}, {0, tsec(121), 1}, {0, tsec(5), 1}}
	p := pipeline.New()
	pipeline.To(pipeline.Window(pipeline.FromSlice(p, evs), pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(), path...),
		pipeline.NewSink("sink", 1, func(context.Context, pipeline.WindowResult[int, int]) error { return nil }))
	require.ErrorIs(t, p.Run(t.Context()), pipeline.ErrLate)
	rep := p.Report()
	w, _ := rep.Stage("Window")
	s, _ := rep.Stage("sink")
	assert.Equal(t, w.Out, s.In, "every result counted out reaches the sink's In, sent or counted unsent")
	checkAccounting(t, rep)
}

// TestWindowBackpressureEachWaitIsAnIdlePeriod: with WithWindowBackpressure at a bound
// of one window, each window the bound delays waits an idle period of its own: the
// second wait in one run of items does not count again the idle time of the first
// (both fired at 11 s).
func TestWindowBackpressureEachWaitIsAnIdlePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var fired []time.Duration
		p := pipeline.New()
		evs := []ev{{0, tsec(0), 1}, {1, tsec(10), 1}, {2, tsec(20), 1}}
		pipeline.To(pipeline.Window(pipeline.FromSlice(p, evs), pipeline.Tumbling(10*time.Second), evKey, evTime, sumAgg(),
			pipeline.WithMaxWindows(1), pipeline.WithWindowBackpressure(), pipeline.WithIdleTimeout(time.Second)),
			pipeline.NewSink("sink", 1, func(context.Context, pipeline.WindowResult[int, int]) error {
				fired = append(fired, time.Since(start))
				return nil
			}))
		require.NoError(t, p.Run(t.Context()))
		require.Len(t, fired, 3)
		// [0,10) fires once the idle clock takes the watermark from 0 to 10: 1 s + 10 s;
		// [10,20) waits as long again, from then.
		assert.Equal(t, 11*time.Second, fired[0])
		assert.GreaterOrEqual(t, fired[1], 22*time.Second)
	})
}

// mergeLagging merges two sources of the same event times, 0 to 300 s a second apart
// on keys 0 (input 0) and 1 (input 1): the second starts only once the first has ended,
// so all its items are behind the first's greatest event time.
func mergeLagging(p *pipeline.Pipeline) (*pipeline.Stream[ev], []ev) {
	var a, b []ev
	for i := range 300 {
		a = append(a, ev{0, tsec(float64(i)), 1})
		b = append(b, ev{1, tsec(float64(i)), 2})
	}
	first := make(chan struct{})
	sa := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
		defer close(first)
		for _, e := range a {
			if err := emit(e); err != nil {
				return err
			}
		}
		return nil
	})
	sb := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
		select {
		case <-first:
		case <-ctx.Done():
			return ctx.Err()
		}
		for _, e := range b {
			if err := emit(e); err != nil {
				return err
			}
		}
		return nil
	})
	return pipeline.Merge(sa, sb), slices.Concat(a, b)
}

// TestWindowWatermarkPerInput: with a watermark per input, an input that lags behind
// the other holds the windows open, and none of its items is late; with one watermark
// for both, the lagging input's items are late.
func TestWindowWatermarkPerInput(t *testing.T) {
	t.Parallel()
	spec := winSpec{name: "tumbling", size: time.Minute, slide: time.Minute}
	for _, workers := range []int{1, 3} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			merged, evs := mergeLagging(p)
			res, err := pipeline.Collect(t.Context(), pipeline.Window(merged, spec.kind(), evKey, evTime, sumAgg(),
				pipeline.WithWatermarkPer(2, evKey), pipeline.WithWindowWorkers(workers)))
			require.NoError(t, err)
			want, late := model(spec, evs, time.Hour, 0)
			require.Zero(t, late)
			got := map[wkey]wval{}
			for _, r := range res {
				got[wkey{r.Key, r.Start}] = wval{end: r.End, sum: r.Value, n: r.Count}
			}
			assert.Equal(t, want, got)
		})
	}
	t.Run("one watermark", func(t *testing.T) {
		t.Parallel()
		p := pipeline.New()
		merged, _ := mergeLagging(p)
		late := pipeline.NewDeadLetterBuffer[ev](300)
		_, err := pipeline.Collect(t.Context(), pipeline.Window(merged, spec.kind(), evKey, evTime, sumAgg(), pipeline.WithLateItems(late.Add)))
		require.NoError(t, err)
		s, _ := p.Report().Stage("Window")
		assert.Positive(t, s.Windows.Late, "the lagging input's items, behind the first one's")
	})
}

// TestWindowWatermarkPerInputIdle: an input that sends nothing for the idle timeout is
// left out of the least, so the other input's items fire the windows; without the
// timeout it holds them where its last item left it.
func TestWindowWatermarkPerInputIdle(t *testing.T) {
	for _, idle := range []bool{true, false} {
		t.Run(fmt.Sprintf("idle=%v", idle), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := pipeline.New()
				quiet := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
					if err := emit(ev{0, tsec(30), 1}); err != nil {
						return err
					}
					<-ctx.Done() // stalled: it never ends by itself
					return nil
				})
				busy := pipeline.Generate(p, func(ctx context.Context, emit func(ev) error) error {
					for i := range 300 {
						if err := emit(ev{1, tsec(float64(i)), 2}); err != nil {
							return err
						}
						time.Sleep(time.Second)
					}
					<-ctx.Done()
					return nil
				})
				opts := []pipeline.WindowOption{pipeline.WithWatermarkPer(2, evKey)}
				if idle {
					opts = append(opts, pipeline.WithIdleTimeout(5*time.Second))
				}
				var mu sync.Mutex
				var got []string
				pipeline.To(pipeline.Window(pipeline.Merge(quiet, busy), pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(), opts...),
					pipeline.NewSink("sink", 1, func(_ context.Context, r pipeline.WindowResult[int, int]) error {
						mu.Lock()
						defer mu.Unlock()
						got = append(got, span(r))
						return nil
					}))
				ctx, cancel := context.WithCancel(t.Context())
				done := runAsync(ctx, p)
				time.Sleep(300 * time.Second) // the busy input's last item, at 299 s
				synctest.Wait()
				s, _ := p.Snapshot().Stage("Window")
				mu.Lock()
				slices.Sort(got)
				if idle {
					assert.Equal(t, tsec(299), s.Windows.Watermark, "the busy input's")
					assert.Equal(t, []string{"0 [0, 60) 1/1", "1 [0, 60) 120/60", "1 [120, 180) 120/60", "1 [180, 240) 120/60", "1 [60, 120) 120/60"}, got)
				} else {
					assert.Equal(t, tsec(30), s.Windows.Watermark, "the quiet input's")
					assert.Empty(t, got)
				}
				mu.Unlock()
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
			})
		})
	}
}

// TestWindowWatermarkPerInputOutOfRange: an input outside [0, n) fails the run.
func TestWindowWatermarkPerInputOutOfRange(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	src := pipeline.FromSlice(p, []ev{{0, tsec(1), 1}, {5, tsec(2), 1}})
	_, err := pipeline.Collect(t.Context(), pipeline.Window(src, pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(), pipeline.WithWatermarkPer(2, evKey)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "input 5 for an item, outside [0, 2)")
	checkAccounting(t, p.Report())
}

// TestWindowInlineAgreesWithQueued runs random streams (kinds, delays, lateness, bounds
// that force windows out, an aggregate that reduces, late items with and without a
// destination) through a one-worker Window stage on both paths, behind three kinds of
// producer (a source's runs, an inline Map's items one by one, a stage's worker): the
// results, in order, the error, the late items and the stage's figures (see figures) are
// the same;
// without a bound and with a destination, tumbling and sliding results also equal the
// model's (checkWindows covers sessions).
func TestWindowInlineAgreesWithQueued(t *testing.T) {
	t.Parallel()
	type outcome struct {
		res  []string
		err  string
		figs string
		late []ev
	}
	producers := []struct {
		name string
		in   func(p *pipeline.Pipeline, evs []ev) *pipeline.Stream[ev]
	}{
		{"source", func(p *pipeline.Pipeline, evs []ev) *pipeline.Stream[ev] { return pipeline.FromSlice(p, evs) }},
		{"map", func(p *pipeline.Pipeline, evs []ev) *pipeline.Stream[ev] {
			return pipeline.Map(pipeline.FromSlice(p, evs), func(e ev) ev { return e })
		}},
		{"stage", func(p *pipeline.Pipeline, evs []ev) *pipeline.Stream[ev] {
			return pipeline.Then(pipeline.FromSlice(p, evs), pipeline.NewStage("id", 1, func(_ context.Context, e ev) (ev, error) { return e, nil }))
		}},
	}
	sumEvs := pipeline.Reduce(func(a, b ev) ev { return ev{a.Key, a.T, a.V + b.V} })
	for seed := range uint64(80) {
		rng := rand.New(rand.NewPCG(seed, 23))
		spec := winSpecs[rng.IntN(len(winSpecs))]
		evs := stream(rng, rng.IntN(2000), 1+rng.IntN(20), time.Second, 8*time.Second)
		delay := time.Duration(rng.IntN(10)) * time.Second
		var lateness time.Duration
		if spec.gap == 0 {
			lateness = time.Duration(rng.IntN(3)) * 2 * time.Second
		}
		reduce := rng.IntN(2) == 0
		bound := 0
		if rng.IntN(3) == 0 {
			bound = 3 + rng.IntN(20)
		}
		withDest := rng.IntN(4) != 0
		prod := producers[rng.IntN(len(producers))]
		name := fmt.Sprintf("seed=%d/%s/%s/delay=%v/lateness=%v/bound=%d/reduce=%v/dest=%v", seed, prod.name, spec.name, delay, lateness, bound, reduce, withDest)
		run := func(path []pipeline.WindowOption) ([]pipeline.WindowResult[int, int], outcome) {
			p := pipeline.New()
			dl := pipeline.NewDeadLetterBuffer[ev](len(evs))
			opts := with(path, pipeline.WithMaxDelay(delay), pipeline.WithAllowedLateness(lateness))
			if bound > 0 {
				opts = append(opts, pipeline.WithMaxWindows(bound))
			}
			if withDest {
				opts = append(opts, pipeline.WithLateItems(dl.Add))
			}
			in := prod.in(p, evs)
			var rs []pipeline.WindowResult[int, int]
			var err error
			if reduce {
				var es []pipeline.WindowResult[int, ev]
				es, err = pipeline.Collect(t.Context(), pipeline.Window(in, spec.kind(), evKey, evTime, sumEvs, opts...))
				for _, r := range es {
					rs = append(rs, pipeline.WindowResult[int, int]{Key: r.Key, Start: r.Start, End: r.End, Value: r.Value.V, Count: r.Count, Update: r.Update})
				}
			} else {
				rs, err = pipeline.Collect(t.Context(), pipeline.Window(in, spec.kind(), evKey, evTime, sumAgg(), opts...))
			}
			rep := p.Report()
			checkAccounting(t, rep)
			s, ok := rep.Stage("Window")
			require.True(t, ok, name)
			o := outcome{res: spans(rs), figs: figures(s, err != nil)}
			for _, d := range dl.Items() {
				o.late = append(o.late, d.Item)
			}
			if err != nil {
				o.err = err.Error()
			}
			return rs, o
		}
		rs, inline := run(windowPaths[0].opts)
		_, queued := run(windowPaths[1].opts)
		if inline.err != "" || queued.err != "" {
			// The run failed (a late item, no destination): the results that reached
			// Collect before it stopped are a part of the same sequence, as long as the
			// timing let through.
			short, long := inline.res, queued.res
			if len(short) > len(long) {
				short, long = long, short
			}
			assert.Equal(t, long[:len(short)], short, name)
			inline.res, queued.res = nil, nil
		}
		assert.Equal(t, queued, inline, name)
		if bound == 0 && withDest && spec.gap == 0 {
			want, wantLate := model(spec, evs, delay, lateness)
			got := map[wkey]wval{}
			for _, r := range rs {
				got[wkey{r.Key, r.Start}] = wval{end: r.End, sum: r.Value, n: r.Count}
			}
			assert.Equal(t, want, got, name)
			assert.Len(t, inline.late, wantLate, name)
		}
	}
}

// everySecond returns n events of value 1, one a second from 0 s, of keys 0, 1, 2 in turn.
func everySecond(n int) []ev {
	evs := make([]ev, n)
	for i := range evs {
		evs[i] = ev{Key: i % 3, T: tsec(float64(i)), V: 1}
	}
	return evs
}

// TestWindowPanicInFoldFailsTheRun: a panic in the aggregate fails the run under the
// window stage's name, as a *PanicError, on both paths (inline, it runs in the
// producer's goroutine), and the accounting adds up.
func TestWindowPanicInFoldFailsTheRun(t *testing.T) {
	t.Parallel()
	onWindowPaths(t, testWindowPanicInFoldFailsTheRun)
}

func testWindowPanicInFoldFailsTheRun(t *testing.T, path ...pipeline.WindowOption) {
	evs := everySecond(500)
	p := pipeline.New()
	boom := pipeline.Fold(0, func(s int, e ev) int {
		if e.T.Equal(tsec(300)) {
			panic("boom")
		}
		return s + e.V
	})
	_, err := pipeline.Collect(t.Context(), pipeline.Window(pipeline.FromSlice(p, evs), pipeline.Tumbling(time.Minute), evKey, evTime, boom, path...))
	requirePanicIn(t, err, "Window", "boom")
	rep := p.Report()
	checkAccounting(t, rep)
	s, _ := rep.Stage("Window")
	assert.Positive(t, s.Failed)
}

// TestWindowDrainsWithItsInput: a drained error budget upstream ends the window
// stage's input; it fires every window it holds, on both paths.
func TestWindowDrainsWithItsInput(t *testing.T) {
	t.Parallel()
	onWindowPaths(t, testWindowDrainsWithItsInput)
}

func testWindowDrainsWithItsInput(t *testing.T, path ...pipeline.WindowOption) {
	evs := everySecond(2000)
	p := pipeline.New()
	st := pipeline.NewStage("check", 1, func(_ context.Context, e ev) (ev, error) {
		if e.T.After(tsec(700)) {
			return e, pipeline.Permanent(errBoom)
		}
		return e, nil
	}, discardDead[ev](), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0, MinSample: 1, Drain: true}))
	res, err := pipeline.Collect(t.Context(), pipeline.Window(pipeline.Then(pipeline.FromSlice(p, evs), st), pipeline.Tumbling(time.Minute), evKey, evTime, sumAgg(), path...))
	be, ok := errors.AsType[*pipeline.BudgetError](err)
	require.True(t, ok, "%v", err)
	assert.True(t, be.Drained)
	rep := p.Report()
	checkAccounting(t, rep)
	s, _ := rep.Stage("Window")
	n := 0
	for _, r := range res {
		n += r.Count
	}
	assert.Equal(t, int64(n), s.Succeeded, "every item folded is in a result")
	assert.Equal(t, 701, n, "the items before the budget tripped")
	assert.Zero(t, s.Windows.Open)
}

// TestWindowOfWindows chains two windows (per-10-second sums, then per-minute sums of
// those): the second one's producer is the first one, inline or queued; on both paths
// the per-minute results are the sums of the input's minutes.
func TestWindowOfWindows(t *testing.T) {
	t.Parallel()
	onWindowPaths(t, testWindowOfWindows)
}

func testWindowOfWindows(t *testing.T, path ...pipeline.WindowOption) {
	rng := rand.New(rand.NewPCG(5, 5))
	evs := stream(rng, 3000, 4, time.Second, 0)
	p := pipeline.New()
	tens := pipeline.Window(pipeline.FromSlice(p, evs), pipeline.Tumbling(10*time.Second), evKey, evTime, sumAgg(), with(path, pipeline.WithName("tens"))...)
	mins, err := pipeline.Collect(t.Context(), pipeline.Window(tens, pipeline.Tumbling(time.Minute),
		func(r pipeline.WindowResult[int, int]) int { return r.Key },
		func(r pipeline.WindowResult[int, int]) time.Time { return r.Start },
		pipeline.Fold(0, func(s int, r pipeline.WindowResult[int, int]) int { return s + r.Value }),
		with(path, pipeline.WithName("minutes"))...))
	require.NoError(t, err)
	want, _ := model(winSpec{size: time.Minute, slide: time.Minute}, evs, 0, 0)
	got := map[wkey]wval{}
	for _, r := range mins {
		w := want[wkey{r.Key, r.Start}]
		got[wkey{r.Key, r.Start}] = wval{end: r.End, sum: r.Value, n: w.n}
	}
	assert.Equal(t, want, got)
	checkAccounting(t, p.Report())
}
