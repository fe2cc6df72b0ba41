// Package adaptive holds the controller of the root package's WithAdaptiveWorkers: a
// stage's concurrency limit, revised once per window of attempts from their latency
// and errors (the option's documentation says how). It knows nothing of items, stages
// or runs: a worker waits in Gate between runs of items, each attempt is counted by
// Begin and End, and End returns the change of limit for the caller to tell.
package adaptive

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Change is one change of the limit: the root package's LimitChange.
type Change struct {
	At     time.Duration // since the run started
	Limit  int
	Reason string // "grow", "latency" or "errors"
}

const (
	limitHistory   = 64   // changes a report keeps
	limitPerWorker = 6    // completed attempts per active worker in a window
	limitFloors    = 8    // the floor is the lowest mean of this many latest windows
	limitQueue     = 0.75 // calls queue when more than this wait (and more than 3 standard errors)
	limitClear     = 0.5  // nothing queues when fewer than this wait
	limitHold      = 4    // windows to wait after a cut to a new knee before growing
	limitHoldMax   = 64   // windows, at most, before probing a known knee again
)

// Limit is one run's concurrency limit of one stage.
type Limit struct {
	min, max int
	started  time.Time
	limit    atomic.Int64
	done     chan struct{} // closed when the stage's input is closed and drained
	endOnce  sync.Once

	inflight  atomic.Int64 // attempts in flight
	saturated atomic.Bool  // all active workers were busy at once in this window

	mu        sync.Mutex
	grown     chan struct{} // closed (and replaced) when the limit grows
	n, failed int           // attempts completed in the window, and failed
	ok        int           // succeeded: the latency figures are theirs
	sum       time.Duration // their latencies
	sumsq     float64       // their latencies squared, in ns²
	noise     float64       // the latency's coefficient of variation in windows where nothing queued
	noiseSet  bool
	floors    []time.Duration // the latest windows' means, at most limitFloors: the floor is the least
	cut       bool            // the last revision cut the limit for latency: this window measures the floor again
	cutMean   time.Duration   // the mean latency that made the cut
	cutFrom   int             // the limit before the cut
	confirmed bool            // the last cut was to confirm a slower service
	knee      int             // the limit after the last cut for latency
	hold      int             // windows to wait before growing
	holdNext  int             // the hold after a cut that brings the limit back to the same knee
	step      int             // the next growth: doubles while growing finds no queue
	changed   time.Duration   // when the limit last changed (monotonic): earlier attempts are not measured
	history   []Change
}

// New returns the limit of a stage of max workers, at least min, for a run begun at
// started; it starts at min.
func New(min, max int, started time.Time) *Limit {
	a := &Limit{min: min, max: max, started: started, done: make(chan struct{}), grown: make(chan struct{}), changed: monotonic()}
	a.limit.Store(int64(min))
	return a
}

// Gate waits until worker id is within the limit, the stage's input has ended, or the
// run stops (its cause).
func (a *Limit) Gate(ctx context.Context, id int) error {
	for {
		if int64(id) < a.limit.Load() {
			return nil
		}
		a.mu.Lock()
		grown := a.grown
		a.mu.Unlock()
		if int64(id) < a.limit.Load() {
			return nil
		}
		select {
		case <-grown:
		case <-a.done:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// Close tells the workers that wait in Gate that the stage's input has ended.
func (a *Limit) Close() { a.endOnce.Do(func() { close(a.done) }) }

// Begin counts an attempt in flight and returns when it began, and whether it is to be
// measured: it began with no more attempts in flight than the limit allows.
func (a *Limit) Begin() (time.Duration, bool) {
	n, limit := a.inflight.Add(1), a.limit.Load()
	if n >= limit && !a.saturated.Load() {
		a.saturated.Store(true)
	}
	return monotonic(), n <= limit
}

// Cancel uncounts an attempt that Begin counted in flight and that never ran.
func (a *Limit) Cancel() { a.inflight.Add(-1) }

// End counts an attempt's outcome (began and measured as Begin returned them), and
// revises the limit at the end of a window: it returns the change, if any, for the
// caller to tell (the root package's EventLimit).
func (a *Limit) End(began time.Duration, measured, failed bool) *Change {
	d := monotonic() - began
	a.inflight.Add(-1)
	a.mu.Lock()
	if !measured || began < a.changed { // began under another limit: says nothing of this one
		a.mu.Unlock()
		return nil
	}
	a.n++
	if failed {
		a.failed++ // a failure's latency says nothing of the service's (a refused call is quick)
	} else {
		a.ok++
		a.sum += d
		a.sumsq += float64(d) * float64(d)
	}
	var change *Change
	if a.n >= max(16, limitPerWorker*int(a.limit.Load())) {
		change = a.reviseLocked()
	}
	a.mu.Unlock()
	return change
}

// reviseLocked ends a window: it moves the limit, and returns the change, if any.
func (a *Limit) reviseLocked() *Change {
	old := int(a.limit.Load())
	cut := a.cut
	a.cut = false
	confirm := false // cut once more, to tell a slower service from queueing
	queued := 0.0    // the stage's calls waiting in the service's queue, by Vegas's reckoning
	spread := 0.0    // the standard error of queued that the latency's spread makes
	var mean, floor time.Duration
	if a.ok*2 >= a.n { // enough successes to measure the latency
		mean = a.sum / time.Duration(a.ok)
		// The latency's own spread, as measured in windows where nothing queued (queueing
		// spreads it too), makes the standard error of queued.
		cv := math.Sqrt(max(0, a.sumsq/float64(a.ok)-float64(mean)*float64(mean))) / float64(mean)
		spread = float64(old) * a.noise / math.Sqrt(float64(a.ok))
		if len(a.floors) > 0 {
			floor = slices.Min(a.floors)
			queued = float64(old) * (1 - float64(floor)/float64(mean))
		}
		// After a cut, queueing alone would have brought the latency down with the
		// concurrency, to cutMean × old / cutFrom. If it stayed where it was (within
		// half of that fall and a tenth, or what the latency's spread explains), the
		// service itself may have got slower: one more cut tells, since a latency that
		// stays where it was again is the service's floor now (and so is the latency at
		// the least concurrency). A latency that moved otherwise is queueing still (the
		// cut's window straddled a change of the service, or it lost capacity again):
		// cut again against the same floor.
		slower := old == a.min
		if cut {
			fell := float64(a.cutMean) * (1 - float64(old)/float64(a.cutFrom))
			tol := max(min(float64(a.cutMean)/10, fell/2), 3*a.noise*float64(mean)/math.Sqrt(float64(a.ok)))
			slower = math.Abs(float64(mean-a.cutMean)) <= tol
		}
		switch {
		case queued <= limitClear || !slower:
			a.confirmed = false
		case !a.confirmed && old > a.min:
			confirm, a.confirmed = true, true // the next window confirms it
		default:
			a.floors, floor, queued, a.confirmed = a.floors[:0], mean, 0, false
		}
		if queued < limitClear {
			if !a.noiseSet {
				a.noise, a.noiseSet = cv, true
			}
			a.noise += (cv - a.noise) / 8
		}
		if len(a.floors) == limitFloors {
			a.floors = append(a.floors[:0], a.floors[1:]...)
		}
		a.floors = append(a.floors, mean)
	}
	next, reason := old, ""
	grow := false
	switch {
	case confirm:
		next, reason = max(a.min, min(old*3/4, old-1)), "latency"
		a.cut, a.cutMean, a.cutFrom = true, mean, old
	case a.failed*10 >= a.n:
		next, reason = max(a.min, min(old*3/4, old-1)), "errors"
		a.hold = 2
	case queued > max(limitQueue, 3*spread):
		next, reason = max(a.min, min(int(math.Round(float64(old)*float64(floor)/float64(mean))), old-1)), "latency"
		a.cut, a.cutMean, a.cutFrom = true, mean, old
		if next == a.knee { // the same knee again: probe above it less often
			a.holdNext = min(2*a.holdNext, limitHoldMax)
		} else {
			a.knee, a.holdNext = next, limitHold
		}
		a.hold = a.holdNext
	case a.hold > 0:
		a.hold--
	case queued < max(limitClear, 2*spread) && a.saturated.Load() && old < a.max:
		next, reason, grow = min(a.max, old+max(a.step, 1)), "grow", true
	}
	if grow { // nothing queued at the last growth either: the knee moved up, go faster
		a.step = min(2*max(a.step, 1), max(1, old/2))
	} else {
		a.step = 1
	}
	a.n, a.failed, a.ok, a.sum, a.sumsq = 0, 0, 0, 0, 0
	a.saturated.Store(false)
	if next == old {
		return nil
	}
	a.limit.Store(int64(next))
	a.changed = monotonic()
	if next > old {
		close(a.grown)
		a.grown = make(chan struct{})
	}
	if len(a.history) == limitHistory {
		a.history = append(a.history[:0], a.history[1:]...)
	}
	c := Change{At: time.Since(a.started), Limit: next, Reason: reason}
	a.history = append(a.history, c)
	return &c
}

// Report returns the current limit and its latest changes (a copy).
func (a *Limit) Report() (int, []Change) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int(a.limit.Load()), append([]Change{}, a.history...)
}

// monotonic returns the time since the process's clock base (origin). In a synctest
// bubble the readings are the bubble's (negative: its clock starts in 2000), and
// their differences as exact: compare readings with each other, never with 0.
func monotonic() time.Duration { return time.Since(origin) }

var origin = time.Now()
