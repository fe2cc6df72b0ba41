package pipeline

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Breaker configures a stage's circuit breaker (see [WithCircuitBreaker]). A failure is
// an attempt whose error is transient or a timeout: the service failed, not the item.
// Any other outcome (a success, an item error) is a success for the breaker. At least
// one of Failures and FailureRatio must be set.
type Breaker struct {
	Failures       int           // open after this many failures in a row (0: no such rule)
	FailureRatio   float64       // open when this share of the attempts over Window failed, in (0, 1] (0: no such rule)
	MinSample      int           // FailureRatio: no verdict before this many attempts in the window (default 10)
	Window         time.Duration // FailureRatio: the window, in 10 slices (default 10 s)
	OpenFor        time.Duration // how long it stays open before it lets probes through (default 5 s)
	HalfOpenProbes int           // probes that must succeed in a row to close it (default 1)
	MaxOpen        time.Duration // not closed for longer than this: the run fails with a *BreakerError (0: no limit)
}

// BreakerState is the state of a circuit breaker.
type BreakerState uint8

const (
	// BreakerClosed lets every attempt through.
	BreakerClosed BreakerState = iota
	// BreakerOpen lets none through: the stage's workers wait, holding their items.
	BreakerOpen
	// BreakerHalfOpen lets a few probe attempts through; the other workers wait.
	BreakerHalfOpen
)

// String returns "closed", "open" or "half-open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("BreakerState(%d)", uint8(s))
}

// WithCircuitBreaker gives a stage a circuit breaker, for a service that goes down now
// and then: rather than let every item of an outage burn its retries and be
// dead-lettered, the stage waits for the service to come back.
//
// Closed, it counts the attempts' outcomes and opens after b.Failures failures in a
// row, or when at least b.MinSample attempts over the last b.Window include a share
// b.FailureRatio of failures. Open, it lets no attempt start: every worker waits before
// its next attempt, holding its item, and the stage's queue fills, which slows the
// stages before it (backpressure). After b.OpenFor (or the longer delay that the
// failure that opened it asked for with [RetryAfter], up to the stage's
// [WithRetryAfterCap]) it is half-open: b.HalfOpenProbes
// attempts go through one after another as probes; if they all succeed it closes and
// every worker goes on, and a failed probe opens it again.
//
// No item is lost or failed because of the breaker. An attempt that fails while the
// breaker is open or half-open (the one that opened it included) does not count as one
// of its item's [WithRetry] attempts: the item is held, and tried again once the
// breaker lets it, so an outage sets no item aside. An item's attempts that fail while
// the breaker stays closed count as usual. A held item is not settled, so an error
// budget ([WithErrorBudget]) does not see it; it sees what becomes of it afterwards.
//
// Choosing Failures and the attempts: the first items of an outage spend their own
// attempts until the breaker opens, so with w workers give each item more than about
// Failures/w attempts (with one worker, at least Failures), or the first item or two of
// an outage are dead-lettered. Conversely, an item that fails with a transient error
// whatever happens cannot be told from an outage when nothing succeeds between its
// attempts (one worker, and attempts >= Failures): it opens the breaker, then fails as
// its probe, and holds the stage until MaxOpen. With several workers, the other items'
// successes break its run of failures.
//
// The waits end when the run stops (the held items count as failed, like any item in
// flight then). If the breaker stays open or half-open for longer than b.MaxOpen, the
// next worker to wait fails the run with a [*BreakerError] (matching [ErrBreakerOpen]):
// a service down for that long is an outage to report, not to wait out.
//
// Each transition is an [Event] (EventBreakerOpen, EventBreakerHalfOpen,
// EventBreakerClosed) that [WithLogger] logs, and the stage's [StageReport].Breaker
// gives the state, the time spent open and the transitions. Each run starts closed.
//
// A closed breaker takes a lock per attempt, and reads the clock per attempt when
// b.FailureRatio is set (or the attempt failed): about 13 ns per item and stage on
// bench's no-op 3x4 shape (BenchmarkClientOverhead). It panics if a field is out of range, or if neither Failures
// nor FailureRatio is set.
func WithCircuitBreaker(b Breaker) StageOption {
	switch {
	case b.Failures < 0:
		panic(fmt.Sprintf("pipeline: WithCircuitBreaker: Failures %d is negative", b.Failures))
	case math.IsNaN(b.FailureRatio) || b.FailureRatio < 0 || b.FailureRatio > 1:
		panic(fmt.Sprintf("pipeline: WithCircuitBreaker: FailureRatio %v is not in [0, 1]", b.FailureRatio))
	case b.Failures == 0 && b.FailureRatio == 0:
		panic("pipeline: WithCircuitBreaker: set Failures, FailureRatio or both")
	case b.MinSample < 0, b.Window < 0, b.OpenFor < 0, b.HalfOpenProbes < 0, b.MaxOpen < 0:
		panic(fmt.Sprintf("pipeline: WithCircuitBreaker: negative MinSample, Window, OpenFor, HalfOpenProbes or MaxOpen in %+v", b))
	}
	if b.MinSample == 0 {
		b.MinSample = 10
	}
	if b.Window == 0 {
		b.Window = 10 * time.Second
	}
	if b.OpenFor == 0 {
		b.OpenFor = 5 * time.Second
	}
	if b.HalfOpenProbes == 0 {
		b.HalfOpenProbes = 1
	}
	return stageOpt(func(c *config) {
		c.client.add(policyMaker{name: "WithCircuitBreaker", order: orderBreaker, make: func(env policyEnv) hook {
			return breakerHook{newBreakerState(b, env.r, env.stage, env.raCap)}
		}})
	})
}

// breakerHook is one run's circuit breaker policy of a stage: before an attempt, it
// waits while the breaker holds the stage's items; after it, it counts the outcome and
// holds the item when the attempt failed while the breaker is (now) not closed.
type breakerHook struct{ b *breakerState }

func (p breakerHook) before(ctx context.Context, t ticket) (_ ticket, err error) {
	t.probe, err = p.b.allow(ctx)
	return t, err
}

func (p breakerHook) cancel(t ticket) { p.b.cancelProbe(t.probe) }

func (p breakerHook) after(t ticket, err error, class Class) bool {
	failure := err != nil && counts(err, class)
	if err != nil && !failure && class == ClassFatal { // the run stops: nothing to hold
		p.b.cancelProbe(t.probe)
		return false
	}
	return p.b.record(t.probe, failure, err)
}

func (p breakerHook) holds() bool         { return !p.b.closed.Load() }
func (p breakerHook) fill(s *StageReport) { s.Breaker = p.b.report() }

// breakerReport is the breakers' part of the report's text.
var breakerReport = policyReport{
	warnings: func(_ Report, _ Bottleneck, s StageReport) []string {
		if s.Breaker != nil && s.Breaker.State != BreakerClosed {
			return []string{fmt.Sprintf("stage %q: circuit breaker %s for %v: what it calls is failing",
				s.Name, s.Breaker.State, s.Breaker.TimeOpen.Round(time.Millisecond))}
		}
		return nil
	},
	lines: func(b *strings.Builder, s StageReport) {
		if br := s.Breaker; br != nil {
			fmt.Fprintf(b, "breaker %s: %s, opened %d times, open %v, %d attempts held\n",
				s.Name, br.State, br.Opened, br.TimeOpen.Round(time.Millisecond), br.Held)
		}
	},
	line: func(s StageReport) string {
		if s.Breaker != nil && s.Breaker.State != BreakerClosed {
			return " breaker=" + s.Breaker.State.String()
		}
		return ""
	},
}

// BreakerReport is the account of a stage's circuit breaker in one run.
type BreakerReport struct {
	State       BreakerState
	Opened      int64               // times it opened (from closed, or after a failed probe)
	TimeOpen    time.Duration       // time spent open or half-open, so far
	Held        int64               // failed attempts held for the breaker rather than counted against their items
	Transitions []BreakerTransition // the latest transitions (at most 32), oldest first
}

// BreakerTransition is one change of a circuit breaker's state.
type BreakerTransition struct {
	To BreakerState
	At time.Duration // since the run started
}

const (
	breakerSlices  = 10 // the FailureRatio window is kept in this many slices of time
	breakerHistory = 32 // transitions a report keeps
)

// breakerState is one run's circuit breaker of one stage.
type breakerState struct {
	cfg   Breaker
	r     *run
	stage string
	slice time.Duration
	raCap time.Duration // the longest Retry-After that keeps it open (WithRetryAfterCap)

	closed atomic.Bool // state == BreakerClosed, read without the lock

	mu        sync.Mutex
	state     BreakerState
	changed   chan struct{} // closed (and replaced) at every transition
	inRow     int           // failures in a row
	slices    [breakerSlices]struct{ n, failed, epoch int64 }
	openedAt  time.Time     // when it last opened
	openFor   time.Duration // how long it stays open this time: OpenFor, or the Retry-After of the failure that opened it
	since     time.Time     // when the current spell of not being closed began
	probes    int           // probes in flight
	probedOK  int           // probes that succeeded in a row
	opened    int64
	openTotal time.Duration // earlier spells, ended
	held      int64
	history   []BreakerTransition
}

func newBreakerState(b Breaker, r *run, stage string, raCap time.Duration) *breakerState {
	s := &breakerState{cfg: b, r: r, stage: stage, raCap: raCap, slice: b.Window / breakerSlices, changed: make(chan struct{})}
	s.closed.Store(true)
	return s
}

// allow waits until the breaker lets an attempt start, and reports whether that
// attempt is a probe. It returns the run's cause if the run stops first, or a
// *BreakerError once the breaker has not been closed for longer than MaxOpen.
func (b *breakerState) allow(ctx context.Context) (probe bool, err error) {
	if b.closed.Load() { // an attempt that began as it opened is held when it fails
		return false, nil
	}
	for {
		var events []Event
		b.mu.Lock()
		now := time.Now()
		if b.state == BreakerOpen && now.Sub(b.openedAt) >= b.openFor {
			events = append(events, b.moveLocked(BreakerHalfOpen, now, nil))
		}
		switch b.state {
		case BreakerClosed:
			b.mu.Unlock()
			b.emit(events)
			return false, nil
		case BreakerHalfOpen:
			if b.probes+b.probedOK < b.cfg.HalfOpenProbes && b.probes == 0 {
				b.probes++
				b.mu.Unlock()
				b.emit(events)
				return true, nil
			}
		}
		open := now.Sub(b.since)
		if b.cfg.MaxOpen > 0 && open >= b.cfg.MaxOpen {
			b.mu.Unlock()
			b.emit(events)
			return false, &BreakerError{Stage: b.stage, Open: open, MaxOpen: b.cfg.MaxOpen}
		}
		wake := time.Duration(math.MaxInt64)
		if b.state == BreakerOpen {
			wake = b.openFor - now.Sub(b.openedAt)
		}
		if b.cfg.MaxOpen > 0 {
			wake = min(wake, b.cfg.MaxOpen-open)
		}
		changed := b.changed
		b.mu.Unlock()
		b.emit(events)
		if err := waitChange(ctx, changed, wake); err != nil {
			return false, err
		}
	}
}

// waitChange waits until changed is closed, d has passed or ctx is done (its cause).
func waitChange(ctx context.Context, changed <-chan struct{}, d time.Duration) error {
	var timeout <-chan time.Time
	if d < time.Duration(math.MaxInt64) {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-changed:
	case <-timeout:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	return nil
}

// cancelProbe gives back a probe that allow granted but that never ran.
func (b *breakerState) cancelProbe(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	b.probes--
	changed := b.changed
	b.changed = make(chan struct{})
	b.mu.Unlock()
	close(changed) // wake a waiter to take the probe
}

// record adds an attempt's outcome, and reports whether the item is held (the attempt
// failed and the breaker is now open or half-open). err is the failure, for the event.
func (b *breakerState) record(probe, failed bool, err error) (held bool) {
	var events []Event
	b.mu.Lock()
	var now time.Time
	if failed || b.cfg.FailureRatio > 0 || b.state != BreakerClosed {
		now = time.Now() // a success of a closed breaker that counts failures in a row needs no clock
	}
	if probe {
		b.probes--
	}
	switch b.state {
	case BreakerClosed:
		if b.countLocked(failed, now) {
			b.opened++
			b.since = now
			events = append(events, b.moveLocked(BreakerOpen, now, err))
		}
		held = failed && b.state != BreakerClosed
	case BreakerOpen:
		held = failed // an attempt that began before the breaker opened
	case BreakerHalfOpen:
		switch {
		case !probe:
			held = failed // an attempt that began before the breaker opened
		case failed:
			b.opened++
			events = append(events, b.moveLocked(BreakerOpen, now, err))
			held = true
		default:
			b.probedOK++
			if b.probedOK >= b.cfg.HalfOpenProbes {
				b.openTotal += now.Sub(b.since)
				events = append(events, b.moveLocked(BreakerClosed, now, nil))
			} else {
				events = append(events, Event{}) // wake a waiter for the next probe
				b.wakeLocked()
			}
		}
	}
	if held {
		b.held++
	}
	b.mu.Unlock()
	b.emit(events)
	return held
}

// countLocked adds an outcome to the closed breaker's counts and reports whether it
// should open.
func (b *breakerState) countLocked(failed bool, now time.Time) bool {
	trip := false
	if failed {
		b.inRow++
		trip = b.cfg.Failures > 0 && b.inRow >= b.cfg.Failures
	} else {
		b.inRow = 0
	}
	if b.cfg.FailureRatio == 0 {
		return trip
	}
	epoch := int64(now.Sub(b.r.started) / b.slice)
	s := &b.slices[epoch%breakerSlices]
	if s.epoch != epoch {
		s.n, s.failed, s.epoch = 0, 0, epoch
	}
	s.n++
	if failed {
		s.failed++
	}
	if !failed {
		return trip
	}
	var n, f int64
	for i := range b.slices {
		if s := &b.slices[i]; epoch-s.epoch < breakerSlices {
			n, f = n+s.n, f+s.failed
		}
	}
	return trip || n >= int64(b.cfg.MinSample) && float64(f) >= b.cfg.FailureRatio*float64(n)
}

// moveLocked changes the state and returns the event to send once the lock is
// released.
func (b *breakerState) moveLocked(to BreakerState, now time.Time, err error) Event {
	b.state = to
	b.closed.Store(to == BreakerClosed)
	switch to {
	case BreakerOpen:
		b.openedAt = now
		b.openFor = max(b.cfg.OpenFor, min(retryAfterOf(err), b.raCap)) // a server's Retry-After (retryafter.go), capped
	case BreakerHalfOpen:
		b.probes, b.probedOK = 0, 0
	case BreakerClosed:
		b.inRow = 0
		b.slices = [breakerSlices]struct{ n, failed, epoch int64 }{}
	}
	if len(b.history) == breakerHistory {
		b.history = append(b.history[:0], b.history[1:]...)
	}
	b.history = append(b.history, BreakerTransition{To: to, At: now.Sub(b.r.started)})
	b.wakeLocked()
	kind := [...]EventKind{BreakerClosed: EventBreakerClosed, BreakerOpen: EventBreakerOpen, BreakerHalfOpen: EventBreakerHalfOpen}[to]
	return Event{Kind: kind, Stage: b.stage, Err: err}
}

func (b *breakerState) wakeLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// emit sends the events of transitions, outside the lock (observers are user code).
func (b *breakerState) emit(events []Event) {
	for _, e := range events {
		if e.Kind != 0 {
			b.r.emit(b.r.ctx, e)
		}
	}
}

// report returns the breaker's account so far.
func (b *breakerState) report() *BreakerReport {
	b.mu.Lock()
	defer b.mu.Unlock()
	rep := &BreakerReport{State: b.state, Opened: b.opened, TimeOpen: b.openTotal, Held: b.held, Transitions: append([]BreakerTransition(nil), b.history...)}
	if b.state != BreakerClosed {
		rep.TimeOpen += time.Since(b.since)
	}
	return rep
}
