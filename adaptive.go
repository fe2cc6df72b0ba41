package pipeline

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// WithAdaptiveWorkers makes the number of the stage's active workers adapt to what the
// service it calls can take: the limit moves between min and the stage's workers (its
// maximum) from the latency and errors the stage measures. Workers above the limit
// wait, without an item, until it grows again; the stage's queue is unchanged.
//
// The limit starts at min and is revised once per window of completed attempts (6 per
// active worker, at least 16), not per item. A window measures only the attempts that
// began under the current limit with no more attempts in flight than it allows (the
// calls of a higher limit still draining say nothing of this one). Its mean latency of
// successful attempts, against the floor (the lowest window mean of the last 8,
// measured again after each cut), tells how many of the stage's calls wait in the
// service's queue: limit × (1 − floor/mean), as TCP Vegas reckons a connection's
// queued packets.
//
//   - Errors rise (at least 1 attempt in 10 of the window failed with a transient error
//     or a timeout): the limit shrinks by a quarter.
//   - Calls queue (more than three quarters of one, and more than the latency's usual
//     spread explains): the service is saturated, and the limit is cut to what it
//     serves at the floor latency, limit × floor / mean (at least 1 less): the knee,
//     which [Report.Bottleneck] names. The window after a cut measures the floor
//     again: if the latency did not fall with the concurrency, nor at one more cut
//     (by a quarter) that tells, the service itself got slower, and its latency there
//     is the new floor. Each time a cut comes back to
//     the same knee, the limit waits twice as long (4, 8, ... up to 64 windows) before
//     it probes above it again, so that probing a known knee costs little latency.
//   - Otherwise, if nothing queues (less than half a call) and every active worker was
//     busy at some point of the window (more of them could have been used), it grows:
//     by 1, and by twice as much at each next window that still finds nothing queued
//     (at most half the limit), so that it catches up with a service scaled up.
//
// So it grows while throughput grows with the workers and latency stays at its floor,
// settles within a call or two above the concurrency where the service starts
// queueing, and follows that knee when it moves (a service scaled up or down) and the
// floor when it moves (a service that got slower or faster for good). It suits a stage
// whose attempts call something with a steady latency under its knee (a database, an
// API); with latencies that vary widely from item to item, prefer a fixed number.
//
// [StageReport].Limit gives the current limit and LimitHistory its latest changes;
// each change is an [EventLimit]. [Report.Bottleneck] reads the limit as the stage's
// workers. It panics if min < 1; the stage's constructor panics if min is more than the
// stage's workers, or if the stage has [WithKey] (each key's worker must run).
//
// An adaptive stage reads the clock twice, and takes a lock and two atomic adds, per
// attempt: about 60 ns per item and stage on bench's no-op 3x4 shape
// (BenchmarkClientOverhead), nothing next to a call of a service.
func WithAdaptiveWorkers(min int) StageOption {
	if min < 1 {
		panic(fmt.Sprintf("pipeline: WithAdaptiveWorkers(%d): the minimum must be at least 1", min))
	}
	return stageOpt(func(c *config) {
		c.client.add(policyMaker{
			name: "WithAdaptiveWorkers", order: orderAdaptive,
			make: func(env policyEnv) hook {
				return &adaptivePolicy{env: env, a: newAdaptive(min, env.workers, env.r.started)}
			},
			check: func(workers int, keyed bool) string {
				switch {
				case min > workers:
					return fmt.Sprintf("WithAdaptiveWorkers(%d): the minimum is more than the stage's %d workers", min, workers)
				case keyed:
					return "WithAdaptiveWorkers and WithKey together; a keyed stage needs every worker for its keys"
				}
				return ""
			},
		})
	})
}

// adaptivePolicy is one run's adaptive limit of a stage as a policy: it counts each
// attempt in flight and measures it. The workers above the limit wait in the worker
// loop (gate), between runs of items.
type adaptivePolicy struct {
	env policyEnv
	a   *adaptive
}

func (p *adaptivePolicy) before(_ context.Context, t ticket) (ticket, error) {
	t.began, t.measured = p.a.begin()
	t.inflight = true
	return t, nil
}

func (p *adaptivePolicy) cancel(t ticket) {
	if t.inflight {
		p.a.inflight.Add(-1)
	}
}

func (p *adaptivePolicy) after(t ticket, err error, class Class) bool {
	p.a.end(p.env.r, p.env.stage, t.began, t.measured, err != nil && counts(err, class))
	return false
}

func (p *adaptivePolicy) holds() bool         { return false }
func (p *adaptivePolicy) fill(s *StageReport) { s.Limit, s.LimitHistory = p.a.report() }

// adaptiveReport is the adaptive limits' part of the report's text.
var adaptiveReport = policyReport{
	warnings: func(_ Report, b Bottleneck, s StageReport) []string {
		if s.Name != b.Stage || s.LimitHistory == nil {
			return nil
		}
		knee := s.Limit // the limit after the last cut for latency is the knee; the limit probes above it now and then
		for _, c := range slices.Backward(s.LimitHistory) {
			if c.Reason == "latency" {
				knee = c.Limit
				break
			}
		}
		switch {
		case s.Limit < s.Workers && b.Suggested > s.Limit:
			return []string{fmt.Sprintf("stage %q: the adaptive limit holds it at %d of %d workers: what it calls saturates at about %d concurrent calls; the target rate needs a faster service, not more workers",
				s.Name, s.Limit, s.Workers, knee)}
		case s.Limit == s.Workers && b.Suggested > s.Workers:
			return []string{fmt.Sprintf("stage %q: the adaptive limit reached the stage's %d workers without saturating what it calls: allow more workers",
				s.Name, s.Workers)}
		}
		return nil
	},
	lines: func(b *strings.Builder, s StageReport) {
		if s.LimitHistory == nil {
			return
		}
		fmt.Fprintf(b, "adaptive %s: limit %d of %d workers", s.Name, s.Limit, s.Workers)
		if n := len(s.LimitHistory); n > 0 {
			fmt.Fprintf(b, ", last changed at %v (%s)", s.LimitHistory[n-1].At.Round(time.Millisecond), s.LimitHistory[n-1].Reason)
		}
		b.WriteString("\n")
	},
	line: func(s StageReport) string {
		if s.LimitHistory != nil {
			return fmt.Sprintf(" limit=%d/%d", s.Limit, s.Workers)
		}
		return ""
	},
}

// LimitChange is one change of an adaptive stage's limit.
type LimitChange struct {
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

// adaptive is one run's concurrency limit of one stage.
type adaptive struct {
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
	history   []LimitChange
}

func newAdaptive(min, max int, started time.Time) *adaptive {
	a := &adaptive{min: min, max: max, started: started, done: make(chan struct{}), grown: make(chan struct{}), changed: monotonic()}
	a.limit.Store(int64(min))
	return a
}

// gate waits until worker id is within the limit, the stage's input has ended, or the
// run stops (its cause).
func (a *adaptive) gate(ctx context.Context, id int) error {
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

func (a *adaptive) close() { a.endOnce.Do(func() { close(a.done) }) }

// begin counts an attempt in flight and returns when it began, and whether it is to be
// measured: it began with no more attempts in flight than the limit allows.
func (a *adaptive) begin() (time.Duration, bool) {
	n, limit := a.inflight.Add(1), a.limit.Load()
	if n >= limit && !a.saturated.Load() {
		a.saturated.Store(true)
	}
	return monotonic(), n <= limit
}

// end counts an attempt's outcome, and revises the limit at the end of a window.
func (a *adaptive) end(r *run, stage string, began time.Duration, measured, failed bool) {
	d := monotonic() - began
	a.inflight.Add(-1)
	a.mu.Lock()
	if !measured || began < a.changed { // began under another limit: says nothing of this one
		a.mu.Unlock()
		return
	}
	a.n++
	if failed {
		a.failed++ // a failure's latency says nothing of the service's (a refused call is quick)
	} else {
		a.ok++
		a.sum += d
		a.sumsq += float64(d) * float64(d)
	}
	var change *LimitChange
	if a.n >= max(16, limitPerWorker*int(a.limit.Load())) {
		change = a.reviseLocked()
	}
	a.mu.Unlock()
	if change != nil {
		r.emit(r.ctx, Event{Kind: EventLimit, Stage: stage, Limit: change.Limit})
	}
}

// reviseLocked ends a window: it moves the limit, and returns the change, if any.
func (a *adaptive) reviseLocked() *LimitChange {
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
	c := LimitChange{At: time.Since(a.started), Limit: next, Reason: reason}
	a.history = append(a.history, c)
	return &c
}

// report returns the current limit and its latest changes.
func (a *adaptive) report() (int, []LimitChange) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int(a.limit.Load()), append([]LimitChange{}, a.history...) // never nil: the stage is adaptive
}
