package pipeline

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gopipeline/pipeline/internal/retryafter"
)

// Outcome is the fate of an item of an acknowledged source ([FromAcked]), told once to
// the item's settle callback.
type Outcome uint8

const (
	// NotProcessed means the run stopped (it failed, was canceled, or a budget drained it)
	// before every item derived from the source item settled. Some of its effects may be
	// committed, others not: hand the item to another consumer, which must be idempotent.
	NotProcessed Outcome = iota
	// Committed means every item derived from the source item (through flat-maps, tees,
	// batches and ordered stages) was committed by a sink, or filtered out.
	Committed
	// DeadLettered means every derived item settled, and at least one was set aside by a
	// stage's dead-letter destination, which accepted it. Settlement.DeadLetter is the
	// record of the first one.
	DeadLettered
	// HandedBack means every derived item settled, and a stage with [WithHandBack] gave at
	// least one back to the source, to be delivered again after Settlement.Delay.
	// It wins over DeadLettered: the source item is redone as a whole.
	HandedBack
)

// String returns the outcome's name: "not processed", "committed", "dead-lettered" or
// "handed back".
func (o Outcome) String() string { return enumName("Outcome", outcomeNames[:], o) }

var outcomeNames = [...]string{
	NotProcessed: "not processed", Committed: "committed", DeadLettered: "dead-lettered", HandedBack: "handed back",
}

// Settlement is what an acknowledged source ([FromAcked]) learns about one of its items
// when the item's fate is known.
type Settlement struct {
	Outcome Outcome
	// DeadLetter is, for DeadLettered and HandedBack, the record of the derived item
	// that was set aside (the first one, when several were), without the item itself:
	// the source still holds the original.
	DeadLetter DeadLetter[struct{}]
	// Delay is, for HandedBack, how long the source should wait before delivering the
	// item again: the stage's [Backoff] for the attempts it made (0 without one), or the
	// longer delay the error asked for with [RetryAfter].
	Delay time.Duration
}

// AckOption configures an acknowledged source: [FromAcked]. The options:
// [WithMaxPending], [WithLag] and [WithName].
type AckOption interface{ ackOption(*config) }

type ackOpt func(*config)

func (f ackOpt) ackOption(c *config) { f(c) }

func (o NameOption) ackOption(c *config) { c.name = o.name }

// WithMaxPending bounds the items of an acknowledged source ([FromAcked]) that are
// emitted and not yet settled: emit blocks while n are, and the batches downstream
// flush what they hold meanwhile, so that memory stays bounded whatever the stages do
// and a broker sees at most n unacknowledged messages from this run (its own limit,
// such as a consumer's max ack pending, should be at least n, or the source waits on
// the broker with items in a batch: give such a Batch a [WithLinger]). The default is
// the pipeline's capacity in flight: the sum, over its stages, of queue size, workers,
// reorder window and partial batch. It panics if n < 1.
func WithMaxPending(n int) AckOption {
	if n < 1 {
		panic(fmt.Sprintf("pipeline: WithMaxPending(%d): need at least 1", n))
	}
	// The bound shares its field with WithMaxRedo: a pipeline has one tracked source.
	return ackOpt(func(c *config) { c.maxRedo = n })
}

// WithHandBack makes a stage give an item of an acknowledged source ([FromAcked]) back
// to the source when its error is [ClassTransient] and its attempts are spent
// ([WithRetry]'s count, 1 without it), instead of dead-lettering it or stopping the
// run: the source item settles as [HandedBack], its delay the stage's backoff for the
// attempts made (or the longer delay a [RetryAfter] error asks), so that a broker
// delivers it again later and no worker waits meanwhile. With WithRetry(1, backoff),
// every transient error is handed back at once. The report counts a handed-back item
// as dead-lettered in the stage's row (it was set aside: to its source), with its error
// among the causes, so that In = Succeeded + DeadLettered + Failed + NotStarted still
// holds; the row's [StageReport].HandedBack and the source's [Settlement] tell the two
// apart. Items of other sources, which cannot be handed back, are dead-lettered as
// without the option, and so is a batch ([Batch]) that holds any of them: its items of
// the acknowledged source then settle as [DeadLettered].
func WithHandBack() StageOption {
	return stageOpt(func(c *config) { c.handBack = true })
}

// ackCfg is a pipeline's acknowledged source.
type ackCfg struct {
	source any    // the *Stream
	name   string // its row
	max    int    // WithMaxPending, 0 for the default

	lag func() []PartitionLag // WithLag (lag.go), nil without
}

// FromAcked returns an acknowledged source: a source whose items carry a settle
// callback that the run calls exactly once per item, when its fate is known (see
// [Outcome]). It is how a message broker's acknowledgements follow each item: ack a
// committed message, reject a dead-lettered one, hand back one that was not
// processed. fn runs once per run, in its own goroutine, like [Generate]'s: it sends
// items with emit, which blocks while [WithMaxPending] items are unsettled or the next
// queue is full, and returns an error once the run is stopping; fn should then return
// that error (or nil). emit must not be called from several goroutines at once.
//
// settle is called exactly once for every call of emit, whatever emit returns: with
// NotProcessed at once when emit does not take the item (the run is stopping), from
// the goroutine in which the item's last derived item settled (a sink worker, at the
// end of the run of at most 64 items it took with it; a stage's dead-letter path, a
// filter, the loop over [All]) when its fate is known, and
// with NotProcessed, in emit order, for every item still unsettled when the run ends,
// before [Pipeline.Run] returns. A Committed or DeadLettered settlement comes only
// after the sink's function returned nil for every derived item, or the dead-letter
// destination accepted it. settle must be quick (it runs in a worker, and in the run's
// own goroutine at the end), safe to call from any goroutine, and may be nil. A panic
// in settle fails the run like a panic in a stage.
//
// The run tracks the items derived from each source item with the same machinery as
// [FromCheckpoint]'s watermark, without the watermark: a mutex per emitted item
// ([FromAckedBatches]: per run of a batch), one per sink worker's run of settled items
// (and per item settled elsewhere) and one more after its callbacks, and a slot of a
// table of 2 × [WithMaxPending] slots (64 to 65,536, 32 B each) per unsettled item,
// or a map entry when the item's slot is taken by an older one still unsettled. Runs
// without a tracked source pay nothing for it. A pipeline has at most one tracked
// source, acknowledged or checkpointed: FromAcked panics on a second one.
// Options: [WithMaxPending], [WithLag] (its backlog per partition, in the report) and
// [WithName] (the source's row, "FromAcked" by default).
func FromAcked[T any](p *Pipeline, fn func(ctx context.Context, emit func(v T, settle func(Settlement)) error) error, opts ...AckOption) *Stream[T] {
	if p == nil {
		panic("pipeline: FromAcked: nil *Pipeline")
	}
	if fn == nil {
		panic("pipeline: FromAcked(nil)")
	}
	return fromAcked(p, "FromAcked", func(ctx context.Context, e *ackEmitter[T]) error { return fn(ctx, e.one) }, opts)
}

// FromAckedBatches is [FromAcked] for a source that receives its items in batches, as
// a broker's consumer fetches them: emit hands over every item of vs, with its settle
// callback settles[i], at once. Each item is admitted, counted and settled as if
// emitted alone by FromAcked's emit, in order, and settle is called exactly once for
// every item of vs, whatever emit returns (NotProcessed at once for the items it did
// not take); emit returns once every item is in the pipeline (blocking while
// [WithMaxPending] items are unsettled or the next queue is full, after handing over
// those it took), or the run's error once it is stopping. What it saves is the
// per-item cost of FromAcked's emit, which hands each item over at once since the next
// may be long in coming: a batch's items take one lock of the tracker and one of the
// next queue per run of up to 64, instead of one each (for a one-stage sink, about
// 0.1 µs per item on the machines of bench/README.md). A batch of one costs what
// FromAcked's emit does. emit panics if len(settles) != len(vs); settles[i] may be nil.
// emit must not be called from several goroutines at once, and neither vs nor settles
// is kept after it returns. Options, the row and the one tracked source per pipeline
// are FromAcked's.
func FromAckedBatches[T any](p *Pipeline, fn func(ctx context.Context, emit func(vs []T, settles []func(Settlement)) error) error, opts ...AckOption) *Stream[T] {
	if p == nil {
		panic("pipeline: FromAckedBatches: nil *Pipeline")
	}
	if fn == nil {
		panic("pipeline: FromAckedBatches(nil)")
	}
	return fromAcked(p, "FromAckedBatches", func(ctx context.Context, e *ackEmitter[T]) error { return fn(ctx, e.many) }, opts)
}

// ackEmitter is an acknowledged source's emit side, in the source's goroutine: one
// (FromAcked's emit) and many (FromAckedBatches').
type ackEmitter[T any] struct {
	r   *run
	rw  *row
	st  *workerStats
	t   *ackTracker
	h   *hand
	snd sender[T]
	pos uint64
}

// fromAcked is FromAcked and FromAckedBatches: body runs the source's function.
func fromAcked[T any](p *Pipeline, what string, body func(context.Context, *ackEmitter[T]) error, opts []AckOption) *Stream[T] {
	if p.ck != nil || p.ack != nil {
		panic("pipeline: " + what + ": the pipeline already has a tracked source (FromAcked or FromCheckpoint)")
	}
	cfg := configure(what, opts, AckOption.ackOption)
	name := p.rowName(cfg.name, "FromAcked")
	s := newStream[T](p, "source "+name)
	p.ack = &ackCfg{source: s, name: name, max: cfg.maxRedo, lag: cfg.lag}
	s.open = func(r *run, c into[T]) []*row {
		out, done := c.out, c.done
		rw := r.newRow(name, KindSource, 1, 0, nil)
		rw.lag = r.p.ack.lag
		r.addRow(rw)
		e := &ackEmitter[T]{r: r, rw: rw, st: &rw.workers[0]}
		e.t, _ = r.track.(*ackTracker)
		r.goSafe(name, func() error {
			e.h = &hand{row: rw, last: true} // each item is handed over at once
			e.snd = out(e.h)
			returned := false
			defer func() {
				if !returned {
					e.snd.drop()
				}
			}()
			err := body(r.ctx, e)
			returned = true
			return sourceEnded(r, name, err, done)
		})
		return []*row{rw}
	}
	return s
}

// one is FromAcked's emit.
func (e *ackEmitter[T]) one(v T, settle func(Settlement)) error {
	r, st := e.r, e.st
	if e.rw.drain.Load() { // not taken: the item is the source's still
		callSettle(settle, NotProcessed)
		return errDraining
	}
	if r.ctx.Err() != nil { // the run is stopping: send nothing more
		st.received.inc()
		st.discarded.inc() // taken, never sent: not started
		callSettle(settle, NotProcessed)
		return context.Cause(r.ctx)
	}
	if _, err := e.snd.admit(r.ctx, e.pos, settle); err != nil { // the source asks for every item
		callSettle(settle, NotProcessed)
		return err
	}
	st.received.inc()
	err := e.snd.put(v, e.pos)
	if ferr := e.snd.flush(); err == nil { // the next item may be long in coming
		err = ferr
	}
	st.succeeded.inc() // after put: a panic in an inline operator leaves it failed
	st.emitted.inc()
	e.pos++
	return err
}

// many is FromAckedBatches' emit: the items of vs are admitted in runs under one lock
// of the tracker (admitRun), put without handing each over, and flushed once, or
// before the source waits for room.
func (e *ackEmitter[T]) many(vs []T, settles []func(Settlement)) (err error) {
	if len(settles) != len(vs) {
		panic(fmt.Sprintf("pipeline: FromAckedBatches: emit of %d items with %d settle callbacks", len(vs), len(settles)))
	}
	if len(vs) == 1 || e.t == nil {
		for i := range vs {
			if err := e.one(vs[i], settles[i]); err != nil {
				notProcessed(settles[i+1:])
				return err
			}
		}
		return nil
	}
	r, st := e.r, e.st
	e.h.last = false  // held until the flush: the batch's next item is here
	i := 0            // vs[i] is the next item to take
	admitted := e.pos // the tracker holds the positions before it
	putting := false  // in put: a panic there leaves that item to the tracker
	defer func() {
		e.h.last = true
		if putting { // a panic in an inline operator: as in one, the item in put is the tracker's
			e.t.forget(e.pos+1, admitted)
			i++
		}
		// The items not taken (the run stops, a budget drained) are the source's:
		// told NotProcessed at once, as by one.
		notProcessed(settles[i:])
	}()
	for i < len(vs) {
		if e.rw.drain.Load() {
			err = errDraining
			break
		}
		if r.ctx.Err() != nil {
			st.received.add(int64(len(vs) - i))
			st.discarded.add(int64(len(vs) - i))
			err = context.Cause(r.ctx)
			break
		}
		k := e.t.admitRun(e.pos, settles[i:])
		if k == 0 { // no room: hand over what is held, then wait for it
			if err = e.snd.flush(); err != nil {
				break
			}
			if _, err = e.snd.admit(r.ctx, e.pos, settles[i]); err != nil {
				break
			}
			k = 1
		}
		admitted = e.pos + uint64(k)
		for range k {
			st.received.inc()
			putting = true
			perr := e.snd.put(vs[i], e.pos)
			putting = false
			st.succeeded.inc() // after put, as in one
			st.emitted.inc()
			e.pos++
			i++
			if perr != nil {
				// The run stops: the admitted items never put are forgotten, and
				// the deferred call tells them NotProcessed.
				e.t.forget(e.pos, admitted)
				_ = e.snd.flush()
				return perr
			}
		}
	}
	if ferr := e.snd.flush(); err == nil {
		err = ferr
	}
	return err
}

// notProcessed tells each of settles NotProcessed.
func notProcessed(settles []func(Settlement)) {
	for _, settle := range settles {
		callSettle(settle, NotProcessed)
	}
}

func callSettle(settle func(Settlement), o Outcome) {
	if settle != nil {
		settle(Settlement{Outcome: o})
	}
}

// ackTracker is an acknowledged source's [tracker]: no watermark, a settle callback
// per unsettled position instead.
type ackTracker struct {
	lineage           // refs, groups and the source's wait (tracker.go), under mu
	max     int       // the bound on unsettled positions (WithMaxPending)
	entries ackTable  // the unsettled positions
	firing  int       // positions settled whose callback has not returned yet: they count against max
	ready   []ackFire // settlements to call once the lock is released
	spare   []ackFire // doneAll's copy of ready, kept for the next call
}

type ackEntry struct {
	settle func(Settlement)
	mark   *ackMark // what a derived item met: set aside, or handed back
}

// ackMark is what an item set aside met: its record (the destination's, or the
// hand-back's) and, when back, the delay before the source delivers it again.
type ackMark struct {
	dl    DeadLetter[struct{}]
	back  bool
	delay time.Duration
}

// ackFire is a settlement to call: its callback and what the item met (nil: it was
// committed). The Settlement itself is made at the call, not copied along.
type ackFire struct {
	settle func(Settlement)
	mark   *ackMark
}

// settlement returns what m tells the source: Committed without a mark.
func (m *ackMark) settlement() Settlement {
	s := Settlement{Outcome: Committed}
	if m != nil {
		s.Outcome, s.DeadLetter = DeadLettered, m.dl
		if m.back {
			s.Outcome, s.Delay = HandedBack, m.delay
		}
	}
	return s
}

// ackTable holds the entries of the unsettled positions: a table of slots indexed by
// a position's low bits, and a map for a position whose slot an older position still
// holds. Positions are emitted one after the other and at most max are unsettled, so
// with at least 2 × max slots (up to maxAckSlots) nearly every one has its slot: no
// map entry is made and deleted per item (with the map alone, about 65 ns per item in
// a profile of BenchmarkS8Kafka). A position unsettled while many later ones pass keeps its slot, and the
// later ones that meet it go to the map, so memory stays O(unsettled).
type ackTable struct {
	slots []ackSlot
	more  map[uint64]ackEntry // the positions whose slot was taken
	n     int                 // the positions held
}

type ackSlot struct {
	tag uint64 // its position + 1; 0 when free
	ackEntry
}

// maxAckSlots bounds an ackTable's slots (32 B each): a larger bound on unsettled
// items spills into the map.
const maxAckSlots = 1 << 16

// size makes the table's slots for a bound of max unsettled positions, if not made yet.
func (a *ackTable) size(max int) {
	if a.slots != nil {
		return
	}
	n := 64
	for n < 2*max && n < maxAckSlots {
		n *= 2
	}
	a.slots = make([]ackSlot, n)
}

func (a *ackTable) len() int { return a.n }

// put records pos, not held, with e.
func (a *ackTable) put(pos uint64, e ackEntry) {
	a.n++
	if s := &a.slots[pos&uint64(len(a.slots)-1)]; s.tag == 0 {
		s.tag, s.ackEntry = pos+1, e
		return
	}
	if a.more == nil {
		a.more = map[uint64]ackEntry{}
	}
	a.more[pos] = e
}

// get returns pos's entry (a copy, for a position in the map: change it with mark),
// nil if pos is not held.
func (a *ackTable) get(pos uint64) *ackEntry {
	if a.n == 0 {
		return nil
	}
	if s := &a.slots[pos&uint64(len(a.slots)-1)]; s.tag == pos+1 {
		return &s.ackEntry
	}
	if e, ok := a.more[pos]; ok {
		return &e
	}
	return nil
}

// take removes pos and returns its entry, ok false if pos was not held.
func (a *ackTable) take(pos uint64) (e ackEntry, ok bool) {
	if a.n == 0 {
		return e, false
	}
	if s := &a.slots[pos&uint64(len(a.slots)-1)]; s.tag == pos+1 {
		e = s.ackEntry
		*s = ackSlot{}
		a.n--
		return e, true
	}
	if e, ok = a.more[pos]; ok {
		delete(a.more, pos)
		a.n--
	}
	return e, ok
}

// mark sets pos's mark to m, if pos is held.
func (a *ackTable) mark(pos uint64, m *ackMark) {
	if s := &a.slots[pos&uint64(len(a.slots)-1)]; s.tag == pos+1 {
		s.mark = m
		return
	}
	if e, ok := a.more[pos]; ok {
		e.mark = m
		a.more[pos] = e
	}
}

// positions returns the positions held, in order.
func (a *ackTable) positions() []uint64 {
	ps := make([]uint64, 0, a.n)
	for i := range a.slots {
		if tag := a.slots[i].tag; tag != 0 {
			ps = append(ps, tag-1)
		}
	}
	for p := range a.more {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// clear removes every position.
func (a *ackTable) clear() {
	clear(a.slots)
	a.more = nil
	a.n = 0
}

func newAckTracker() *ackTracker {
	t := &ackTracker{}
	t.init()
	return t
}

// admit implements [tracker]: it waits until fewer than the bound of positions are
// unsettled, then records pos with its callback. The source asks again for every item.
func (t *ackTracker) admit(ctx context.Context, pos uint64, settle func(Settlement)) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.waitLocked(ctx, func() bool { return t.entries.len()+t.firing >= t.max }, nil); err != nil {
		return 0, err
	}
	t.entries.size(t.max)
	t.entries.put(pos, ackEntry{settle: settle})
	return pos + 1, nil
}

// admitRun records, without waiting, the positions from pos of as many of settles as
// there is room for, and returns how many (0: the source must wait in admit).
func (t *ackTracker) admitRun(pos uint64, settles []func(Settlement)) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := min(t.max-t.entries.len()-t.firing, len(settles))
	t.entries.size(t.max)
	for j := range k {
		t.entries.put(pos+uint64(j), ackEntry{settle: settles[j]})
	}
	return max(k, 0)
}

// forget removes the positions from..to-1, admitted and never sent: their callbacks
// are the source's to call.
func (t *ackTracker) forget(from, to uint64) {
	if from >= to {
		return
	}
	t.mu.Lock()
	for p := from; p < to; p++ {
		t.entries.take(p)
	}
	t.roomLocked()
	t.mu.Unlock()
}

// split implements [tracker].
func (t *ackTracker) split(pos uint64, k int) {
	if t.refer(pos, k) {
		t.done(pos, nil)
	}
}

// ungroup implements [tracker].
func (t *ackTracker) ungroup(pos uint64, n int) []uint64 {
	m, now := t.members(pos, n)
	if now {
		t.done(pos, nil)
	}
	return m
}

// settle implements [tracker].
func (t *ackTracker) settle(pos uint64) { t.done(pos, nil) }

// settleAll implements [tracker]: one lock for every position, then the callbacks of
// the source items that became settled, in the order of positions.
func (t *ackTracker) settleAll(positions []uint64) { t.doneAll(positions) }

// setAside implements [tracker]: the source item settles DeadLettered, or HandedBack.
func (t *ackTracker) setAside(pos uint64, m *ackMark) {
	if pos == noPos {
		return
	}
	kept := *m // the caller's (the worker's item in hand) is the caller's to reuse
	t.done(pos, &kept)
}

// done settles one item derived from pos, which met m on its way (nil: committed or
// filtered), and then calls the callbacks of the source items that became settled.
func (t *ackTracker) done(pos uint64, m *ackMark) {
	if pos == noPos {
		return
	}
	var buf [1]ackFire
	t.mu.Lock()
	if m != nil {
		t.markLocked(pos, m)
	}
	for _, p := range t.unwindLocked(pos) {
		t.reachedLocked(p)
	}
	t.fire(append(buf[:0], t.ready...))
}

// doneAll is done for one committed item derived from each of positions.
func (t *ackTracker) doneAll(positions []uint64) {
	t.mu.Lock()
	for _, pos := range positions {
		if pos == noPos {
			continue
		}
		for _, p := range t.unwindLocked(pos) {
			t.reachedLocked(p)
		}
	}
	var fire []ackFire
	if len(t.ready) > 0 {
		fire = t.spare[:0]
		t.spare = nil // fire may run again (a callback's panic, another worker) meanwhile
		fire = append(fire, t.ready...)
	}
	t.fire(fire)
	if fire != nil {
		t.mu.Lock()
		if t.spare == nil {
			clear(fire)
			t.spare = fire[:0]
		}
		t.mu.Unlock()
	}
}

// fire empties ready, releases t.mu (held by the caller), and calls the callbacks of
// fire, ready's copy. A panic (or Goexit) in one goes on after every other one ran.
func (t *ackTracker) fire(fire []ackFire) {
	clear(t.ready)
	t.ready = t.ready[:0]
	t.mu.Unlock()
	if len(fire) == 0 {
		return
	}
	i := 0
	defer func() {
		// A panic (or Goexit) in callback i: the run fails with it, but every other
		// source item settled here still gets its call, and the source must not wait.
		for i++; i < len(fire); i++ {
			_ = safely(func() error { fire[i].settle(fire[i].mark.settlement()); return nil })
		}
		t.mu.Lock()
		t.firing -= len(fire)
		t.roomLocked()
		t.mu.Unlock()
	}()
	for ; i < len(fire); i++ {
		fire[i].settle(fire[i].mark.settlement())
	}
}

// roomLocked wakes the source if it waits and there is room.
func (t *ackTracker) roomLocked() {
	if t.entries.len()+t.firing < t.max {
		t.openLocked()
	}
}

// markLocked records m for pos, or for every member of a batch; t.mu must be held.
func (t *ackTracker) markLocked(pos uint64, m *ackMark) {
	if pos&groupBit != 0 {
		for _, p := range t.groups[pos] {
			t.markLocked(p, m)
		}
		return
	}
	if e := t.entries.get(pos); e != nil && (e.mark == nil || m.back && !e.mark.back) {
		t.entries.mark(pos, m)
	}
}

// reachedLocked ends pos, whose derived items have all settled: its entry is removed
// and its Settlement queued in ready. t.mu must be held.
func (t *ackTracker) reachedLocked(pos uint64) {
	e, ok := t.entries.take(pos)
	if !ok {
		return
	}
	if e.settle == nil {
		t.roomLocked()
		return
	}
	t.firing++
	t.ready = append(t.ready, ackFire(e))
}

// holdsHead implements [tracker]: the source waits for any unsettled item, so a batch
// that holds items holds it back.
func (*ackTracker) holdsHead(positions []uint64) (bool, <-chan struct{}) {
	return len(positions) > 0, nil
}

// skipped implements [tracker]: an acknowledged source has no earlier run to skip.
func (*ackTracker) skipped(uint64) bool { return false }

// scope implements [tracker]: there is no progress to commit.
func (*ackTracker) scope(ctx context.Context, _ *uint64) context.Context { return ctx }

// handsBack implements [tracker]: a broker delivers an item handed back again, unless
// it derives from an item of another source too (a batch that holds one): that one
// could not be handed back, so the batch is set aside whole.
func (t *ackTracker) handsBack(pos uint64) bool {
	if pos&groupBit == 0 {
		return pos != noPos
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.trackedLocked(pos)
}

// finish implements [tracker]: it settles every position still unsettled as
// NotProcessed, in emit order. A panic in a callback is returned as a [*StageError]
// of the source, after the other callbacks ran.
func (t *ackTracker) finish(r *run) (err error) {
	t.mu.Lock()
	left := t.entries.positions()
	settles := make([]func(Settlement), len(left))
	for i, p := range left {
		settles[i] = t.entries.get(p).settle
	}
	t.entries.clear()
	t.mu.Unlock()
	for _, settle := range settles {
		if perr := safely(func() error { callSettle(settle, NotProcessed); return nil }); perr != nil && err == nil {
			err = &StageError{Stage: r.p.ack.name, Err: perr}
		}
	}
	return err
}

// stripItem returns rec without its item, for a [Settlement].
func stripItem[T any](rec DeadLetter[T]) DeadLetter[struct{}] {
	return DeadLetter[struct{}]{
		Stage: rec.Stage, Attempts: rec.Attempts, Class: rec.Class, ErrType: rec.ErrType,
		FirstError: rec.FirstError, LastError: rec.LastError, Time: rec.Time,
	}
}

// handBackMark is what the acknowledged source is told of the item in hand that the
// stage gives back ([WithHandBack]); worker.end settles it.
func (w *worker[In, Out]) handBackMark(attempts int, first, last error) ackMark {
	typ, msg := errTypeName(last), last.Error()
	firstMsg := msg
	if first != last { //nolint:errorlint // identity, not equivalence: the same error value
		firstMsg = first.Error()
	}
	m := ackMark{back: true, dl: DeadLetter[struct{}]{
		Stage: w.st.name, Attempts: attempts, Class: ClassTransient, ErrType: typ,
		FirstError: firstMsg, LastError: msg, Time: time.Now(),
	}}
	if b := w.st.cfg.backoff; b != nil {
		m.delay = b(attempts)
	}
	m.delay = max(m.delay, retryafter.Of(last)) // a delay the error asks for (internal/retryafter)
	return m
}
