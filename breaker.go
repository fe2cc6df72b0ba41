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

// Breaker configures a circuit breaker (see [WithCircuitBreaker] and
// [NewCircuitBreaker]). A failure is an attempt whose error counts (by default, one
// that is transient or a timeout: the service failed, not the item). Any other outcome
// (a success, an item error) is a success for the breaker. At least one of Failures
// and FailureRatio must be set.
type Breaker struct {
	Failures       int           // open after this many failures in a row (0: no such rule)
	FailureRatio   float64       // open when this share of the attempts over Window failed, in (0, 1] (0: no such rule)
	MinSample      int           // FailureRatio: no verdict before this many attempts in the window (default 10)
	Window         time.Duration // FailureRatio: the window, in 10 slices (default 10 s)
	OpenFor        time.Duration // how long it stays open before it lets probes through (default 5 s)
	HalfOpenProbes int           // probes that must succeed in a row to close it (default 1)
	MaxOpen        time.Duration // not closed for this long in all over MaxOpenWindow: the run fails with a *BreakerError (0: no limit)
	MaxOpenWindow  time.Duration // MaxOpen: the window over which the time not closed adds up, across spells (default 2 × MaxOpen; at least MaxOpen)

	// Counts, when set, tells which failed attempts count toward opening the breaker:
	// it is called with the error of every attempt that failed with a transient or an
	// item error (a fatal one stops the run) and its class. Without it, a transient
	// error or a timeout counts. Return false for an error that says the service is up
	// but refuses this call for now, such as an HTTP 429 (its Retry-After paces the
	// retry): such an attempt neither opens the breaker nor is held by it.
	Counts func(err error, class Class) bool
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
// dead-lettered, the stage waits for the service to come back. The breaker is the
// stage's, one per run; to share one among stages and pipelines that call the same
// service, see [NewCircuitBreaker].
//
// Closed, it counts the attempts' outcomes and opens after b.Failures failures in a
// row, or when at least b.MinSample attempts over the last b.Window include a share
// b.FailureRatio of failures (b.Counts says which failed attempts are failures). Open,
// it lets no attempt start: every worker waits before its next attempt, holding its
// item, and the stage's queue fills, which slows the stages before it
// (backpressure). After b.OpenFor (or the longer delay that the failure that opened it
// asked for with [RetryAfter], up to the stage's [WithRetryAfterCap]) it is half-open:
// b.HalfOpenProbes attempts go through one after another as probes; if they all
// succeed it closes and every worker goes on, and a failed probe opens it again.
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
// flight then). Once the breaker has been open or half-open for b.MaxOpen in all over
// the last b.MaxOpenWindow (one long spell, or many short ones of a breaker that
// flaps), the next worker to wait fails the run with a [*BreakerError] (matching
// [ErrBreakerOpen]): a service down for that long is an outage to report, not to wait
// out. The time is counted in 64 slices of the window, so the window it covers is
// b.MaxOpenWindow less up to a 64th of it.
//
// Each transition is an [Event] (EventBreakerOpen, EventBreakerHalfOpen,
// EventBreakerClosed) that [WithLogger] logs, and the stage's [StageReport].Breaker
// gives the state, the time spent open and the transitions. Each run starts closed.
//
// The breaker is for the whole stage, whatever its items: a service that fails for some
// keys only (one shard of several) opens it for all of them when the failing share
// reaches its rule, and then holds the healthy keys' items too.
//
// A closed breaker takes a lock per attempt, and reads the clock per attempt when
// b.FailureRatio is set (or the attempt failed): about 13 ns per item and stage on
// bench's no-op 3x4 shape (BenchmarkClientOverhead). It panics if a field is out of
// range, or if neither Failures nor FailureRatio is set.
func WithCircuitBreaker(b Breaker) StageOption {
	b = b.normalized("WithCircuitBreaker")
	return stageOpt(func(c *config) {
		c.client.add(policyMaker{name: "WithCircuitBreaker", order: orderBreaker, holds: true, make: func(env policyEnv) hook {
			return &breakerHook{env: env, b: newBreakerState(b)}
		}})
	})
}

// CircuitBreaker is a circuit breaker that several stages, of one pipeline or of
// several, share (see [WithSharedBreaker]): the stages that call one service see its
// outage once, as the stages given one [*rate.Limiter] share its rate. It is safe for
// concurrent use. Its state lasts from [NewCircuitBreaker] on, across runs: a run
// that starts while it is open waits as the stages of the run that opened it do.
type CircuitBreaker struct{ s *breakerState }

// NewCircuitBreaker returns a circuit breaker configured by b, closed, for
// [WithSharedBreaker]. Its rules are those of [WithCircuitBreaker]'s, over the
// attempts of all the stages that share it: a failure of any of them counts, and while
// it is open none of them starts an attempt. It panics as WithCircuitBreaker does.
func NewCircuitBreaker(b Breaker) *CircuitBreaker {
	return &CircuitBreaker{s: newBreakerState(b.normalized("NewCircuitBreaker"))}
}

// State returns the breaker's state now.
func (cb *CircuitBreaker) State() BreakerState {
	cb.s.mu.Lock()
	defer cb.s.mu.Unlock()
	return cb.s.state
}

// WithSharedBreaker gives a stage the circuit breaker cb, which other stages and
// pipelines may share (see [NewCircuitBreaker]). The stage behaves as with
// [WithCircuitBreaker], with cb's state: an outage that opens cb through one stage
// holds the others' attempts too, and the first probe of any of them closes it for
// all. A transition is an [Event] of the run and stage whose attempt made it; the
// stage's [StageReport].Breaker gives cb's state, its openings and time open since
// cb was made (transitions before the run have a negative At), and the attempts of
// this stage that it held. A Retry-After keeps cb open up to the cap of the stage
// whose failure opened it ([WithRetryAfterCap]). It panics if cb is nil.
func WithSharedBreaker(cb *CircuitBreaker) StageOption {
	if cb == nil {
		panic("pipeline: WithSharedBreaker(nil)")
	}
	return stageOpt(func(c *config) {
		c.client.add(policyMaker{name: "WithCircuitBreaker", order: orderBreaker, holds: true, make: func(env policyEnv) hook {
			return &breakerHook{env: env, b: cb.s}
		}})
	})
}

// normalized checks b and fills in its defaults; ctor names the caller for a panic.
func (b Breaker) normalized(ctor string) Breaker {
	switch {
	case b.Failures < 0:
		panic(fmt.Sprintf("pipeline: %s: Failures %d is negative", ctor, b.Failures))
	case math.IsNaN(b.FailureRatio) || b.FailureRatio < 0 || b.FailureRatio > 1:
		panic(fmt.Sprintf("pipeline: %s: FailureRatio %v is not in [0, 1]", ctor, b.FailureRatio))
	case b.Failures == 0 && b.FailureRatio == 0:
		panic(fmt.Sprintf("pipeline: %s: set Failures, FailureRatio or both", ctor))
	case b.MinSample < 0, b.Window < 0, b.OpenFor < 0, b.HalfOpenProbes < 0, b.MaxOpen < 0, b.MaxOpenWindow < 0:
		panic(fmt.Sprintf("pipeline: %s: negative MinSample, Window, OpenFor, HalfOpenProbes, MaxOpen or MaxOpenWindow in %+v", ctor, b))
	case b.MaxOpenWindow > 0 && b.MaxOpenWindow < b.MaxOpen:
		panic(fmt.Sprintf("pipeline: %s: MaxOpenWindow %v is shorter than MaxOpen %v", ctor, b.MaxOpenWindow, b.MaxOpen))
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
	if b.MaxOpenWindow == 0 {
		b.MaxOpenWindow = 2 * b.MaxOpen
	}
	return b
}

// breakerHook is one run's circuit breaker policy of a stage: before an attempt, it
// waits while the breaker holds the stage's items; after it, it counts the outcome and
// holds the item when the attempt failed while the breaker is (now) not closed.
type breakerHook struct {
	env  policyEnv
	b    *breakerState // the stage's, or a shared one
	held atomic.Int64  // failed attempts of this stage held rather than counted against their items
}

func (p *breakerHook) before(ctx context.Context, t ticket) (_ ticket, err error) {
	t.probe, err = p.b.allow(ctx, &p.env)
	return t, err
}

func (p *breakerHook) cancel(t ticket) { p.b.cancelProbe(t.probe) }

func (p *breakerHook) after(t ticket, err error, class Class) bool {
	if err != nil && class == ClassFatal { // the run stops: nothing to hold
		p.b.cancelProbe(t.probe)
		return false
	}
	failure := err != nil && p.b.counts(err, class)
	held := p.b.record(t.probe, failure, err, &p.env)
	if held {
		p.held.Add(1)
	}
	return held
}

func (p *breakerHook) holds() bool { return !p.b.closed.Load() }

func (p *breakerHook) fill(s *StageReport) {
	s.Breaker = p.b.report(p.env.r.started)
	s.Breaker.Held = p.held.Load()
}

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

// BreakerReport is the account of a stage's circuit breaker in one run (of a shared
// one, since it was made, but for Held).
type BreakerReport struct {
	State       BreakerState
	Opened      int64               // times it opened (from closed, or after a failed probe)
	TimeOpen    time.Duration       // time spent open or half-open, so far
	Held        int64               // failed attempts of the stage held for the breaker rather than counted against their items
	Transitions []BreakerTransition // the latest transitions (at most 32), oldest first
}

// BreakerTransition is one change of a circuit breaker's state.
type BreakerTransition struct {
	To BreakerState
	At time.Duration // since the run started
}

const (
	breakerSlices  = 10 // the FailureRatio window is kept in this many slices of time
	openSlices     = 64 // the MaxOpenWindow is kept in this many slices of time
	breakerHistory = 32 // transitions a report keeps
)

// breakerState is a circuit breaker: a stage's for one run, or a shared one.
type breakerState struct {
	cfg       Breaker
	made      time.Time     // the slices' origin
	slice     time.Duration // of the FailureRatio window
	openSlice time.Duration // of the MaxOpenWindow

	closed atomic.Bool // state == BreakerClosed, read without the lock

	mu        sync.Mutex
	state     BreakerState
	changed   chan struct{} // closed (and replaced) at every transition
	inRow     int           // failures in a row
	slices    [breakerSlices]struct{ n, failed, epoch int64 }
	open      [openSlices]struct{ d, epoch int64 } // time not closed per slice of the MaxOpenWindow, of spells ended
	openedAt  time.Time                            // when it last opened
	openFor   time.Duration                        // how long it stays open this time: OpenFor, or the Retry-After of the failure that opened it
	since     time.Time                            // when the current spell of not being closed began
	probes    int                                  // probes in flight
	probedOK  int                                  // probes that succeeded in a row
	opened    int64
	openTotal time.Duration // earlier spells, ended
	history   []transition
}

// transition is one entry of a breaker's history.
type transition struct {
	to BreakerState
	at time.Time
}

func newBreakerState(b Breaker) *breakerState {
	s := &breakerState{cfg: b, made: time.Now(), slice: max(b.Window/breakerSlices, 1), changed: make(chan struct{})}
	s.openSlice = max(b.MaxOpenWindow/openSlices, 1)
	s.closed.Store(true)
	return s
}

// counts reports whether a failed attempt's error counts toward opening.
func (b *breakerState) counts(err error, class Class) bool {
	if b.cfg.Counts != nil {
		return b.cfg.Counts(err, class)
	}
	return counts(err, class)
}

// allow waits until the breaker lets an attempt of env's stage start, and reports
// whether that attempt is a probe. It returns the run's cause if the run stops first,
// or a *BreakerError once the breaker has not been closed for MaxOpen over the last
// MaxOpenWindow.
func (b *breakerState) allow(ctx context.Context, env *policyEnv) (probe bool, err error) {
	if b.closed.Load() { // an attempt that began as it opened is held when it fails
		return false, nil
	}
	for {
		var events []Event
		b.mu.Lock()
		now := time.Now()
		if b.state == BreakerOpen && now.Sub(b.openedAt) >= b.openFor {
			events = append(events, b.moveLocked(BreakerHalfOpen, now, nil, env))
		}
		switch b.state {
		case BreakerClosed:
			b.mu.Unlock()
			env.emit(events)
			return false, nil
		case BreakerHalfOpen:
			if b.probes == 0 && b.probedOK < b.cfg.HalfOpenProbes {
				b.probes++
				b.mu.Unlock()
				env.emit(events)
				return true, nil
			}
		}
		var open time.Duration
		if b.cfg.MaxOpen > 0 {
			if open = b.openWithinLocked(now); open >= b.cfg.MaxOpen {
				b.mu.Unlock()
				env.emit(events)
				return false, &BreakerError{Stage: env.stage, Open: open, MaxOpen: b.cfg.MaxOpen, Window: b.cfg.MaxOpenWindow}
			}
		}
		wake := time.Duration(math.MaxInt64)
		if b.state == BreakerOpen {
			wake = b.openFor - now.Sub(b.openedAt)
		}
		if b.cfg.MaxOpen > 0 {
			wake = min(wake, b.cfg.MaxOpen-open) // the time not closed grows at most as fast as the clock
		}
		changed := b.changed
		b.mu.Unlock()
		env.emit(events)
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
func (b *breakerState) record(probe, failed bool, err error, env *policyEnv) (held bool) {
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
			events = append(events, b.moveLocked(BreakerOpen, now, err, env))
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
			events = append(events, b.moveLocked(BreakerOpen, now, err, env))
			held = true
		default:
			b.probedOK++
			if b.probedOK >= b.cfg.HalfOpenProbes {
				b.endSpellLocked(now)
				events = append(events, b.moveLocked(BreakerClosed, now, nil, env))
			} else {
				b.wakeLocked() // wake a waiter for the next probe
			}
		}
	}
	b.mu.Unlock()
	env.emit(events)
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
	epoch := int64(now.Sub(b.made) / b.slice)
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

// endSpellLocked ends the spell of not being closed that began at b.since: its time
// goes to the total and, by slice, to the MaxOpenWindow's account.
func (b *breakerState) endSpellLocked(now time.Time) {
	b.openTotal += now.Sub(b.since)
	if b.cfg.MaxOpen == 0 {
		return
	}
	from, to := b.since.Sub(b.made), now.Sub(b.made)
	sl := b.openSlice
	last := int64(to / sl)
	first := max(int64(from/sl), last-openSlices+1)
	for e := first; e <= last; e++ {
		lo, hi := max(from, time.Duration(e)*sl), min(to, time.Duration(e+1)*sl)
		if hi <= lo {
			continue
		}
		s := &b.open[e%openSlices]
		if s.epoch != e {
			s.d, s.epoch = 0, e
		}
		s.d += int64(hi - lo)
	}
}

// openWithinLocked returns the time not closed over the window's slices up to now: the
// ended spells' and the current one's.
func (b *breakerState) openWithinLocked(now time.Time) time.Duration {
	sl := b.openSlice
	at := now.Sub(b.made)
	last := int64(at / sl)
	var d time.Duration
	for i := range b.open {
		if s := &b.open[i]; s.epoch <= last && last-s.epoch < openSlices {
			d += time.Duration(s.d)
		}
	}
	if b.state != BreakerClosed {
		from := max(b.since.Sub(b.made), time.Duration(last-openSlices+1)*sl)
		d += max(at-from, 0)
	}
	return d
}

// moveLocked changes the state and returns the event to send once the lock is
// released, in env's run.
func (b *breakerState) moveLocked(to BreakerState, now time.Time, err error, env *policyEnv) Event {
	b.state = to
	b.closed.Store(to == BreakerClosed)
	switch to {
	case BreakerOpen:
		b.openedAt = now
		b.openFor = max(b.cfg.OpenFor, min(retryAfterOf(err), env.raCap)) // a server's Retry-After (retryafter.go), capped
	case BreakerHalfOpen:
		b.probes, b.probedOK = 0, 0
	case BreakerClosed:
		b.inRow = 0
		b.slices = [breakerSlices]struct{ n, failed, epoch int64 }{}
	}
	if len(b.history) == breakerHistory {
		b.history = append(b.history[:0], b.history[1:]...)
	}
	b.history = append(b.history, transition{to: to, at: now})
	b.wakeLocked()
	kind := [...]EventKind{BreakerClosed: EventBreakerClosed, BreakerOpen: EventBreakerOpen, BreakerHalfOpen: EventBreakerHalfOpen}[to]
	return Event{Kind: kind, Stage: env.stage, Err: err}
}

func (b *breakerState) wakeLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// emit sends the events of a breaker's transitions in the run, outside the breaker's
// lock (observers are user code).
func (env *policyEnv) emit(events []Event) {
	for _, e := range events {
		env.r.emit(env.r.ctx, e)
	}
}

// report returns the breaker's account so far, its times relative to started.
func (b *breakerState) report(started time.Time) *BreakerReport {
	b.mu.Lock()
	defer b.mu.Unlock()
	rep := &BreakerReport{State: b.state, Opened: b.opened, TimeOpen: b.openTotal, Transitions: make([]BreakerTransition, len(b.history))}
	for i, h := range b.history {
		rep.Transitions[i] = BreakerTransition{To: h.to, At: h.at.Sub(started)}
	}
	if len(rep.Transitions) == 0 {
		rep.Transitions = nil
	}
	if b.state != BreakerClosed {
		rep.TimeOpen += time.Since(b.since)
	}
	return rep
}
