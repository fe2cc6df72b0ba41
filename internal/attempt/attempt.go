// Package attempt holds the machinery of the root package's WithTimeout: the context
// of each attempt of a stage function (Ctx), the per-worker clock its contexts share
// (Clock), and the watcher of attempts that outlive their timeout (Watch). It knows
// nothing of items, stages or runs: a worker begins an attempt on its clock, finishes
// it, and publishes the end of its attempts between runs of items and before it waits.
package attempt

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Ctx is the context of one attempt under the root package's WithTimeout. context.WithTimeout costs
// a timer, a channel and several allocations per call, whether or not the function ever
// looks at its context; this one costs one byte of a slab of 256 (576 bytes per 256
// attempts, with room for the epochs of up to eight runs of them, and no pointer per
// attempt for the collector to follow) and no locked instruction when the function
// does not look at it. Its start is the worker's last
// clock reading (taken once per run of items, and after each timed attempt), checked
// when the function first looks at its context (Done, Err, Deadline): a reading more
// than staleStart old is replaced by that moment's. Its lock, channel and timer are made
// only when the function looks.
//
// Every attempt gets a context of its own, never reused: a function may hand its
// context to a goroutine that outlives the attempt, which must see it canceled, and
// nothing of a later attempt. A context looked at during its attempt is canceled when
// the attempt returns; one first looked at after that is canceled from the moment the
// worker publishes the end of its attempts (Clock.Publish: at the end of each run
// of items and before the worker waits), and never later than its deadline.
//
// An Ctx lives in the slots of an attemptSlab, which holds what its attempts
// share; a context finds its slab from its own address and index (slab), and its epoch
// from its index (epoch).
type Ctx struct {
	i uint8 // its index in the slab's slots
}

// The slots and epochs of a slab. A slab of 64 slots of two bytes (the index and the
// epoch's, which each new epoch set in the slots past the latest) and four epochs was
// 288 bytes per 64 attempts: its allocation was about 3 % of S5 3x4's middleware's CPU
// time, 150 ns a slab. One of 256 is 576 bytes, allocated a quarter as often.
const (
	slabSlots  = 256 // at most 256: a slot's index is a byte
	slabEpochs = 8
)

// attemptSlab holds the contexts of up to 256 consecutive attempts of one worker.
type attemptSlab struct {
	clk   *Clock
	n0    uint64                     // the number of slots[0]'s attempt in the worker
	eps   [slabEpochs]attemptEpoch   // the epochs of its attempts, in place (a new slab when they run out)
	neps  int                        // the worker's alone: a context finds its epoch by eps' start
	armed atomic.Pointer[armedTable] // per slot, made at the first look at one
	slots [slabSlots]Ctx
}

// armedTable is a slab's armed parts, one per slot.
type armedTable [slabSlots]atomic.Pointer[armedCtx]

// freshSlots are a new slab's slots: each with its index. A new slab's are a copy, not
// a loop over them (S5 3x4's middleware: 18 instructions per item).
var freshSlots = func() (s [slabSlots]Ctx) {
	for j := range s {
		s[j].i = uint8(j)
	}
	return s
}()

// slab returns the slab c is a slot of.
func (c *Ctx) slab() *attemptSlab {
	off := unsafe.Offsetof(attemptSlab{}.slots) + uintptr(c.i)*unsafe.Sizeof(Ctx{})
	return (*attemptSlab)(unsafe.Add(unsafe.Pointer(c), -int(off)))
}

// epoch returns what c's attempt shares with the attempts begun at the same clock
// reading: the latest of its slab's epochs begun by its slot. Those begun after its
// slot was handed out start past it; their start is read atomically, the rest of an
// epoch only once its start (or, for the first, the slot) was.
func (c *Ctx) epoch() *attemptEpoch {
	s := c.slab()
	e := 0
	for e+1 < len(s.eps) {
		if st := s.eps[e+1].start.Load(); st == 0 || st-1 > uint32(c.i) {
			break
		}
		e++
	}
	return &s.eps[e]
}

// slot returns where c's armed part is kept, making the slab's table of them if asked.
func (c *Ctx) slot(create bool) *atomic.Pointer[armedCtx] {
	s := c.slab()
	t := s.armed.Load()
	if t == nil {
		if !create {
			return nil
		}
		s.armed.CompareAndSwap(nil, new(armedTable))
		t = s.armed.Load()
	}
	return &t[c.i]
}

// Clock is what the attempt contexts of one worker share; make it with [NewClock]. A
// worker without a timeout has a nil Clock, whose Publish does nothing.
type Clock struct {
	ended atomic.Uint64 // attempts numbered below it have returned (published)
	// Looks is set when an attempt context is looked at, and cleared by Publish: the
	// worker calls [Ctx.Finish] only while it is set. It is a field, not a method: the
	// root package's generic worker is compiled in the packages that instantiate it,
	// and there a method of this package was a call per attempt, not inlined.
	Looks atomic.Bool
	// What the stuck-attempt watcher (Watch) reads: told is the attempts begun,
	// stored by the first begin after each publish and after each ask (the watcher sets
	// Ask). Per attempt that is one atomic load; per run of items one store, and two
	// more once per watcher period.
	Ask  atomic.Bool
	told atomic.Uint64
	// The common case of Begin, an attempt with the latest Begin's clock reading (Now,
	// -1 after a publish, so that a run's first attempt tells the watcher; the worker
	// sets it to -1 too) and parent (Parent), with room in the slab (I < len(Slots)),
	// while the watcher does not ask: the worker takes Slots[I] and counts it in I,
	// inline (the root package's nextAttempt, for the reason Looks is a field). A slot
	// past I is of the latest epoch once taken: nothing is written in it.
	Now    time.Duration
	Parent context.Context // the latest epoch's parent
	I      int             // the next slot of slab
	Slots  *[slabSlots]Ctx // slab's slots
	said   bool            // told is current since the last publish (the worker's alone, as are the fields below)
	slab   *attemptSlab
	fi     int           // the first slot begun since the last publish
	ep     *attemptEpoch // the latest attempts' epoch, in slab
	span   time.Duration // how far apart clock readings may be for attempts to share an epoch
	// Fixed when the clock is made, so that the contexts read them from any goroutine:
	base time.Time     // what clock readings are offsets from (the run's start, with its monotonic reading)
	d    time.Duration // the timeout of every attempt
}

// NewClock returns the clock of one worker in one run, whose attempts have timeout d
// and whose clock readings are offsets from base (the run's start), and whose runs of
// items take about span (the root package's runBudget): attempts begun at clock
// readings less than span apart share an epoch.
func NewClock(span time.Duration, base time.Time, d time.Duration) *Clock {
	return &Clock{span: span, base: base, d: d, Now: -1} // no reading is -1: the fast path declines until Begin
}

// attemptEpoch is what the attempts of a slab begun at one clock reading with one
// parent share.
type attemptEpoch struct {
	parent context.Context
	due    time.Duration // the deadline, as an offset from the clock's base (estimated: from a clock reading)
	// start is 1 + the index of the epoch's first slot, stored after the fields above
	// and before that slot is handed out; 0 until then, and for a slab's first epoch,
	// which starts at slot 0 (epoch).
	start atomic.Uint32
	guess bool // due is estimated: fix it when the function first looks (armedCtx.due)
}

// staleStart is how old the worker's clock reading may be for an attempt to take it
// as its start.
const staleStart = time.Millisecond

// armedCtx is the part of an Ctx that only a function that looks at its context
// needs.
type armedCtx struct {
	due        time.Duration // the deadline, fixed when the function first looked
	mu         sync.Mutex
	done       chan struct{}
	err        error
	timer      *time.Timer
	stopParent func() bool
}

// Begin returns the context of the worker's next attempt, of at most the clock's
// timeout from about offset now from its base (the worker's last clock reading: no
// clock read until the function looks).
//
// Attempts share an epoch while the worker's clock readings are within span (a run's
// budget) of each other: each then starts at most that much earlier than it did. Most
// attempts do not come here: one with the latest Begin's reading and parent is the
// worker's inline fast path (see Now). Of the rest, an attempt of the latest epoch with
// room in the slab calls nothing; a new epoch or slab is begin's. (In one function, the
// registers were spilled around begin's calls on every attempt: about 17
// instructions.) Parent and Slots change only with the epoch and the slab: begin sets
// them.
func (k *Clock) Begin(parent context.Context, now time.Duration) *Ctx {
	if ep := k.ep; ep == nil || now-(ep.due-k.d) > k.span || !SameContext(&ep.parent, parent) || k.I == len(k.slab.slots) {
		k.begin(parent, now)
	}
	c := &k.Slots[k.I]
	k.I++
	if asked := k.Ask.Load(); !k.said || asked { // the first attempt of a run, or the watcher asks: an ordinary load
		k.tell(asked)
	}
	k.Now = now
	return c
}

// begin makes the epoch, and if need be the slab, of the next attempt: k.ep is then
// the latest epoch, in k.slab, which has room.
func (k *Clock) begin(parent context.Context, now time.Duration) {
	// An epoch is made in place in the slab (one allocated apart per run of attempts
	// was S5 3x4's middleware 0.075 allocations per item), and its parent compared by
	// its words (an interface comparison is a call).
	ep, s, d := k.ep, k.slab, k.d
	fresh := ep == nil || now-(ep.due-d) > k.span || !SameContext(&ep.parent, parent)
	if s == nil || k.I == len(s.slots) || fresh && s.neps == len(s.eps) {
		k.Publish() // what publish looks through stays in one slab
		s = &attemptSlab{clk: k, n0: k.begun(), slots: freshSlots}
		k.slab, k.Slots, k.I, k.fi = s, &s.slots, 0, 0
		if !fresh { // the latest epoch goes on in the new slab
			e := &s.eps[0]
			e.parent, e.due, e.guess = ep.parent, ep.due, ep.guess
			s.neps = 1
			k.ep = e
		}
	}
	if fresh {
		e := &s.eps[s.neps]
		e.parent, e.due, e.guess = parent, now+d, true
		if s.neps > 0 { // not the slab's first: k.I < 255 (the slab has room), and its slots are the ones from k.I on
			e.start.Store(uint32(k.I) + 1)
		}
		s.neps++
		k.ep, k.Parent = e, parent
	}
}

// begun returns the attempts begun: those of the slabs before, and the current one's.
func (k *Clock) begun() uint64 {
	if k.slab == nil {
		return 0
	}
	return k.slab.n0 + uint64(k.I)
}

// tell stores the attempts begun for the stuck-attempt watcher.
//
//go:noinline
func (k *Clock) tell(asked bool) {
	k.told.Store(k.begun())
	k.said = true
	if asked {
		k.Ask.Store(false)
	}
}

// SameContext reports whether a and b are the same context value by the two words of
// each interface: exact for the pointers every context of a run is, and at worst false
// for two equal values boxed apart, which only makes begin start a new epoch.
//
// The words are compared one by one: compared as one [2]unsafe.Pointer, the arrays went
// through runtime.memequal, a call of about 40 instructions (S5 3x4's middleware: 78
// per item by callgrind).
func SameContext(a *context.Context, b context.Context) bool {
	wa, wb := (*[2]unsafe.Pointer)(unsafe.Pointer(a)), (*[2]unsafe.Pointer)(unsafe.Pointer(&b))
	return wa[0] == wb[0] && wa[1] == wb[1]
}

// Publish tells every context of the attempts begun so far that its attempt returned
// (the worker calls it between attempts): a context first looked at after its attempt
// returned is canceled now.
func (k *Clock) Publish() {
	if k == nil || k.fi == k.I {
		return
	}
	// An arm stores Looks before it reads ended; publish stores ended before it reads
	// Looks: one of them sees the other, and cancels the context (endArmed is
	// idempotent).
	k.ended.Store(k.begun())
	k.said, k.Now = false, -1
	if k.Looks.Load() && k.Looks.Swap(false) {
		if t := k.slab.armed.Load(); t != nil {
			for j := k.fi; j < k.I; j++ {
				if a := t[j].Load(); a != nil {
					k.slab.slots[j].endArmed(a)
				}
			}
		}
	}
	k.fi = k.I
}

// New returns a context of its own for one attempt of at most d from now
// (tests, and callers outside a worker); end it with End.
func New(parent context.Context, base time.Time, d time.Duration) *Ctx {
	k := NewClock(0, base, d)
	c := k.Begin(parent, time.Since(base))
	c.epoch().guess = false // read from the clock just now
	return c
}

// over reports whether the attempt returned, as published.
func (c *Ctx) over() bool {
	s := c.slab()
	return s.n0+uint64(c.i) < s.clk.ended.Load()
}

// fixDue returns the deadline of an attempt whose function looks at it for the first
// time, as an offset from base: the estimate, unless the clock reading it came from is
// stale, then now.
func (c *Ctx) fixDue() time.Duration {
	s := c.slab()
	ep := c.epoch()
	if !ep.guess {
		return ep.due
	}
	if now := time.Since(s.clk.base); now-(ep.due-s.clk.d) > staleStart {
		return now + s.clk.d
	}
	return ep.due
}

// arm returns the armed part, making it on the first look. A context whose attempt had
// returned before anyone looked gets one canceled for good, with the estimated deadline:
// whichever look comes first, every look sees the same context.
func (c *Ctx) arm() *armedCtx {
	if p := c.slot(false); p != nil {
		if a := p.Load(); a != nil {
			return a
		}
	}
	p := c.slot(true)
	if c.over() {
		p.CompareAndSwap(nil, &armedCtx{due: c.epoch().due, done: closedChan, err: context.Canceled})
		return p.Load()
	}
	if !p.CompareAndSwap(nil, &armedCtx{due: c.fixDue()}) {
		return p.Load()
	}
	a := p.Load()
	c.slab().clk.Looks.Store(true)
	if c.over() { // it returned meanwhile, unpublished when publish read Looks
		c.endArmed(a)
	}
	return a
}

// deadline returns the deadline as an offset from base (the estimate, for a context
// first looked at after its attempt returned).
func (c *Ctx) deadline() time.Duration { return c.arm().due }

// looked reports whether the function looked at its context.
func (c *Ctx) looked() bool {
	p := c.slot(false)
	return p != nil && p.Load() != nil
}

// expired reports whether the deadline has passed.
func (c *Ctx) expired() bool { return time.Since(c.slab().clk.base) >= c.deadline() }

// Deadline implements context.Context.
func (c *Ctx) Deadline() (time.Time, bool) {
	ep := c.epoch()
	deadline := c.slab().clk.base.Add(c.deadline())
	if d, ok := ep.parent.Deadline(); ok && d.Before(deadline) {
		return d, true
	}
	return deadline, true
}

// Value implements context.Context.
func (c *Ctx) Value(key any) any { return c.epoch().parent.Value(key) }

// Done implements context.Context: the channel (and the timer that closes it) is made on
// the first call.
func (c *Ctx) Done() <-chan struct{} {
	a := c.arm()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done != nil {
		return a.done
	}
	a.done = make(chan struct{})
	if c.expireLocked(a); a.err != nil { // closed it
		return a.done
	}
	ep := c.epoch()
	parent := ep.parent
	a.timer = time.AfterFunc(a.due-time.Since(c.slab().clk.base), func() { c.cancel(a, context.DeadlineExceeded) })
	a.stopParent = context.AfterFunc(parent, func() { c.cancel(a, parent.Err()) })
	return a.done
}

// closedChan is the Done channel of every attempt context that ended before anyone
// asked for it.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Err implements context.Context.
func (c *Ctx) Err() error {
	a := c.arm()
	a.mu.Lock()
	defer a.mu.Unlock()
	c.expireLocked(a)
	return a.err
}

// expireLocked sets a.err if the parent is done or the deadline has passed, and then
// closes Done's channel if it was made: Err is non-nil only once Done is closed.
func (c *Ctx) expireLocked(a *armedCtx) {
	if a.err == nil {
		ep := c.epoch()
		if err := ep.parent.Err(); err != nil {
			a.err = err
		} else if time.Since(c.slab().clk.base) >= a.due {
			a.err = context.DeadlineExceeded
		}
	}
	if a.err != nil && a.done != nil {
		select {
		case <-a.done:
		default:
			close(a.done)
		}
	}
}

func (c *Ctx) cancel(a *armedCtx, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil {
		a.err = err
	}
	c.expireLocked(a)
}

// Finish is the worker's end of an attempt: a context looked at during it is canceled
// now (and its timer stopped), any other when the worker next publishes. The worker
// calls it only when its clock's Looks is set: a look stores Looks before the function
// returns, and a look from another goroutine that the worker's load misses is one
// after the attempt returned, which the next publish sees (one load per attempt that
// nobody looked at, instead of finding its slot).
func (c *Ctx) Finish() {
	if p := c.slot(false); p != nil {
		if a := p.Load(); a != nil {
			c.endArmed(a)
		}
	}
}

// End ends the attempt of a context made by [New], at once.
func (c *Ctx) End() {
	c.Finish()
	c.slab().clk.Publish()
}

// endArmed cancels a looked-at context whose attempt returned, and stops its timer.
func (c *Ctx) endArmed(a *armedCtx) {
	c.cancel(a, context.Canceled)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.stopParent != nil {
		a.stopParent()
	}
}

// TimedOut reports whether the attempt's deadline had passed while its parent was not
// done: the attempt's error is then a timeout. A function that never looked at its
// context (Done, Err, Deadline) did not see the deadline: its error is its own.
func (c *Ctx) TimedOut() bool {
	return c.looked() && c.epoch().parent.Err() == nil && c.expired()
}

// Watch finds the attempts of a stage with WithTimeout that outlive their
// timeout: a function that ignores its context holds its worker, and the run, for as
// long as it runs. One goroutine per such stage and run ticks every period (a quarter of
// the timeout, at least a millisecond) until the stage's workers have all exited: on,
// after the run is canceled, for as long as an attempt holds its worker.
//
// It learns what a worker does from what its attempt clock publishes: ended (the
// attempts returned, at the end of each run of items and before each wait) and told
// (the attempts begun, stored by the first attempt begun after each publish and by the
// first one begun after the watcher asks). A tick that finds its last ask unanswered knows that
// the worker has begun no attempt since; if what it had begun by its last answer has not
// all returned (ended < told), the worker is still in the run of that answer, which it
// publishes before it waits for anything: it is in its latest attempt, begun before the
// ask. The age is then at least the time since the ask, and less than a period more
// (the worker answered after the ask before).
type Watch struct {
	d       time.Duration // the stage's timeout
	period  time.Duration
	started time.Time // the run's start
	ws      []watched
}

// watched is what the watcher knows of one worker.
type watched struct {
	k        *Clock
	asked    time.Duration // when the watcher last asked, from the run's start
	told     uint64        // the attempts begun by the worker's last answer
	reported uint64        // told when its latest attempt was reported stuck
	since    atomic.Int64  // 1 + asked while the worker's latest attempt has run since then; 0 otherwise
}

// stuckAfter returns the period of the watcher of a stage with timeout d, and the age at
// which an attempt is reported stuck: the first whole number of periods past d (5 for d
// >= 4 ms). The watcher sees an age of that many periods between after and after+period
// from the attempt's start (1¼ to 1½ × d for d >= 4 ms).
func stuckAfter(d time.Duration) (period, after time.Duration) {
	period = max(d/4, time.Millisecond)
	return period, (d/period + 1) * period
}

// NewWatch returns the watcher of a stage's worker clocks.
func NewWatch(d time.Duration, started time.Time, ks []*Clock) *Watch {
	period, _ := stuckAfter(d)
	a := &Watch{d: d, period: period, started: started, ws: make([]watched, len(ks))}
	for i, k := range ks {
		a.ws[i].k = k
	}
	return a
}

// Run ticks until stop is closed, calling report for each attempt found stuck (once per
// attempt). It ignores the run's cancellation on purpose: a stuck attempt outlives it.
func (a *Watch) Run(stop <-chan struct{}, report func(age time.Duration)) {
	t := time.NewTicker(a.period)
	defer t.Stop()
	defer func() {
		for i := range a.ws {
			a.ws[i].since.Store(0) // the workers have exited: no attempt runs
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			a.tick(time.Since(a.started), report)
		}
	}
}

// tick looks at every worker at now (from the run's start).
func (a *Watch) tick(now time.Duration, report func(age time.Duration)) {
	_, after := stuckAfter(a.d)
	for i := range a.ws {
		w := &a.ws[i]
		if !w.k.Ask.Swap(true) { // answered (an attempt was begun since the last ask): ask again
			w.told = w.k.told.Load()
			w.asked = now
			w.since.Store(0)
			continue
		}
		if w.k.ended.Load() >= w.told { // what it had begun returned: idle, or between runs
			w.since.Store(0)
			continue
		}
		w.since.Store(int64(w.asked) + 1)
		if age := now - w.asked; age >= after && w.reported != w.told {
			w.reported = w.told
			report(age)
		}
	}
}

// Oldest returns the age of the stage's oldest attempt the watcher knows to have run for
// a period or more, at now from the run's start; 0 when none.
func (a *Watch) Oldest(now time.Duration) time.Duration {
	var age time.Duration
	for i := range a.ws {
		if s := a.ws[i].since.Load(); s != 0 {
			age = max(age, now-time.Duration(s-1))
		}
	}
	return age
}
