package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopipeline/pipeline/internal/retryafter"
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
func (s BreakerState) String() string { return enumName("BreakerState", breakerStateNames[:], s) }

var breakerStateNames = [...]string{BreakerClosed: "closed", BreakerOpen: "open", BreakerHalfOpen: "half-open"}

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
// reaches its rule, and then holds the healthy keys' items too. For such a service,
// give each key a breaker of its own with [WithBreakerPerKey].
//
// A closed breaker takes a lock per attempt, and reads the clock per attempt when
// b.FailureRatio is set (or the attempt failed): about 13 ns per item and stage on
// bench's no-op 3x4 shape (BenchmarkClientOverhead). It panics if a field is out of
// range, or if neither Failures nor FailureRatio is set.
func WithCircuitBreaker(b Breaker) StageOption {
	b = b.normalized("WithCircuitBreaker")
	return stageOpt(func(c *config) {
		c.client.add(policyMaker{name: "WithCircuitBreaker", order: orderBreaker, make: func(env policyEnv) hook {
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
		c.client.add(policyMaker{name: "WithCircuitBreaker", order: orderBreaker, make: func(env policyEnv) hook {
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

// testBeforeAllow, set by a test, runs in before ahead of allow: a breaker that
// another stage opens at that moment (breaker_internal_test.go).
var testBeforeAllow func(p *breakerHook)

func (p *breakerHook) before(ctx context.Context, t ticket, hold func() error) (_ ticket, err error) {
	if testBeforeAllow != nil {
		testBeforeAllow(p)
	}
	t.probe, err = p.b.allow(ctx, &p.env, hold)
	return t, err
}

func (p *breakerHook) cancel(t ticket) { p.b.cancelProbe(t.probe) }

func (p *breakerHook) after(t ticket, err error, class Class) bool {
	held := p.b.after(t.probe, err, class, &p.env)
	if held {
		p.held.Add(1)
	}
	return held
}

func (p *breakerHook) fill(s *StageReport) {
	s.Breaker = p.b.report(p.env.r.started)
	s.Breaker.Held = p.held.Load()
}

// breakerReport is the breakers' part of the report's text.
var breakerReport = policyReport{
	warnings: func(_ Report, _ Bottleneck, s StageReport) []string {
		switch br := s.Breaker; {
		case br == nil || br.State == BreakerClosed && br.Holding == 0:
		case br.PerKey:
			return []string{fmt.Sprintf("stage %q: circuit breakers of %d keys not closed, %d items held: what it calls is failing for those keys",
				s.Name, br.KeysOpen, br.Holding)}
		default:
			return []string{fmt.Sprintf("stage %q: circuit breaker %s for %v: what it calls is failing",
				s.Name, br.State, br.TimeOpen.Round(time.Millisecond))}
		}
		return nil
	},
	lines: func(b *strings.Builder, s StageReport) {
		br := s.Breaker
		if br == nil {
			return
		}
		fmt.Fprintf(b, "breaker %s: %s, opened %d times, open %v, %d attempts held",
			s.Name, br.State, br.Opened, br.TimeOpen.Round(time.Millisecond), br.Held)
		if br.PerKey {
			fmt.Fprintf(b, "; per key: %d keys not closed, %d items held", br.KeysOpen, br.Holding)
			for i, k := range br.Keys[:min(len(br.Keys), 4)] {
				sep := "; "
				if i == 0 {
					sep = " ("
				}
				fmt.Fprintf(b, "%s%s: %s, %d held", sep, k.Key, k.State, k.Holding)
			}
			if len(br.Keys) > 0 {
				b.WriteString(")")
			}
		}
		b.WriteString("\n")
	},
	line: func(s StageReport) string {
		switch br := s.Breaker; {
		case br == nil || br.State == BreakerClosed && br.Holding == 0:
		case br.PerKey:
			return fmt.Sprintf(" breaker=%s keys-open=%d held=%d", br.State, br.KeysOpen, br.Holding)
		default:
			return " breaker=" + br.State.String()
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
	Transitions []BreakerTransition // the latest transitions (at most 32), oldest first; none for a breaker per key

	// A breaker per key ([WithBreakerPerKey]): PerKey is true, State is the worst
	// key's, and Opened and TimeOpen add up the keys'.
	PerKey   bool
	Holding  int64              // items held now, out of the workers' hands (counted in NotStarted); in a final report, those the run's stop left
	KeysOpen int                // keys whose breaker is not closed now
	Keys     []KeyBreakerReport // the keys whose breaker is not closed or holds items (at most 16), most held first
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
	notify    func() // called (under mu) at every wake: a breaker per key tells its held items' waiters; nil otherwise
	key       string // a breaker per key's key, for its events ("" otherwise)
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

// failing reports whether an attempt's error (nil: it succeeded) counts toward opening,
// for the attempt that probe says. If the user's Counts panics (or exits the
// goroutine), it first gives back the attempt's probe: the worker has already counted
// the attempt's ticket as settled, and a probe left taken would keep a shared breaker
// half-open for good, every later run's attempt waiting for it.
func (b *breakerState) failing(probe bool, err error, class Class) bool {
	if err == nil {
		return false
	}
	if b.cfg.Counts == nil {
		return counts(err, class)
	}
	returned := false
	defer func() {
		if !returned {
			b.cancelProbe(probe)
		}
	}()
	f := b.cfg.Counts(err, class)
	returned = true
	return f
}

// allow waits until the breaker lets an attempt of env's stage start, and reports
// whether that attempt is a probe. Before it first waits it calls hold (the worker
// hands on what its run finished), and asks again: the breaker may have moved
// meanwhile. It returns the run's cause if the run stops first, hold's error, or a
// *BreakerError once the breaker has not been closed for MaxOpen over the last
// MaxOpenWindow.
func (b *breakerState) allow(ctx context.Context, env *policyEnv, hold func() error) (probe bool, err error) {
	if b.closed.Load() { // an attempt that began as it opened is held when it fails
		return false, nil
	}
	for {
		ok, probe, wake, changed, err := b.try(env)
		if ok || err != nil {
			return probe, err
		}
		if hold != nil { // decided here, not before acquire: another stage may open a shared breaker in between
			if err := hold(); err != nil {
				return false, err
			}
			hold = nil
			continue
		}
		if err := waitChange(ctx, changed, wake); err != nil {
			return false, err
		}
	}
}

// try reports whether the breaker lets an attempt of env's stage start now (ok), and
// whether that attempt is a probe. If not, wake is how long until it may (MaxInt64:
// not before a transition) and changed is closed at the next transition; err is a
// *BreakerError once the breaker has not been closed for MaxOpen over the last
// MaxOpenWindow.
func (b *breakerState) try(env *policyEnv) (ok, probe bool, wake time.Duration, changed <-chan struct{}, err error) {
	var events []Event
	b.mu.Lock()
	defer func() {
		b.mu.Unlock()
		env.emit(events)
	}()
	return b.tryLocked(time.Now(), env, &events)
}

// tryLocked is try under b.mu, at now. The events of its transitions are added to
// *events, for the caller to send once it holds no lock.
func (b *breakerState) tryLocked(now time.Time, env *policyEnv, events *[]Event) (ok, probe bool, wake time.Duration, changed <-chan struct{}, err error) {
	if b.state == BreakerOpen && now.Sub(b.openedAt) >= b.openFor {
		*events = append(*events, b.moveLocked(BreakerHalfOpen, now, nil, env))
	}
	switch b.state {
	case BreakerClosed:
		return true, false, 0, nil, nil
	case BreakerHalfOpen:
		if b.probes == 0 && b.probedOK < b.cfg.HalfOpenProbes {
			b.probes++
			return true, true, 0, nil, nil
		}
	}
	wake, changed, err = b.refusedLocked(now, env)
	return false, false, wake, changed, err
}

// refusedLocked is what try tells of an attempt that the breaker (not closed) does
// not let through at now: how long until it may and the channel of the next
// transition, or a *BreakerError once it has not been closed for MaxOpen.
func (b *breakerState) refusedLocked(now time.Time, env *policyEnv) (wake time.Duration, changed <-chan struct{}, err error) {
	var open time.Duration
	if b.cfg.MaxOpen > 0 {
		if open = b.openWithinLocked(now); open >= b.cfg.MaxOpen {
			return 0, nil, &BreakerError{Stage: env.stage, Open: open, MaxOpen: b.cfg.MaxOpen, Window: b.cfg.MaxOpenWindow}
		}
	}
	wake = time.Duration(math.MaxInt64)
	if b.state == BreakerOpen {
		wake = b.openFor - now.Sub(b.openedAt)
	}
	if b.cfg.MaxOpen > 0 {
		wake = min(wake, b.cfg.MaxOpen-open) // the time not closed grows at most as fast as the clock
	}
	return wake, b.changed, nil
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
	b.wakeLocked() // wake a waiter to take the probe
	b.mu.Unlock()
}

// after settles an attempt that allow let through, with its error and class, and
// reports whether the item is held: a fatal error stops the run, so it gives the probe
// back and holds nothing; any other outcome is recorded.
func (b *breakerState) after(probe bool, err error, class Class, env *policyEnv) (held bool) {
	if err != nil && class == ClassFatal { // the run stops: nothing to hold
		b.cancelProbe(probe)
		return false
	}
	return b.record(probe, b.failing(probe, err, class), err, env)
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
		b.openFor = max(b.cfg.OpenFor, min(retryafter.Of(err), env.raCap)) // a server's Retry-After (internal/retryafter), capped
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
	return Event{Kind: kind, Stage: env.stage, Err: err, Key: b.key}
}

func (b *breakerState) wakeLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
	if b.notify != nil {
		b.notify()
	}
}

// readyLocked reports whether an attempt may start now (try would say ok), and if not,
// how long until it may (MaxInt64: not before a transition).
func (b *breakerState) readyLocked(now time.Time) (bool, time.Duration) {
	switch b.state {
	case BreakerClosed:
		return true, 0
	case BreakerHalfOpen:
		return b.probes == 0 && b.probedOK < b.cfg.HalfOpenProbes, time.Duration(math.MaxInt64)
	}
	if d := b.openFor - now.Sub(b.openedAt); d > 0 {
		return false, d
	}
	return true, 0
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

// KeyBounds bounds the memory of a breaker per key ([WithBreakerPerKey]). A zero
// field takes its default.
type KeyBounds struct {
	// Held is the most items one key's breaker holds (default 1024). An item of a key
	// that holds as many already is shed: set aside at once as an item error with a
	// [*BreakerFullError].
	Held int
	// Keys is the most keys with a breaker of their own (default 1024). A new key past
	// it takes the state of a key whose breaker is closed, holds nothing and has no
	// attempt in flight (that key's counts are forgotten); when there is none, it
	// shares one more breaker with every other such key, as the items of a stage-wide
	// breaker do, and keeps it while that breaker holds any of its items, or has let an
	// attempt of one through that has not ended (nor, held by it, been put in its
	// list), or one taken back from it is being tried: so that its items go on in order
	// under the breaker that held them (its later items are held behind them there,
	// within that breaker's Held), and every attempt's failure is held and probed by
	// the breaker that counted it. While the bound is reached, each attempt of a key
	// without a state of its own scans the keys for one: keep Keys above the keys
	// active at once.
	Keys int
}

// WithBreakerPerKey gives a stage a circuit breaker per key of its items, for a
// service that fails for some keys only (one shard of several, one tenant's backend):
// the items of a key whose breaker is open are held, out of the workers' hands, while
// the workers go on with the other keys' items. Each key's breaker follows b's rules,
// as [WithCircuitBreaker]'s does for the whole stage, over the attempts of that key's
// items; b.Counts says which failed attempts count.
//
// An item is held when its key's breaker is open (or half-open, with its probe in
// flight) as its attempt would begin, or when its attempt fails while the breaker is
// not closed (the one that opens it included): the attempt does not count as one of
// the item's, the worker takes its next item, and the held item waits in its key's
// list. Once the key's breaker lets attempts through again (half-open, after b.OpenFor
// or the Retry-After of the failure that opened it), the workers take its held items
// back, before new ones, oldest first: the first is the probe (and stays first if it
// fails); when the probes succeed the breaker closes and the rest follow. An item of
// a key that holds items is held too, last in its key's list, whatever the key's state
// (closed again, its held items not all taken back yet): no item of the key begins
// ahead of them, be it new or the retry of one that was not held. A held item starts
// its [WithRetry] attempts afresh when it is taken back. While the stage's input
// flows, a worker takes held items back between its runs of items; idle, it waits for
// the breakers too; once the input has ended, the workers stay until every held item
// is settled.
//
// Memory is bounded by bounds, and the choice at each bound is to keep the workers
// going:
//   - At most bounds.Held items held per key. An item of a key that holds as many is
//     shed, not waited for: set aside at once as an item error with a
//     [*BreakerFullError], so that [WithDeadLetter] gets it and the report counts it
//     under "*pipeline.BreakerFullError" (without a destination the run fails with
//     it). An item taken back whose probe fails is held again whatever the count, so a
//     key may hold up to one more per worker for a moment.
//   - At most bounds.Keys keys with a breaker of their own (about 1.5 KB each), plus
//     one that the keys past the bound share (see [KeyBounds]).
//
// So about (bounds.Keys + 1) × bounds.Held items are held at most.
//
// Each held item settles exactly once: processed (or dead-lettered, or failed) after it
// is taken back, shed at the bound, or not started when the run stops: the items held
// then count in the stage's NotStarted, as items still queued do, and a checkpointed
// run ([FromCheckpoint]) resumes from before them. While held, an item counts in
// NotStarted too; [StageReport].Breaker gives how many are held (Holding), the keys
// whose breaker is not closed (KeysOpen) and, per key, its state and held items
// (Keys). Its State is the worst key's (open, then half-open), and Opened and TimeOpen
// add up the keys'. A key's transitions are [Event]s of the stage as with
// WithCircuitBreaker, with the key in their Key; MaxOpen applies per key, and is checked
// when an attempt of the key is refused (at each failed probe at the latest).
//
// In a checkpointed run, a held item keeps the checkpoint from passing it. The held
// items count in the pipeline's capacity in flight, (bounds.Keys + 1) × bounds.Held
// more, which raises by as much the defaults of [WithMaxRedo] (so that the source does
// not wait for held items, at the cost of a longer redo after a crash) and of
// [WithMaxPending]. With a smaller WithMaxRedo, the source stops when it is that far
// ahead of the oldest held item, and then the healthy keys wait too.
//
// It replaces a [WithCircuitBreaker] or [WithSharedBreaker] of the stage, and a later
// one replaces it. An attempt of a closed key calls key once and takes the policy's
// lock twice for reading (a map lookup) and its key's breaker's once; a held item calls
// key once more when it is held. In must be the stage's input type;
// the stage's constructor panics otherwise, and with [WithOrdered] or [WithKey] (a held
// item would stall the order, or be taken back by another key's worker). It panics if
// key is nil, if a bound is negative, or as WithCircuitBreaker does for b.
func WithBreakerPerKey[In any, K comparable](key func(In) K, b Breaker, bounds KeyBounds) StageOption {
	if key == nil {
		panic("pipeline: WithBreakerPerKey: nil key function")
	}
	if bounds.Held < 0 || bounds.Keys < 0 {
		panic(fmt.Sprintf("pipeline: WithBreakerPerKey: negative bound in %+v", bounds))
	}
	b = b.normalized("WithBreakerPerKey")
	if bounds.Held == 0 {
		bounds.Held = 1024
	}
	if bounds.Keys == 0 {
		bounds.Keys = 1024
	}
	return stageOpt(func(c *config) {
		c.client.add(policyMaker{
			name: "WithCircuitBreaker", order: orderBreaker,
			unordered: "WithBreakerPerKey and WithOrdered together; a held item would stall the order",
			check: func(_ int, keyedBy string) string {
				if keyedBy != "" {
					return "WithBreakerPerKey and " + keyedBy + " together; a held item is taken back by whichever worker is free"
				}
				return ""
			},
			make: func(env policyEnv) policy[In] { return keyWorker[In, K]{newKeyBreakers(env, key, b, bounds), -1} },
		})
	})
}

// heldItems is the client's view of a breaker per key: it holds items out of the
// workers' hands, and gives them back once their key's breaker lets them through.
type heldItems[In any] interface {
	// park holds v (at source position pos), in worker's hands, last in its key's list
	// or, when it was held before (again), first; or returns a *BreakerFullError when
	// its key holds as many items as it may.
	park(worker int, v In, pos uint64, again bool) error
	// next returns a held item whose key's breaker lets an attempt through now, and
	// the ticket of that attempt, let through already: the item's first attempt
	// goes on from it (client.acquire), and a stop releases it (worker.release).
	// worker is the taker's index; it calls done when the item's attempts end.
	next(worker int) (v In, pos uint64, t ticket, ok bool)
	// done tells that the attempts of the item worker took back (next) have ended:
	// it is held again, or has an outcome.
	done(worker int)
	// wait waits, parked, for wake (input), for a held item that may be taken back
	// (errResume) or for the run to stop (its cause); see consumer.take's idle.
	wait(ctx context.Context, wake <-chan struct{}) (woken bool, err error)
	// holding reports whether items are held.
	holding() bool
	// drop forgets every held item (a drained budget: they stay not started).
	drop()
}

var (
	// errHeld is what a breaker per key's before returns for an attempt that its key's
	// breaker does not let through: the worker holds the item (worker.park).
	errHeld = errors.New("pipeline: held by its key's circuit breaker")
	// errResume ends a worker's wait: a held item may be taken back.
	errResume = errors.New("pipeline: a held item may go on")
)

// keyBreakers is one run's breaker per key of a stage: the keys' states, and their
// held items.
type keyBreakers[In any, K comparable] struct {
	env    policyEnv
	key    func(In) K
	cfg    Breaker
	bounds KeyBounds

	heldN  atomic.Int64 // items held now
	failed atomic.Int64 // failed attempts held rather than counted against their items

	mu      sync.RWMutex       // read-locked for an attempt's lookups
	ids     map[K]uint32       // a key's index in slots
	slots   []*keyState[In, K] // slots[0] is shared by the keys past bounds.Keys; an evicted key's slot goes to the next key
	shared  map[K]int          // each key's items held by slots[0], or under it in a worker's hands (taken): while it has any, it gets no state of its own
	taken   []takenBack[K]     // per worker: the key of its item under slots[0], counted once in shared (see pinLocked)
	holders []*keyState[In, K] // the states with held items
	turn    int                // where next looks first in holders, so that every key gets its turn
	gone    struct {           // the figures of evicted states
		opened int64
		open   time.Duration
	}

	sigMu sync.Mutex
	sig   chan struct{} // closed (and replaced) when a held item's key may let it through
}

// keyState is one key's breaker and held items.
type keyState[In any, K comparable] struct {
	b        *breakerState
	k        K
	name     string // the key as %v prints it, for the report
	id       uint32
	inflight atomic.Int32 // attempts begun and not ended (added to under keyBreakers.mu, read or write): no eviction while any
	held     []heldItem[In, K]
	first    int // held[first:] are the items held, oldest first
}

// takenBack is the key of a worker's item under the shared state, which keeps the key
// under the shared state's breaker (see pinLocked).
type takenBack[K comparable] struct {
	k      K
	shared bool // the worker has such an item
}

// keyWorker is worker id's view of a breaker per key: the policy its client calls
// (perWorker), so that the breaker knows whose attempt it admits and settles. The
// run's client, which only reports, has the one of id -1.
type keyWorker[In any, K comparable] struct {
	*keyBreakers[In, K]
	id int
}

func (p keyWorker[In, K]) worker(i int) policy[In] { return keyWorker[In, K]{p.keyBreakers, i} }

func (p keyWorker[In, K]) before(_ context.Context, v In, t ticket, _ func() error) (ticket, error) { // it never keeps a worker waiting: hold is not needed
	return p.beginAttempt(p.id, v, t)
}

func (p keyWorker[In, K]) cancel(t ticket) { p.cancelAttempt(p.id, t) }

func (p keyWorker[In, K]) after(t ticket, err error, class Class) bool {
	return p.endAttempt(p.id, t, err, class)
}

// heldItem is an item held by its key's breaker, with its key (for the shared
// state's, keyBreakers.shared).
type heldItem[In any, K comparable] struct {
	v   In
	pos uint64
	k   K
}

func newKeyBreakers[In any, K comparable](env policyEnv, key func(In) K, b Breaker, bounds KeyBounds) *keyBreakers[In, K] {
	kb := &keyBreakers[In, K]{
		env: env, key: key, cfg: b, bounds: bounds, ids: make(map[K]uint32), shared: make(map[K]int),
		slots: make([]*keyState[In, K], 1, 8), sig: make(chan struct{}), taken: make([]takenBack[K], env.workers),
	}
	kb.slots[0] = kb.newState(*new(K), "(other keys)", 0)
	// The held items are in flight: they count in the run's capacity, so that a
	// checkpointed or acknowledged source does not wait for them by default.
	env.row.extra += heldBound(bounds)
	return kb
}

// heldBound is the most items a breaker per key holds: (Keys + 1) × Held, at most 2^40
// (the largest int on 32-bit targets).
func heldBound(b KeyBounds) int {
	const most = min(1<<40, math.MaxInt)
	if b.Held > most/(b.Keys+1) {
		return most
	}
	return (b.Keys + 1) * b.Held
}

func (kb *keyBreakers[In, K]) newState(k K, name string, id uint32) *keyState[In, K] {
	ks := &keyState[In, K]{b: newBreakerState(kb.cfg), k: k, name: name, id: id}
	ks.b.notify, ks.b.key = kb.signal, name
	return ks
}

// stateLocked returns the state of key k, making one if it has none. A key with items
// held by the shared state, or under it in a worker's hands (pinLocked), keeps that
// state: with one of its own, its new items would begin ahead of them (or of a probe
// that fails, or of an attempt that fails and is held), under a breaker that never
// refused them.
func (kb *keyBreakers[In, K]) stateLocked(k K) *keyState[In, K] {
	if id, ok := kb.ids[k]; ok {
		return kb.slots[id]
	}
	if kb.shared[k] > 0 {
		return kb.slots[0]
	}
	var id uint32
	if len(kb.ids) < kb.bounds.Keys {
		id = uint32(len(kb.slots))
		kb.slots = append(kb.slots, nil)
	} else if id = kb.evictLocked(); id == 0 {
		return kb.slots[0] // every key with a state is busy: share the rest's
	}
	ks := kb.newState(k, fmt.Sprint(k), id)
	kb.slots[id], kb.ids[k] = ks, id
	return ks
}

// evictLocked drops the state of a key whose breaker is closed, holds nothing and has
// no attempt in flight, and returns its slot (0: none).
func (kb *keyBreakers[In, K]) evictLocked() uint32 {
	for k, id := range kb.ids {
		ks := kb.slots[id]
		if ks.inflight.Load() == 0 && len(ks.held) == ks.first && ks.b.closed.Load() {
			r := ks.b.report(kb.env.r.started)
			kb.gone.opened += r.Opened
			kb.gone.open += r.TimeOpen
			delete(kb.ids, k)
			return id
		}
	}
	return 0
}

// signal wakes the workers that wait for held items. Its protocol is publish before
// wait: a waiter (wait) takes the current sig first, then looks (heldN, holders and
// their breakers, under mu and each breaker's mu), then waits on that sig, a timer for
// the time-bound readiness its look found (an open key's OpenFor) and its input; every
// change that can make a look's answer earlier signals after it is made:
//   - a key's transition, a probe given back, a probe's success when more are needed
//     (breakerState.wakeLocked, under the breaker's mu);
//   - a key that begins to hold items (park, after mu): a waiter that saw nothing held,
//     or only keys not ready before a transition, has no timer for it;
//   - the last held item taken (next, under mu) and a drop: a waiter whose input ended
//     may end.
//
// An item held under a key that holds others already changes no key's readiness, and
// signals nothing. A waiter's sig is closed by the first signal after it took it, so
// a change that its look missed wakes it. A signal is never skipped when nothing is
// held: a worker may be taking a held item out and putting it back (a probe refused, a
// failed probe's item). Locks nest mu → a breaker's mu → sigMu.
func (kb *keyBreakers[In, K]) signal() {
	kb.sigMu.Lock()
	close(kb.sig)
	kb.sig = make(chan struct{})
	kb.sigMu.Unlock()
}

// beginAttempt is worker's before: it lets the attempt of v begin (its ticket) or
// refuses it (admitLocked). An attempt that the shared state admits pins its key there
// (pinLocked); a key with a state of its own has none pinned (a pinned key gets none).
func (kb *keyBreakers[In, K]) beginAttempt(worker int, v In, t ticket) (ticket, error) {
	if t.key != 0 { // a held item's first attempt: next let it through as it took the item back
		return t, nil
	}
	k := kb.key(v)
	var events []Event
	var err error
	kb.mu.RLock()
	if id, ok := kb.ids[k]; ok {
		t, err = kb.admitLocked(kb.slots[id], t, &events)
		kb.mu.RUnlock()
	} else {
		kb.mu.RUnlock()
		kb.mu.Lock()
		ks := kb.stateLocked(k)
		t, err = kb.admitLocked(ks, t, &events)
		if ks.id == 0 {
			switch {
			case err == nil:
				kb.pinLocked(worker, k)
			case !t.back && !errors.Is(err, errHeld): // MaxOpen: the item fails (held, park unpins it)
				kb.unpinLocked(worker)
			}
		}
		kb.mu.Unlock()
	}
	kb.env.emit(events)
	return t, err
}

// pinLocked notes that worker's item, of key k, is under the shared state, so that k
// keeps that state (stateLocked) until unpinLocked: from the admission of its attempt
// until the attempt ends (endAttempt, cancelAttempt), or, held by it as it fails, until
// it is parked there (park); for an item taken back from there (next), or admitted
// there in its attempts after it was taken back (ticket.back), until its attempts end
// (done). A worker pins one item at most, counted once in shared. Under mu,
// write-locked; only the worker writes its entry in taken.
func (kb *keyBreakers[In, K]) pinLocked(worker int, k K) {
	tb := &kb.taken[worker]
	if tb.shared && tb.k == k { // another attempt of the same item
		return
	}
	kb.unpinLocked(worker) // left by an item of another key that ended as the run stopped
	*tb = takenBack[K]{k: k, shared: true}
	kb.shared[k]++
}

// unpinLocked forgets worker's pinned item, if any: its key may get a state of its own
// once nothing else of it is under the shared state. Under mu, write-locked.
func (kb *keyBreakers[In, K]) unpinLocked(worker int) {
	tb := &kb.taken[worker]
	if !tb.shared {
		return
	}
	if kb.shared[tb.k]--; kb.shared[tb.k] == 0 {
		delete(kb.shared, tb.k)
	}
	*tb = takenBack[K]{}
}

// unpin is unpinLocked, for a worker that may have nothing pinned: only it writes its
// entry, so it reads it without mu.
func (kb *keyBreakers[In, K]) unpin(worker int) {
	if !kb.taken[worker].shared {
		return
	}
	kb.mu.Lock()
	kb.unpinLocked(worker)
	kb.mu.Unlock()
}

// admitLocked lets an attempt of an item of ks's key begin (its ticket), or returns
// errHeld (or a *BreakerError, MaxOpen past). An item that was not held (t.back
// false) is held while its key holds items: they go back first, the oldest as the
// probe, and it waits behind them. Under mu, read-locked at least: park and next
// (write-locked) come between no look at the held items and the breaker's answer.
func (kb *keyBreakers[In, K]) admitLocked(ks *keyState[In, K], t ticket, events *[]Event) (ticket, error) {
	if !t.back && len(ks.held) > ks.first {
		if ks.b.closed.Load() {
			return t, errHeld
		}
		ks.b.mu.Lock()
		_, _, err := ks.b.refusedLocked(time.Now(), &kb.env) // MaxOpen
		ks.b.mu.Unlock()
		return t, cmp.Or(err, errHeld)
	}
	if !ks.b.closed.Load() {
		ks.b.mu.Lock()
		ok, probe, _, _, err := ks.b.tryLocked(time.Now(), &kb.env, events)
		ks.b.mu.Unlock()
		if !ok {
			return t, cmp.Or(err, errHeld)
		}
		t.probe = probe
	}
	ks.inflight.Add(1) // under mu: an eviction (write-locked) sees it
	t.key = ks.id + 1
	return t, nil
}

// end ends the attempt of ticket t and returns its key's state. The state may be
// evicted from then on; what the caller still tells it is forgotten with it.
func (kb *keyBreakers[In, K]) end(t ticket) *keyState[In, K] {
	kb.mu.RLock()
	ks := kb.slots[t.key-1] // not evicted: its attempt was in flight
	kb.mu.RUnlock()
	ks.inflight.Add(-1)
	return ks
}

// cancelAttempt is worker's cancel: the attempt of ticket t will not begin, or will
// not be settled; the item's attempts end with it (a taken back item's at done).
func (kb *keyBreakers[In, K]) cancelAttempt(worker int, t ticket) {
	if t.key == 0 {
		return
	}
	ks := kb.end(t)
	ks.b.cancelProbe(t.probe)
	if ks.id == 0 && !t.back {
		kb.unpin(worker)
	}
}

// endAttempt is worker's after: the attempt's outcome goes to the state that admitted
// it (t.key), which reports whether the item is held. An item held by the shared
// state stays pinned there until it is parked (its next before finds its key there);
// otherwise its next attempt, if any, goes to its key's state then.
func (kb *keyBreakers[In, K]) endAttempt(worker int, t ticket, err error, class Class) bool {
	if t.key == 0 {
		return false
	}
	ks := kb.end(t)
	held := ks.b.after(t.probe, err, class, &kb.env)
	if held {
		kb.failed.Add(1)
	}
	if ks.id == 0 && !held && !t.back {
		kb.unpin(worker)
	}
	return held
}

func (kb *keyBreakers[In, K]) park(worker int, v In, pos uint64, again bool) error {
	k := kb.key(v)
	kb.mu.Lock()
	// The key's state now. It is the one that refused the item (before, or as its
	// attempt failed), unless that was a state of the key's own, evicted since (closed
	// by another attempt, holding nothing, none in flight: nothing of the key is left
	// in it), or the shared one, and a state of the key's own came free since (nothing
	// of the key under the shared one: an item the shared one held as its attempt
	// failed keeps its key pinned there, pinLocked). Either way the item goes where
	// the key's later items go, and no item of the key is held elsewhere.
	ks := kb.stateLocked(k)
	if n := len(ks.held) - ks.first; n >= kb.bounds.Held && !again { // one held again takes back its room
		kb.unpinLocked(worker) // shed: its attempts end
		kb.mu.Unlock()
		return &BreakerFullError{Stage: kb.env.stage, Key: ks.name, Held: n}
	}
	newHolder := len(ks.held) == ks.first
	if newHolder {
		kb.holders = append(kb.holders, ks)
	}
	ks.put(heldItem[In, K]{v: v, pos: pos, k: k}, again)
	if ks.id == 0 {
		kb.shared[k]++
	}
	if !again { // held now, counted above in its stead (one taken back: at done)
		kb.unpinLocked(worker)
	}
	kb.heldN.Add(1)
	kb.mu.Unlock()
	// A key that begins to hold: the waiters may have looked before (see signal). One
	// that closed meanwhile: its item may go on at once.
	if newHolder || ks.b.closed.Load() {
		kb.signal()
	}
	return nil
}

func (kb *keyBreakers[In, K]) holding() bool { return kb.heldN.Load() > 0 }

func (kb *keyBreakers[In, K]) drop() {
	kb.mu.Lock()
	defer kb.mu.Unlock()
	for _, ks := range kb.holders {
		clear(ks.held)
		ks.held, ks.first = nil, 0
	}
	kb.holders = nil
	clear(kb.shared)
	for _, tb := range kb.taken { // the items in the workers' hands are still the shared state's
		if tb.shared {
			kb.shared[tb.k]++
		}
	}
	kb.heldN.Store(0)
	kb.signal()
}

// put adds h to ks's held items: last or, held again, first.
func (ks *keyState[In, K]) put(h heldItem[In, K], again bool) {
	switch {
	case again && ks.first > 0: // a failed probe's item stays the oldest
		ks.first--
		ks.held[ks.first] = h
	case again:
		ks.held = slices.Insert(ks.held, 0, h)
	default:
		if ks.first > 0 && len(ks.held) == cap(ks.held) { // slide down rather than grow
			n := copy(ks.held, ks.held[ks.first:])
			clear(ks.held[n:])
			ks.held, ks.first = ks.held[:n], 0
		}
		ks.held = append(ks.held, h)
	}
}

// take removes and returns ks's oldest held item; it reports whether ks holds no more.
func (ks *keyState[In, K]) take() (h heldItem[In, K], empty bool) {
	h = ks.held[ks.first]
	ks.held[ks.first] = heldItem[In, K]{}
	ks.first++
	if ks.first == len(ks.held) { // none left: forget the list (its memory too, when it grew big)
		ks.first, ks.held = 0, ks.held[:0]
		if cap(ks.held) > 64 {
			ks.held = nil
		}
		return h, true
	}
	return h, false
}

func (kb *keyBreakers[In, K]) next(worker int) (v In, pos uint64, t ticket, ok bool) {
	if kb.heldN.Load() == 0 {
		return v, 0, t, false
	}
	var events []Event
	kb.mu.Lock()
	ks, t := kb.takeLocked(time.Now(), &events)
	if ks != nil {
		h, empty := ks.take()
		if ks.id == 0 { // still the key's in shared until done
			kb.unpinLocked(worker) // left by an item that ended as the run stopped
			kb.taken[worker] = takenBack[K]{k: h.k, shared: true}
		}
		if empty {
			kb.holders = slices.DeleteFunc(kb.holders, func(o *keyState[In, K]) bool { return o == ks })
		}
		if kb.heldN.Add(-1) == 0 {
			kb.signal() // the workers waiting for held items may end (under mu: sigMu nests inside it, as under a breaker's mu)
		}
		v, pos, ok = h.v, h.pos, true
	}
	kb.mu.Unlock()
	kb.env.emit(events)
	return v, pos, t, ok
}

func (kb *keyBreakers[In, K]) done(worker int) { kb.unpin(worker) }

// takeLocked returns a state with held items whose breaker lets an attempt through
// now, taking the keys in turn, and the ticket of that attempt, let through as the
// item is taken (so that no item of the key that was not held comes between); or nil.
func (kb *keyBreakers[In, K]) takeLocked(now time.Time, events *[]Event) (*keyState[In, K], ticket) {
	n := len(kb.holders)
	for i := range n {
		ks := kb.holders[(kb.turn+i)%n]
		ks.b.mu.Lock()
		ok, _ := ks.b.readyLocked(now)
		var probe bool
		if ok { // so try lets it through: at now, under the same lock
			_, probe, _, _, _ = ks.b.tryLocked(now, &kb.env, events)
		}
		ks.b.mu.Unlock()
		if ok {
			kb.turn = (kb.turn + i + 1) % n
			ks.inflight.Add(1)
			return ks, ticket{probe: probe, back: true, key: ks.id + 1}
		}
	}
	return nil, ticket{}
}

// untilReady returns how long until a held item's key may let it through (0: now;
// MaxInt64: not before a transition), and whether any item is held.
func (kb *keyBreakers[In, K]) untilReady() (time.Duration, bool) {
	kb.mu.Lock()
	defer kb.mu.Unlock()
	now := time.Now()
	wake := time.Duration(math.MaxInt64)
	for _, ks := range kb.holders {
		ks.b.mu.Lock()
		ok, d := ks.b.readyLocked(now)
		ks.b.mu.Unlock()
		if ok {
			return 0, true
		}
		wake = min(wake, d)
	}
	return wake, len(kb.holders) > 0
}

// wait waits for an item on wake (nil: the input ended), or for a held item that may
// be taken back (errResume). With nothing held and no input to wait for it returns
// errResume at once, for the caller to look again (and end).
func (kb *keyBreakers[In, K]) wait(ctx context.Context, wake <-chan struct{}) (bool, error) {
	if ctx.Err() != nil { // resume takes nothing back once the run stops: a key ready now would have the worker look again for ever
		return false, context.Cause(ctx)
	}
	// Publish before wait (see signal): sig first, then the look. A worker that finds
	// nothing held waits on sig too, for an item held after its look.
	kb.sigMu.Lock()
	sig := kb.sig
	kb.sigMu.Unlock()
	var timeout <-chan time.Time
	if kb.heldN.Load() == 0 {
		if wake == nil {
			return false, errResume
		}
	} else {
		d, held := kb.untilReady()
		if d == 0 || !held && wake == nil { // none held now: the last was taken before the look
			return false, errResume
		}
		if d < time.Duration(math.MaxInt64) { // else not before a transition, whose signal wakes us
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
	}
	select {
	case <-wake:
		return true, nil
	case <-sig:
	case <-timeout:
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
	return false, errResume
}

func (kb *keyBreakers[In, K]) fill(s *StageReport) {
	rep := &BreakerReport{PerKey: true, Held: kb.failed.Load(), Holding: kb.heldN.Load()}
	kb.mu.Lock()
	rep.Opened, rep.TimeOpen = kb.gone.opened, kb.gone.open
	for _, ks := range kb.slots {
		if ks == nil {
			continue
		}
		r := ks.b.report(kb.env.r.started)
		rep.Opened += r.Opened
		rep.TimeOpen += r.TimeOpen
		held := len(ks.held) - ks.first
		if r.State != BreakerClosed {
			rep.KeysOpen++
			if rep.State == BreakerClosed || r.State == BreakerOpen {
				rep.State = r.State
			}
		}
		if r.State != BreakerClosed || held > 0 {
			rep.Keys = append(rep.Keys, KeyBreakerReport{Key: ks.name, State: r.State, Holding: held, Opened: r.Opened})
		}
	}
	kb.mu.Unlock()
	slices.SortFunc(rep.Keys, func(a, b KeyBreakerReport) int {
		return cmp.Or(cmp.Compare(b.Holding, a.Holding), cmp.Compare(a.Key, b.Key))
	})
	if len(rep.Keys) > breakerKeysShown {
		rep.Keys = rep.Keys[:breakerKeysShown]
	}
	s.Breaker = rep
}

// breakerKeysShown is how many keys a report of a breaker per key lists.
const breakerKeysShown = 16

// KeyBreakerReport is the account of one key's circuit breaker ([WithBreakerPerKey]).
type KeyBreakerReport struct {
	Key     string // as fmt's %v prints it; "(other keys)" for the breaker the keys past KeyBounds.Keys share
	State   BreakerState
	Holding int   // items held now
	Opened  int64 // times it opened
}

// park is attempts' ending for an item whose key's breaker holds it (errHeld): held,
// or shed at its key's bound (a *BreakerFullError, set aside as an item error).
func (w *worker[In, Out]) park(ctx context.Context, v In, attempts int, first error) (outcome, error) {
	if err := w.cl.keyed.park(w.id, v, w.pos, w.again); err != nil {
		return w.setAside(ctx, v, attempts, ClassItem, cmp.Or(first, err), err) // deadletter.go
	}
	return held, nil
}

// keepsHeld reports whether the stage's breaker per key holds items to take back. A
// drained budget starts no new item: the held ones are dropped, not started.
func (w *worker[In, Out]) keepsHeld() bool {
	if w.row.drain.Load() {
		w.cl.keyed.drop()
		return false
	}
	return w.cl.keyed.holding()
}

// resume takes back held items whose key's breaker lets them through (a breaker per
// key), up to a run's worth, before the worker takes new items: each goes through its
// attempts and ends in end, as an item of a run does.
func (w *worker[In, Out]) resume(ctx context.Context) error {
	hs := w.cl.keyed
	if !w.keepsHeld() {
		return nil
	}
	n := 0
	for ; n < w.runMax && w.r.ctx.Err() == nil; n++ {
		if n > 0 && w.row.drain.Load() { // a drained budget: start no held item either
			hs.drop()
			break
		}
		v, pos, tk, ok := hs.next(w.id)
		if !ok {
			break
		}
		w.tk, w.ticketed = tk, true // its attempt is let through: attempts goes on from it
		if n == 0 {
			w.stats.busy.v.Store(1)
			w.tick()
		}
		w.pos = pos
		_ = w.end(resumed, nil, 1, nil)
		w.inHand = true
		if w.hand != nil {
			w.hand.last = true // its output goes at once
		}
		var out Out
		w.again = true
		o, err := w.attempts(ctx, v, &out, nil)
		w.again = false
		hs.done(w.id) // held again, or an outcome
		if err = w.end(o, &out, 1, err); err != nil {
			w.publish()
			w.stats.busy.v.Store(0)
			return err
		}
	}
	if n == 0 {
		return nil
	}
	w.publish()
	w.stats.busy.v.Store(0)
	if w.out.flush != nil {
		return w.out.flush()
	}
	return nil
}
