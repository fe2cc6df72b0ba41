package pipeline

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync/atomic"
	"time"
)

// WindowKind is the shape of the windows of a [Window] stage: [Tumbling], [Sliding] or
// [Session]. Its zero value is not a kind: Window panics when given it.
type WindowKind struct {
	size, slide time.Duration // tumbling (slide == size) and sliding
	gap         time.Duration // sessions
}

// Tumbling returns windows of the given size that tile event time: [0, size),
// [size, 2×size), ... counted from the Unix epoch, so that every item falls into
// exactly one. It panics if size <= 0.
func Tumbling(size time.Duration) WindowKind {
	if size <= 0 {
		panic(fmt.Sprintf("pipeline: Tumbling(%v): the size must be positive", size))
	}
	return WindowKind{size: size, slide: size}
}

// Sliding returns windows of the given size that start every slide, from the Unix
// epoch: an item falls into about size/slide of them (into every window whose
// [start, start+size) holds its event time). It panics unless 0 < slide <= size.
func Sliding(size, slide time.Duration) WindowKind {
	if slide <= 0 || slide > size {
		panic(fmt.Sprintf("pipeline: Sliding(%v, %v): need 0 < slide <= size", size, slide))
	}
	return WindowKind{size: size, slide: slide}
}

// Session returns session windows: the items of one key whose event times are less
// than gap apart are one session, [first item, last item + gap). An item that closes
// the gap between two sessions of its key merges them, so that the aggregate must
// merge values ([Reduce] or [FoldMerge]). It panics if gap <= 0.
func Session(gap time.Duration) WindowKind {
	if gap <= 0 {
		panic(fmt.Sprintf("pipeline: Session(%v): the gap must be positive", gap))
	}
	return WindowKind{gap: gap}
}

func (k WindowKind) String() string {
	switch {
	case k.gap > 0:
		return fmt.Sprintf("Session(%v)", k.gap)
	case k.slide == k.size:
		return fmt.Sprintf("Tumbling(%v)", k.size)
	default:
		return fmt.Sprintf("Sliding(%v, %v)", k.size, k.slide)
	}
}

// Aggregate is how a [Window] stage folds the items of a window into its value: made
// by [Fold], [FoldMerge] or [Reduce]. The items of a window are folded in the order
// they arrive, not in event-time order: an aggregate that does not commute (the last
// value, a list) gives results that depend on the disorder of the input.
type Aggregate[T, V any] struct {
	init  V
	first func(T) V // the value of a window of one item (Reduce); nil: fold(init, item)
	fold  func(V, T) V
	merge func(V, V) V // two sessions into one; nil when the aggregate cannot
}

// Fold returns an aggregate whose windows start at init and fold each item in with
// fold. It cannot merge values: give [Session] windows [FoldMerge] or [Reduce]. It
// panics if fold is nil.
func Fold[T, V any](init V, fold func(V, T) V) Aggregate[T, V] {
	if fold == nil {
		panic("pipeline: Fold: nil fold function")
	}
	return Aggregate[T, V]{init: init, fold: fold}
}

// FoldMerge returns an aggregate like [Fold]'s that merges the values of two windows
// with merge (the earlier session's value first), as [Session] windows need. It panics
// if fold or merge is nil.
func FoldMerge[T, V any](init V, fold func(V, T) V, merge func(V, V) V) Aggregate[T, V] {
	if fold == nil || merge == nil {
		panic("pipeline: FoldMerge: nil fold or merge function")
	}
	return Aggregate[T, V]{init: init, fold: fold, merge: merge}
}

// Reduce returns an aggregate whose value is the first item of the window, reduced
// with each later one by fn (a sum, a maximum); fn also merges sessions. It panics if
// fn is nil.
func Reduce[T any](fn func(T, T) T) Aggregate[T, T] {
	if fn == nil {
		panic("pipeline: Reduce: nil function")
	}
	return Aggregate[T, T]{first: func(v T) T { return v }, fold: fn, merge: fn}
}

// WindowResult is what a [Window] stage emits for a window: its key, its span
// [Start, End) in event time, the aggregate's value over its items and their count.
// Update is false for a window's first result and true for each later one, emitted
// when an item within the allowed lateness ([WithAllowedLateness]) changed a window
// that had already fired; every result holds the whole window, so that a sink writes
// (upserts) it by Key and Start.
type WindowResult[K comparable, V any] struct {
	Key    K
	Start  time.Time
	End    time.Time
	Value  V
	Count  int
	Update bool
}

// WindowOption configures a [Window] stage. The options: [WithMaxDelay],
// [WithAllowedLateness], [WithIdleTimeout], [WithMaxWindows], [WithWindowBackpressure],
// [WithWindowWorkers], [WithWatermarkPer], [WithLateItems], [WithBuffer] and
// [WithName].
type WindowOption interface{ windowOption(*windowConfig) }

type windowConfig struct {
	config                   // name, buffer
	maxDelay, lateness, idle time.Duration
	maxWindows, workers      int
	backpressure             bool
	late                     any // func(context.Context, DeadLetter[T]) error, checked by Window
	inputs                   int // WithWatermarkPer
	input                    any // func(T) int, checked by Window
}

type windowOpt func(*windowConfig)

func (f windowOpt) windowOption(c *windowConfig) { f(c) }

func (o BufferOption) windowOption(c *windowConfig) { o.set(&c.config) }
func (o NameOption) windowOption(c *windowConfig)   { c.name = o.name }

// DefaultMaxWindows is the most windows a [Window] stage holds at once without
// [WithMaxWindows].
const DefaultMaxWindows = 10_000

// WithMaxDelay sets how far out of order a [Window] stage's input may be: the
// watermark, the event time up to which the stage takes its input as complete, is the
// greatest event time seen minus d. A window fires when the watermark reaches its end.
// The default, 0, takes the input as in event-time order. It panics if d < 0.
func WithMaxDelay(d time.Duration) WindowOption {
	if d < 0 {
		panic(fmt.Sprintf("pipeline: WithMaxDelay(%v): negative delay", d))
	}
	return windowOpt(func(c *windowConfig) { c.maxDelay = d })
}

// WithAllowedLateness keeps a [Tumbling] or [Sliding] window for d after it fired: an
// item that arrives in that time changes it, and the stage emits the window again with
// Update set. An item later still is late: see [WithLateItems]. The default, 0, makes
// every item behind the watermark late. [Window] panics when it is given with [Session]
// windows: a late item may join two sessions or move one's start, and an update could
// then not replace the result a sink stored under the old start (it would need a
// retraction). It panics if d < 0.
func WithAllowedLateness(d time.Duration) WindowOption {
	if d < 0 {
		panic(fmt.Sprintf("pipeline: WithAllowedLateness(%v): negative lateness", d))
	}
	return windowOpt(func(c *windowConfig) { c.lateness = d })
}

// WithIdleTimeout makes the watermark of a [Window] stage advance with the clock once
// no item has arrived for d: by the time elapsed since d after the last item, so that
// an idle input does not hold its windows open for ever. Without it, only items (and
// the end of the input) move the watermark. It panics if d <= 0.
func WithIdleTimeout(d time.Duration) WindowOption {
	if d <= 0 {
		panic(fmt.Sprintf("pipeline: WithIdleTimeout(%v): the timeout must be positive", d))
	}
	return windowOpt(func(c *windowConfig) { c.idle = d })
}

// WithMaxWindows bounds the windows a [Window] stage holds at once (open ones, and
// fired ones kept for [WithAllowedLateness] or, for sessions, for a gap), over every
// key, at n; the default is [DefaultMaxWindows]. At the bound, before it opens another
// window, the stage acts on the window due first as if its time had come: it fires an
// open window (the watermark moves to its end) or forgets a fired one (its later items
// are late). [WithWindowBackpressure] makes it wait instead. It panics if n < 1.
func WithMaxWindows(n int) WindowOption {
	if n < 1 {
		panic(fmt.Sprintf("pipeline: WithMaxWindows(%d): need at least 1", n))
	}
	return windowOpt(func(c *windowConfig) { c.maxWindows = n })
}

// WithWindowWorkers spreads a [Window] stage over n goroutines, each with the keys
// that a hash gives it, its own windows (its share of [WithMaxWindows]: the shares add
// up to the bound) and its own watermark, over the items of its keys: a window fires
// when its worker's watermark reaches its end, and results come out in order of end
// per worker. The items of its keys move a worker's watermark, so it is never ahead of
// the stage's single one, and no item is late that would not be with one worker;
// windows may fire later. Two things of a worker's are its own, though, and with
// either an item may be late that would not be with one worker: its share of the
// bound, at which it fires a window early that one worker would still hold, and the
// idle clock of [WithIdleTimeout], which runs from the worker's own last item (the
// watermark of a worker whose keys went quiet moves on while other keys still come).
// It panics if n < 1, and [Window] panics if the bound is less than n. The default is 1.
func WithWindowWorkers(n int) WindowOption {
	if n < 1 {
		panic(fmt.Sprintf("pipeline: WithWindowWorkers(%d): need at least 1", n))
	}
	return windowOpt(func(c *windowConfig) { c.workers = n })
}

// WithWatermarkPer gives a [Window] stage a watermark per input, for a stream that
// joins n inputs each in (or nearly in) event-time order of its own but not with each
// other: the sources of a [Merge], the partitions of a Kafka topic. input says which
// of the n inputs an item came from (0 to n-1; the function is called once per item,
// from the stage's goroutine). Each input's watermark is the greatest event time of
// its items less [WithMaxDelay], and the stage's is the least of them: an input that
// lags behind the others holds the windows open rather than having its items found
// late. So WithMaxDelay needs only cover the disorder within an input.
//
// Until every input has sent an item the watermark does not move. An input that
// stops sending (ended, or stalled) holds it where its last item left it, until the
// end of the whole stream; with [WithIdleTimeout], an input none of whose items have
// arrived for the idle timeout is left out of the least until its next item (which is
// late if the watermark passed it meanwhile), and the idle clock moves the watermark
// when no input sends. With [WithWindowWorkers], each worker takes the least over the
// items of its keys: an input none of whose items reach a worker holds that worker's
// windows (give WithIdleTimeout).
//
// An input outside [0, n) makes the stage fail the run (a panic in its goroutine,
// reported as the stage's error). It panics if n < 1 or input is nil; [Window] panics
// if input is for another item type than the stage's.
func WithWatermarkPer[T any](n int, input func(T) int) WindowOption {
	if n < 1 {
		panic(fmt.Sprintf("pipeline: WithWatermarkPer(%d): need at least one input", n))
	}
	if input == nil {
		panic("pipeline: WithWatermarkPer: nil input function")
	}
	return windowOpt(func(c *windowConfig) { c.inputs, c.input = n, input })
}

// WithWindowBackpressure makes a [Window] stage at its bound ([WithMaxWindows]) wait,
// taking no more input, until the idle clock ([WithIdleTimeout], which it needs:
// Window panics without it) brings the window due first to its time; the stage's
// queue then fills and holds back its producers. Nothing fires before its time, at the
// price of a stall of at least the idle timeout at each window the bound delays.
func WithWindowBackpressure() WindowOption {
	return windowOpt(func(c *windowConfig) { c.backpressure = true })
}

// WithLateItems sends each late item of a [Window] stage (an item behind the
// watermark by more than [WithAllowedLateness], or whose window was forgotten at the
// bound of [WithMaxWindows]) to fn, as a [DeadLetter] of class [ClassItem] whose
// ErrType is "late"; the stage's report counts them as dead-lettered, with the cause
// type "late", and in [WindowReport].Late. fn is called from the stage's goroutine; as a
// dead-letter destination, it may call [Commit]. If fn returns an error, the run stops
// with it. Without WithLateItems, a late item stops the run with an error matching
// [ErrLate]. T must be the stage's item type: Window panics otherwise.
func WithLateItems[T any](fn func(ctx context.Context, dl DeadLetter[T]) error) WindowOption {
	if fn == nil {
		panic("pipeline: WithLateItems(nil)")
	}
	return windowOpt(func(c *windowConfig) { c.late = fn })
}

// windowShare is worker i's share of a bound of windows over n workers: the shares
// add up to max, and differ by one at most.
func windowShare(bound, n, i int) int {
	share := bound / n
	if i < bound%n {
		share++
	}
	return share
}

// WindowReport is the state of a [Window] stage, in its [StageReport].Windows.
type WindowReport struct {
	Open         int64         // windows held now: open, or fired and kept for late items
	Watermark    time.Time     // the event time up to which the input is taken as complete; zero while there is none (before the first item; with WithWindowWorkers, until every worker has one; with WithWatermarkPer, until every input sent)
	MaxEventTime time.Time     // the greatest event time seen; zero before the first item
	Lag          time.Duration // MaxEventTime - Watermark: the delay, or less once the idle clock moved the watermark; 0 while there is no watermark
	Late         int64         // items behind the watermark, set aside (also in DeadLettered)
	Updates      int64         // results emitted with Update set
	Forced       int64         // windows fired or forgotten before their time (each once, however many one act moved): at the bound, or for a checkpointed source's save
}

// line is the report's line for a window stage that emitted out results.
func (r *WindowReport) line(name string, out int64) string {
	wm := "none yet"
	if !r.Watermark.IsZero() {
		wm = r.Watermark.Format(time.RFC3339Nano) + ", lag " + r.Lag.String()
	}
	return fmt.Sprintf("window %s: %d results (%d updates), %d open, watermark %s, %d late, %d fired early\n",
		name, out, r.Updates, r.Open, wm, r.Late, r.Forced)
}

// windowStats are the figures of a window stage's report, written by its goroutine.
type windowStats struct {
	open, late, updates, forced atomic.Int64
	wm, maxEvent                atomic.Int64 // nanoseconds since the epoch; math.MinInt64 before the first item
}

// windowRow is a window stage's figures, one windowStats per worker.
type windowRow []*windowStats

// load sums the workers' counts; the stage's greatest event time is the greatest of
// theirs, its watermark the least of theirs: none while a worker has none, since that
// worker takes an item of any time as on time (a watermark of the workers that had seen
// an item went back when another saw its first).
func (ws windowRow) load() *WindowReport {
	r := &WindowReport{}
	wm, mx := int64(math.MaxInt64), int64(math.MinInt64)
	for _, s := range ws {
		r.Open += s.open.Load()
		r.Late += s.late.Load()
		r.Updates += s.updates.Load()
		r.Forced += s.forced.Load()
		mx = max(mx, s.maxEvent.Load())
		wm = min(wm, s.wm.Load())
	}
	if mx != math.MinInt64 {
		r.MaxEventTime = time.Unix(0, mx).UTC()
	}
	if wm != math.MinInt64 {
		r.Watermark = time.Unix(0, wm).UTC()
		r.Lag = time.Duration(max(0, mx-wm))
	}
	return r
}

// Window groups the items of s by key and by window of event time (at) and emits, for
// each window, the aggregate of its items ([Fold], [FoldMerge], [Reduce]) as a
// [WindowResult], on one goroutine with its own input queue ([WithBuffer]), or inline
// (below). Windows are [Tumbling], [Sliding] or [Session]. See docs/windows.md.
//
// A stage of one worker folds inline when it can: when one goroutine produces its input
// (a source, or a stage of one worker, directly or through [Map]; a [Filter] between
// them, a row of its own, does not tell, so it keeps the queue), the run tracks no
// positions (no [FromCheckpoint] or [FromAcked] source), and it has neither
// [WithIdleTimeout] (only a goroutine of its own can wait for the clock) nor a
// [WithBuffer] of its own. It then has no queue and no goroutine: each item is folded in
// the producer's goroutine, as Map runs, and the results are handed on from there, so
// the producer waits while the stage's consumer is full. Its results, their order, its
// late items, bound and report are those of the queued stage (its row shows no queue);
// a panic in key, at or the aggregate fails the run under the stage's name. Give it
// WithBuffer to have the queue and its goroutine instead.
//
// A window fires, and its result is emitted, when the watermark reaches its end: the
// greatest event time seen less [WithMaxDelay], moved on by the clock on an idle input
// ([WithIdleTimeout]); when the input ends, every window left fires, in order of end.
// Results come out in order of end (then of opening). An item is late when the earliest
// window it falls into has fired and its [WithAllowedLateness] has passed (a session
// item: when its own session, [t, t+gap), would have fired, or when it reaches a session
// that has): it goes into none of its windows and is set aside ([WithLateItems]), so
// that no item is dropped unseen. The stage holds at most [WithMaxWindows] windows.
//
// In a checkpointed run ([FromCheckpoint]) an item settles only when the results of
// every window it fell into have settled downstream (a sink committed them), and a
// resumed run reads the items of every window not committed again: each window's
// result is written once by a sink that commits it with the run's progress ([Commit]),
// from a [CommittedStore], which Window then needs (it panics on a checkpointed source
// whose store is not one). Sliding windows share items, so after a crash a window
// already committed may come out again with the part of its items that windows not
// committed share with it, with a smaller Count: a sink of sliding windows keeps the
// row with the larger Count. While the source waits for a save that needs items an
// open window holds ([WithMaxRedo]), the stage fires that window early: give
// WithMaxRedo room for the items of the windows open at once. A window fired early
// moves the watermark to its end, as at the bound: every later item with an earlier
// event time is late then, even in an ordered input (with no [WithLateItems], the run
// fails with [ErrLate]).
//
// The stage's items count as succeeded when they are folded into their windows, and
// as failed if the run stops before their last window fired (the report's Window
// shows them until then); Out counts results. It costs a map look-up per item and window
// it falls into, and a heap push per window opened, plus, queued, the hop from its
// producer's goroutine; BenchmarkS9Window (bench/) measures it against a hand-written
// loop. It
// panics if key, at or the aggregate is missing, on a [Session] window without a merge
// or with [WithAllowedLateness], and on [WithWindowBackpressure] without
// [WithIdleTimeout].
func Window[T any, K comparable, V any](s *Stream[T], kind WindowKind, key func(T) K, at func(T) time.Time, agg Aggregate[T, V], opts ...WindowOption) *Stream[WindowResult[K, V]] {
	s.check("Window")
	if kind == (WindowKind{}) {
		panic("pipeline: Window: the zero WindowKind: use Tumbling, Sliding or Session")
	}
	if key == nil || at == nil || agg.fold == nil {
		panic("pipeline: Window needs a key function, an event-time function and an aggregate (Fold, FoldMerge or Reduce)")
	}
	var cfg windowConfig
	for i, o := range opts {
		if o == nil {
			panic(fmt.Sprintf("pipeline: Window: option %d of %d is nil", i+1, len(opts)))
		}
		o.windowOption(&cfg)
	}
	if kind.gap > 0 && agg.merge == nil {
		panic("pipeline: Window: Session windows need an aggregate that merges (FoldMerge or Reduce)")
	}
	if kind.gap > 0 && cfg.lateness > 0 {
		panic("pipeline: Window: WithAllowedLateness is for Tumbling and Sliding windows, not Session")
	}
	if cfg.backpressure && cfg.idle == 0 {
		panic("pipeline: Window: WithWindowBackpressure needs WithIdleTimeout (only the clock can move a full stage's watermark)")
	}
	var late func(context.Context, DeadLetter[T]) error
	if cfg.late != nil {
		late = typed[func(context.Context, DeadLetter[T]) error, T](cfg.late, "Window", "WithLateItems", "a stream")
	}
	var input func(T) int
	if cfg.input != nil {
		input = typed[func(T) int, T](cfg.input, "Window", "WithWatermarkPer", "a stream")
	}
	p := s.p
	if p.ck != nil {
		if _, ok := p.ck.store.(CommittedStore); !ok {
			panic("pipeline: Window: a checkpointed run with windows needs a CommittedStore (FileCheckpoint, pgpipe's Checkpoint): a resume must skip the items of committed windows")
		}
	}
	if cfg.maxWindows == 0 {
		cfg.maxWindows = DefaultMaxWindows
	}
	if workers := max(cfg.workers, 1); cfg.maxWindows < workers {
		panic(fmt.Sprintf("pipeline: Window: WithMaxWindows(%d) over %d workers (WithWindowWorkers): each worker needs room for a window", cfg.maxWindows, workers))
	}
	if kind.slide > 0 { // an item falls into up to ceil(size/slide) windows, all open at once
		per, workers := int((kind.size+kind.slide-1)/kind.slide), max(cfg.workers, 1)
		if share := cfg.maxWindows / workers; per > share { // the least share (windowShare)
			panic(fmt.Sprintf("pipeline: Window: an item falls into up to %d windows of %v every %v, more than the %d open windows a worker may hold (WithMaxWindows(%d) over %d workers)",
				per, kind.size, kind.slide, share, cfg.maxWindows, workers))
		}
	}
	name := p.rowName(cfg.name, "Window")
	desc := fmt.Sprintf("window %q", name)
	s.consume(desc)
	buf := cfg.bufferOr(p.cfg.bufferOr(DefaultBuffer))
	out := newStream[WindowResult[K, V]](p, desc)
	out.open = func(r *run, c into[WindowResult[K, V]]) []*row {
		n := max(cfg.workers, 1)
		rw := r.newRow(name, KindWindow, n, buf, nil)
		helds := make([]atomic.Int64, n)
		rw.held = func() int64 {
			var h int64
			for i := range helds {
				h += helds[i].Load()
			}
			return h
		}
		newWindower := func(i int, q *queue[T]) *windower[T, K, V] {
			ws := &windowStats{}
			ws.wm.Store(math.MinInt64)
			ws.maxEvent.Store(math.MinInt64)
			rw.windows = append(rw.windows, ws)
			w := &windower[T, K, V]{
				consumer: newConsumer(q, i, i, &rw.workers[i], buf),
				ctx:      r.ctx, name: name, kind: kind, key: key, at: at, agg: agg, cfg: cfg, late: late,
				down: c.out, row: rw, ws: ws, held: &helds[i], track: windowTrack[WindowResult[K, V]]{on: r.tracked()},
				wins: map[int64]*bucket[K, V]{}, sessions: map[K][]*win[K, V]{}, freeBuckets: make([]*bucket[K, V], 0, 2), seed: maphash.MakeSeed(),
				wm: math.MinInt64, maxEvent: math.MinInt64, floor: math.MinInt64,
				max: windowShare(cfg.maxWindows, n, i),
			}
			if input != nil {
				w.inputs = newInputTimes(cfg.inputs, input, name)
			}
			if kind.gap > 0 {
				w.retain = kind.gap
			} else {
				w.retain = cfg.lateness
				w.fast = kind.slide == kind.size && w.retain == 0
			}
			return w
		}
		var q *queue[T]
		if n == 1 && cfg.idle == 0 && !cfg.bufferSet && !r.tracked() {
			// Perhaps inline (window_inline.go): that depends on the producers, which only
			// opening the input tells.
			in := &windowInput[T, K, V]{track: r.track}
			feeders := s.open(r, into[T]{out: in.outlet, done: in.inputDone, rows: []*row{rw}})
			for _, f := range feeders {
				f.feed(rw)
			}
			if len(feeders) == 1 && len(feeders[0].workers) == 1 {
				w := newWindower(0, nil)
				in.inline(w, r, c.done)
				rw.q, rw.capacity = inlineLen{stats: &rw.workers[0], untaken: w.untaken}, 0
				r.addRow(rw)
				return []*row{rw}
			}
			q = newQueue[T](buf, 1)
			in.queued(q.outlet(r.ctx), q.close)
		} else {
			if n == 1 {
				q = newQueue[T](buf, 1)
			} else {
				seed := maphash.MakeSeed()
				q = newKeyedQueue(n, buf, func(v T) uint64 { return maphash.Comparable(seed, key(v)) })
			}
			wireInput(r, rw, s, q.outlet(r.ctx), q.close)
		}
		rw.q = q
		r.stoppers = append(r.stoppers, q.stop)
		r.addRow(rw)
		var left atomic.Int32
		left.Store(int32(n))
		var failed atomic.Bool // a worker failed: downstream sees no end of input
		for i := range n {
			w := newWindower(i, q)
			r.goSafe(name, func() (err error) {
				returned := false
				defer func() {
					if err != nil || !returned {
						failed.Store(true)
					}
					if left.Add(-1) == 0 && !failed.Load() {
						c.done()
					}
				}()
				err = w.loop() // an error: no end of input downstream, the consumers stop with the run
				returned = true
				return err
			})
		}
		return []*row{rw}
	}
	return out
}

// windowTrack holds every position call of a window stage: each goes through the
// stage's sender (see DESIGN.md, "Windows"). on is false in an untracked run, which
// then makes none.
type windowTrack[R any] struct {
	s  *sender[R]
	on bool
}

// fellInto records that the item at pos will be settled k times: once by a result of
// each window it fell into, and once more per window kept for late items (closed).
func (wt windowTrack[R]) fellInto(pos uint64, k int) {
	if wt.on {
		wt.s.split(pos, k)
	}
}

// result returns the position of a result made of the items at poss: it settles one
// share of each when the result settles downstream.
func (wt windowTrack[R]) result(poss []uint64) uint64 {
	if !wt.on || len(poss) == 0 {
		return noPos
	}
	return wt.s.group(poss)
}

// closed settles the share of each item at poss that a window kept for late items held.
func (wt windowTrack[R]) closed(poss []uint64) {
	if wt.on && len(poss) > 0 {
		wt.s.settle(wt.s.group(poss))
	}
}

// lateScope returns the context for a late item's destination (it may Commit), and
// lateDone settles the item once the destination took it, unless Commit did.
func (wt windowTrack[R]) lateScope(ctx context.Context, pos *uint64) context.Context {
	if !wt.on {
		return ctx
	}
	return wt.s.scope(ctx, pos)
}

func (wt windowTrack[R]) lateDone(pos uint64, rec DeadLetter[struct{}]) {
	if wt.on {
		wt.s.setAside(pos, &ackMark{dl: rec})
	}
}

// hungry is closed while the checkpointed source waits for a save; holdsHead tells
// whether the positions held keep that save back (moved closes when that may change).
func (wt windowTrack[R]) hungry() <-chan struct{} { return wt.s.hungry() }

func (wt windowTrack[R]) holdsHead(poss []uint64) (bool, <-chan struct{}) {
	return wt.s.holdsHead(poss)
}
