package pipeline

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"reflect"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"
)

// This file is the machinery of [Window]: one goroutine (windower) with its own input
// queue, the windows it holds (a hash table per start, or sessions per key), and a
// heap of them by the event time at which each must act (fire an open window, forget a
// fired one). See DESIGN.md, "Windows".

// win is one window held: open, or fired and kept for late items (fired). Its value and
// count are in its bucket's entry (b, slot: tumbling and sliding windows) or in own
// (sessions): see hot.
type win[K comparable, V any] struct {
	b          *bucket[K, V]
	slot       int
	key        K
	start, end int64    // nanoseconds since the epoch, [start, end)
	owns       int      // items whose last window this is: held until it fires; not kept in a fast stage (see owned)
	poss       []uint64 // positions folded since the last result (tracked runs)
	all        []uint64 // every member position while it is kept for late items: the share closing settles
	fired      bool
	due        int64     // when it must act: end while open, end + retention once fired
	seq        uint64    // opening order: ties of due
	idx        int       // in the heap, -1 when out of it
	own        winHot[V] // a session's value and count (unused by a bucket's window)
}

// winHot is what folding an item into a window reads and writes: its value, and c, the
// count of items folded plus one (0 marks a free entry of a bucket).
type winHot[V any] struct {
	val V
	c   int
}

// hot returns the window's value and count. For a bucket's window the pointer (and
// wn.slot) holds until the bucket's next add, which may grow its table, or remove, which
// may move entries: hold neither across open, fire, forget, emit or send.
func (wn *win[K, V]) hot() *winHot[V] {
	if wn.b != nil {
		return &wn.b.ents[wn.slot].winHot
	}
	return &wn.own
}

// bucket is the tumbling or sliding windows that start at one time: a hash table of
// its own, open addressing with linear probing, whose entries hold each key with its
// window's value and count, so that folding an item reads a few adjacent entries (2.5
// on average at the most, the table being at most 3/4 full), one or two cache lines. A
// Go map from the key to the window cost S9 a second line per item, which the items of
// other keys push out of a 32 KiB L1 before the key's next item, and half as many
// instructions again (BenchmarkS9Window; DESIGN.md, "Windows"). The table grows by half
// when it is 3/4 full; a window forgotten leaves no tombstone (backward-shift
// deletion), so a bucket reused for a later start finds a table as clean as a new one.
type bucket[K comparable, V any] struct {
	seed maphash.Seed
	word bool   // K is an integer of 64 bits: hashed by wordHash
	wsd  uint64 // wordHash's seed, drawn from seed
	ents []bucketEnt[K, V]
	wins []*win[K, V] // the window of each entry
	n    int          // entries in use
}

type bucketEnt[K comparable, V any] struct {
	key K
	winHot[V]
}

func newBucket[K comparable, V any](seed maphash.Seed) *bucket[K, V] {
	const size = 16
	var word bool
	switch reflect.TypeFor[K]().Kind() {
	case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64, reflect.Uintptr:
		word = unsafe.Sizeof(*new(K)) == 8
	}
	return &bucket[K, V]{seed: seed, word: word, wsd: maphash.Comparable(seed, uint64(0)), ents: make([]bucketEnt[K, V], size), wins: make([]*win[K, V], size)}
}

// hash returns k's hash. An integer key of 64 bits (the common customer or account
// id) is mixed here, in about 10 instructions, where maphash.Comparable's generic path
// and call to the runtime's hasher cost S9 26 an item.
func (b *bucket[K, V]) hash(k K) uint64 {
	if b.word {
		return wordHash(*(*uint64)(unsafe.Pointer(&k)), b.wsd)
	}
	return maphash.Comparable(b.seed, k)
}

// wordHash is splitmix64's finalizer of x and a seed: every bit of x moves every bit
// of the result, whose high bits pick the home (bucket.home).
func wordHash(x, seed uint64) uint64 {
	x ^= seed
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// home is where k's probe starts.
func (b *bucket[K, V]) home(k K) int {
	hi, _ := bits.Mul64(b.hash(k), uint64(len(b.ents)))
	return int(hi)
}

// find returns the entry of k, or -1.
func (b *bucket[K, V]) find(k K) int {
	ents := b.ents
	var h uint64 // hash's lines: with its call to maphash, hash is too large to be inlined
	if b.word {
		h = wordHash(*(*uint64)(unsafe.Pointer(&k)), b.wsd)
	} else {
		h = maphash.Comparable(b.seed, k)
	}
	hi, _ := bits.Mul64(h, uint64(len(ents))) // home, inline
	for i := int(hi); ; {
		e := &ents[i]
		if e.key == k && e.c != 0 {
			return i
		}
		if e.c == 0 {
			return -1
		}
		if i++; i == len(ents) {
			i = 0
		}
	}
}

// window returns the window of k that starts at the bucket's time, or nil.
func (b *bucket[K, V]) window(k K) *win[K, V] {
	if b == nil {
		return nil
	}
	if i := b.find(k); i >= 0 {
		return b.wins[i]
	}
	return nil
}

// add gives wn, of key k, an entry, its value init.
func (b *bucket[K, V]) add(k K, wn *win[K, V], init V) {
	if 4*(b.n+1) > 3*len(b.ents) {
		b.grow()
	}
	i := b.place(k)
	b.ents[i] = bucketEnt[K, V]{key: k, winHot: winHot[V]{val: init, c: 1}}
	b.wins[i] = wn
	wn.b, wn.slot = b, i
	b.n++
}

// place returns the free entry where k goes.
func (b *bucket[K, V]) place(k K) int {
	i := b.home(k)
	for b.ents[i].c != 0 {
		if i++; i == len(b.ents) {
			i = 0
		}
	}
	return i
}

func (b *bucket[K, V]) grow() {
	ents, wins := b.ents, b.wins
	n := len(ents) + len(ents)/2
	b.ents, b.wins = make([]bucketEnt[K, V], n), make([]*win[K, V], n)
	for i := range ents {
		if ents[i].c != 0 {
			j := b.place(ents[i].key)
			b.ents[j], b.wins[j] = ents[i], wins[i]
			wins[i].slot = j
		}
	}
}

// remove frees the entry of wn, and moves back the entries after it whose probe
// passed it, so that no probe needs a mark where it was.
func (b *bucket[K, V]) remove(wn *win[K, V]) {
	ents, wins := b.ents, b.wins
	i := wn.slot
	for j := i; ; {
		if j++; j == len(ents) {
			j = 0
		}
		if ents[j].c == 0 {
			break
		}
		// The entry at j may fill the hole at i unless its home is cyclically in (i, j].
		if h := b.home(ents[j].key); (i < j && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			ents[i], wins[i] = ents[j], wins[j]
			wins[i].slot = i
			i = j
		}
	}
	ents[i], wins[i] = bucketEnt[K, V]{}, nil
	b.n--
	wn.b = nil
}

// winHeap orders the windows held by due, then by opening: a binary min-heap whose
// windows know their index (idx). Its methods are its own rather than container/heap's,
// whose calls through an interface cost BenchmarkS9Window 5 % of its time (a window
// forgotten sifts down through about log2(windows held) levels).
type winHeap[K comparable, V any] []*win[K, V]

func (h winHeap[K, V]) less(i, j int) bool {
	a, b := h[i], h[j]
	if a.due != b.due {
		return a.due < b.due
	}
	return a.seq < b.seq
}

func (h winHeap[K, V]) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}

// up moves the window at j towards the root while it is less than its parent.
func (h winHeap[K, V]) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			return
		}
		h.swap(i, j)
		j = i
	}
}

// down moves the window at i0 towards the leaves of h[:n] while a child is less than
// it, and tells whether it moved.
func (h winHeap[K, V]) down(i0, n int) bool {
	i := i0
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if j2 := j + 1; j2 < n && h.less(j2, j) {
			j = j2
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}

// push adds wn.
func (h *winHeap[K, V]) push(wn *win[K, V]) {
	wn.idx = len(*h)
	*h = append(*h, wn)
	h.up(wn.idx)
}

// remove takes out the window at i.
func (h *winHeap[K, V]) remove(i int) {
	old := *h
	n := len(old) - 1
	if i != n {
		old.swap(i, n)
		if !old.down(i, n) {
			old.up(i)
		}
	}
	wn := old[n]
	old[n] = nil
	*h = old[:n]
	wn.idx = -1
}

// countDue returns how many windows are due at or before t: a walk of the subtrees
// whose roots are (a heap's children are never due before their parent).
func (h winHeap[K, V]) countDue(t int64) int {
	n := 0
	var buf [64]int // on the stack: a force at the bound may come with every new window
	for stack := append(buf[:0], 0); len(stack) > 0; {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i >= len(h) || h[i].due > t {
			continue
		}
		n++
		stack = append(stack, 2*i+1, 2*i+2)
	}
	return n
}

// fix restores the order after the due of the window at i changed.
func (h winHeap[K, V]) fix(i int) {
	if !h.down(i, len(h)) {
		h.up(i)
	}
}

type windower[T any, K comparable, V any] struct {
	consumer[T] // its input, its run of items, its tally and statistics
	ctx         context.Context
	name        string
	kind        WindowKind
	key         func(T) K
	at          func(T) time.Time
	agg         Aggregate[T, V]
	cfg         windowConfig
	late        func(context.Context, DeadLetter[T]) error
	down        outlet[WindowResult[K, V]]
	out         sender[WindowResult[K, V]]
	row         *row
	ws          *windowStats
	held        *atomic.Int64 // heldN, for the report's Window
	heldN       int64
	track       windowTrack[WindowResult[K, V]]
	wins        map[int64]*bucket[K, V] // tumbling and sliding, by start
	lastStart   int64                   // the start of the last bucket of wins looked up, and that bucket
	lastBucket  *bucket[K, V]
	scratch     []*win[K, V]       // the windows of the item being added
	freeWins    []*win[K, V]       // tumbling and sliding: windows forgotten, to reuse (at most max)
	freeBuckets []*bucket[K, V]    // buckets of wins emptied, to reuse with their room (cap: how many)
	seed        maphash.Seed       // of the buckets' tables
	sessions    map[K][]*win[K, V] // sessions of each key, by start, disjoint
	due         winHeap[K, V]
	count       int           // windows held
	max         int           // at most: this worker's share of WithMaxWindows
	inHand      bool          // the item being added is not counted yet
	fast        bool          // tumbling windows kept for no lateness: itemsTumbling
	sj          int           // itemsTumbling: the items of the run before it are counted started
	retain      time.Duration // how long a fired window is kept: the allowed lateness, or a session's gap
	wm          int64         // the watermark
	maxEvent    int64
	inputs      *inputTimes[T] // WithWatermarkPer: the watermark per input (nil: one for all)
	floor       int64          // windows ending at or before it were forgotten at the bound: their items are late
	seq         uint64
	// The idle clock: the watermark moves on from anchor by the time since last past
	// the idle timeout.
	last   time.Time
	anchor int64
	timer  *time.Timer
	// judged is the hunger already judged not to concern this stage, moved closes
	// when the head moves on after that judgement (as for a batch).
	judged, moved <-chan struct{}
	// Inline (window_inline.go; q is nil): the run, the consumer's end of input, the
	// run's items not started yet (for the report), the error that stopped the stage,
	// and the producer's sender the results go through.
	r        *run
	finished func()
	untaken  *atomic.Int64
	broken   error
	cur      *inlineSender[T, K, V]
}

// commit adds the tally to the statistics; inline, it also stores how many items of
// the run in hand are not started yet.
func (w *windower[T, K, V]) commit() {
	if w.untaken != nil {
		w.untaken.Store(int64(w.k - w.j))
	}
	w.consumer.commit()
}

func (w *windower[T, K, V]) loop() error {
	w.out = w.down(&hand{row: w.row, waits: []func(){w.started, w.commit, w.publish}}) // counts current while it waits
	w.track.s = &w.out
	returned := false
	defer func() {
		w.publish()
		if w.timer != nil {
			w.timer.Stop()
		}
		if !returned { // user code (key, at, the aggregate, downstream) panicked or exited: fail what is in hand
			w.started()
			w.t.discarded += int64(w.rest())
			w.commit()
			s := w.stats
			s.failed.add(s.received.load() - s.succeeded.load() - s.deadLettered.load() - s.failed.load() - s.discarded.load())
			w.out.drop()
		}
	}()
	err := w.take()
	returned = true
	if err != nil {
		w.out.drop() // the results it holds are never sent: counted so, their room given back
	}
	w.commit()
	return err
}

func (w *windower[T, K, V]) take() error {
	for {
		_, ok, err := w.consumer.take(w.ctx, chunk, 0, w.idle)
		if ok {
			if w.cfg.idle > 0 {
				w.last = time.Now()
				if w.inputs != nil {
					w.inputs.idle(w.last, w.cfg.idle)
				}
			}
			if err := w.items(); err != nil {
				return err
			}
			w.anchor = w.idleAnchor()
			w.publish() // before the results reach a reader of the report
			if err := w.out.flush(); err != nil {
				return err
			}
			continue
		}
		if err == nil { // the input ended
			if w.ctx.Err() != nil {
				return context.Cause(w.ctx)
			}
			return w.finish()
		}
		return err
	}
}

// items folds the run taken into its windows, firing those the watermark passes.
func (w *windower[T, K, V]) items() error {
	if w.fast {
		return w.itemsTumbling(nil)
	}
	for w.j < w.k {
		e := w.next()
		w.inHand = true
		if err := w.add(e.v, e.pos); err != nil {
			if w.inHand { // stopped before it was counted (waiting for room)
				w.t.failed++
				w.inHand = false
			}
			w.t.discarded += int64(w.rest())
			return err
		}
	}
	return nil
}

// itemsTumbling is items for tumbling windows kept for no lateness, the common case:
// an item whose window is open is folded in after one look-up, in this loop. The items
// of the run are marked started in one call (started), before anything that may wait
// and at the end of the run, rather than one by one; the rest go through addAt.
//
// With vals nil it folds the run taken, w.run[:w.k]; an inline stage
// (window_inline.go) gives it its producer's untracked values instead, read in place
// (w.k is len(vals)), which spares their copy into the run.
func (w *windower[T, K, V]) itemsTumbling(vals []T) error {
	size, delay := int64(w.kind.size), int64(w.cfg.maxDelay)
	at, key, fold, first := w.at, w.key, w.agg.fold, w.agg.first
	run := w.run[:w.k]
	if vals != nil {
		run = nil
	}
	w.sj = 1 // take counted the run's first item started
	// The state the loop reads per item, in locals, read again after anything else
	// may have changed it (addAt, fireDue).
	var (
		bStart, bound, due int64 // bound: a window must end after it to be open; due: the heap's first
		b                  *bucket[K, V]
	)
	reload := func() {
		bStart, b, bound, due = w.lastStart, w.lastBucket, max(w.floor, w.wm), math.MaxInt64
		if len(w.due) > 0 {
			due = w.due[0].due
		}
	}
	reload()
	for w.j < w.k {
		i := w.j
		w.j++
		var v *T
		pos := noPos
		if run != nil {
			it := &run[i]
			v, pos = &it.v, it.pos
		} else {
			v = &vals[i]
		}
		e := *v // one copy for the three calls (from *v, each made one of its own)
		t := at(e).UnixNano()
		k := key(e)
		var s int64
		if b != nil && t >= bStart && t < bStart+size { // the bucket in hand: no division
			s = bStart
		} else if s = t - t%size; s > t {
			s -= size
		}
		slot := -1
		if s+size > bound {
			if s != bStart || b == nil {
				if b = w.bucket(s); b != nil {
					bStart = s
				}
			}
			if b != nil {
				slot = b.find(k)
			}
		}
		if slot < 0 || b.ents[slot].c == 1 && first != nil { // a window to open, a late item, a first item to reduce
			w.started()
			v := e
			if run != nil {
				run[i] = item[T]{}
			}
			w.inHand = true
			if err := w.addAt(v, pos, k, t); err != nil {
				if w.inHand { // stopped before it was counted (waiting for room)
					w.t.failed++
					w.inHand = false
				}
				w.t.discarded += int64(w.rest())
				return err
			}
			reload()
			continue
		}
		h := &b.ents[slot]
		h.val = fold(h.val, e)
		h.c++ // and its owns (see owned)
		if pos != noPos {
			wn := b.wins[slot]
			wn.poss = append(wn.poss, pos)
		}
		w.heldN++
		w.t.succeeded++
		if w.j-w.sj >= startEvery {
			w.started()
		}
		wm := int64(math.MinInt64)
		if t > w.maxEvent {
			w.maxEvent = t
			wm = t - delay
		}
		if w.inputs != nil { // the least over the inputs instead
			wm = w.inputs.see(e, t, delay)
		}
		if wm > w.wm {
			w.wm = wm
			bound = max(bound, wm)
			if due <= wm {
				w.started()
				if err := w.fireDue(); err != nil {
					w.t.discarded += int64(w.rest())
					return err
				}
				reload()
			}
		}
	}
	w.started()
	clear(run)
	return nil
}

// startEvery is how many items itemsTumbling folds between two calls of started.
const startEvery = 16

// started marks the items of the run up to the one in hand as started (see
// itemsTumbling): their room in the queue is free.
func (w *windower[T, K, V]) started() {
	if w.fast && w.j > w.sj {
		if w.q != nil { // inline, the items have no room to give back
			w.q.started(w.id, w.j-w.sj)
		}
		w.sj = w.j
	}
}

// publish stores the figures the report reads.
func (w *windower[T, K, V]) publish() {
	w.held.Store(w.heldN)
	w.ws.open.Store(int64(w.count))
	w.ws.wm.Store(w.wm)
	w.ws.maxEvent.Store(w.maxEvent)
}

// add folds v into its windows (or sets it aside, late), then moves the watermark on.
func (w *windower[T, K, V]) add(v T, pos uint64) error {
	t := w.at(v).UnixNano()
	return w.addAt(v, pos, w.key(v), t)
}

// addAt is add of an item whose key is k and event time t.
func (w *windower[T, K, V]) addAt(v T, pos uint64, k K, t int64) error {
	var err error
	if w.kind.gap > 0 {
		err = w.addSession(v, k, t, pos)
	} else {
		err = w.addAligned(v, k, t, pos)
	}
	if err != nil {
		return err
	}
	wm := int64(math.MinInt64)
	if t > w.maxEvent {
		w.maxEvent = t
		wm = t - int64(w.cfg.maxDelay)
	}
	if w.inputs != nil { // the least over the inputs instead
		wm = w.inputs.see(v, t, int64(w.cfg.maxDelay))
	}
	if wm > w.wm {
		w.wm = wm
		return w.fireDue()
	}
	return nil
}

// addAligned folds v into each tumbling or sliding window that holds t.
func (w *windower[T, K, V]) addAligned(v T, k K, t int64, pos uint64) error {
	size, slide := int64(w.kind.size), int64(w.kind.slide)
	last := floorDiv(t, slide) * slide
	first := last - (size-1-(t-last))/slide*slide // the earliest start s with s > t - size
	// One window, open, and no lateness: the common case, in short.
	if first == last && w.retain == 0 {
		if e0 := first + size; e0 > w.floor && e0 > w.wm {
			if wn := w.bucket(first).window(k); wn != nil {
				w.foldLast(wn, v, pos)
				return nil
			}
		}
	}
	n := int((last-first)/slide) + 1
	wns := w.scratch[:0]
	for {
		if e0 := first + size; e0 <= w.floor || e0+int64(w.retain) <= w.wm {
			return w.setLate(v, pos, t)
		}
		wns = wns[:0]
		need := 0
		for s := first; s <= last; s += slide {
			wn := w.bucket(s).window(k)
			if wn == nil {
				need++
			}
			wns = append(wns, wn)
		}
		if need == 0 || w.count+need <= w.max || w.count == 0 { // nothing open to fire: Window's check keeps need within max
			break
		}
		if err := w.makeRoom(); err != nil {
			return err
		}
	}
	w.scratch = wns
	if pos != noPos {
		if w.retain > 0 {
			w.track.fellInto(pos, 2*n)
		} else {
			w.track.fellInto(pos, n)
		}
	}
	w.t.succeeded++
	w.inHand = false
	for i, s := 0, first; s <= last; i, s = i+1, s+slide {
		wn := wns[i]
		if wn == nil {
			wn = w.open(k, s, s+size)
			b := w.bucket(s)
			if b == nil {
				if n := len(w.freeBuckets); n > 0 { // emptied, with the room of a bucket of its time
					b = w.freeBuckets[n-1]
					w.freeBuckets[n-1] = nil
					w.freeBuckets = w.freeBuckets[:n-1]
				} else {
					b = newBucket[K, V](w.seed)
				}
				w.wins[s] = b
				w.lastStart, w.lastBucket = s, b
			}
			b.add(k, wn, w.agg.init)
		}
		w.fold(wn, v, pos)
		if w.retain > 0 && pos != noPos {
			wn.all = append(wn.all, pos)
		}
		switch {
		case wn.fired: // within the allowed lateness: the window again, updated
			if err := w.emit(wn, true); err != nil {
				return err
			}
		case s == last:
			wn.owns++
			w.heldN++
		}
		if !wn.fired && wn.end <= w.wm { // opened behind the watermark, within the lateness
			if err := w.fire(wn); err != nil {
				return err
			}
		}
	}
	clear(wns)
	return nil
}

// bucket returns the windows that start at s (nil when there are none): an in-order
// input looks up the same bucket item after item.
func (w *windower[T, K, V]) bucket(s int64) *bucket[K, V] {
	if s == w.lastStart && w.lastBucket != nil {
		return w.lastBucket
	}
	b := w.wins[s]
	if b != nil {
		w.lastStart, w.lastBucket = s, b
	}
	return b
}

// addSession folds v into the session of its key that t reaches, merging the sessions
// it bridges, or opens one.
func (w *windower[T, K, V]) addSession(v T, k K, t int64, pos uint64) error {
	gap := int64(w.kind.gap)
	var lo, hi int // the sessions [lo, hi) of k that [t, t+gap) overlaps
	for {
		if t+gap <= w.wm || t < w.floor {
			return w.setLate(v, pos, t)
		}
		list := w.sessions[k]
		lo = 0
		for lo < len(list) && list[lo].end <= t {
			lo++
		}
		hi = lo
		for hi < len(list) && list[hi].start < t+gap {
			if list[hi].fired { // it reaches a session that fired
				return w.setLate(v, pos, t)
			}
			hi++
		}
		if hi > lo || w.count < w.max {
			break
		}
		if err := w.makeRoom(); err != nil {
			return err
		}
	}
	list := w.sessions[k]
	var s *win[K, V]
	if hi == lo {
		s = w.open(k, t, t+gap)
		w.sessions[k] = slices.Insert(list, lo, s)
	} else {
		s = list[lo]
		for _, o := range slices.Clone(list[lo+1 : hi]) { // forget shifts the list
			s.own.val = w.agg.merge(s.own.val, o.own.val)
			s.own.c += o.own.c - 1
			s.owns += o.owns
			s.poss = append(s.poss, o.poss...)
			s.end = max(s.end, o.end)
			o.owns = 0
			w.forget(o, false)
		}
		s.start, s.end = min(s.start, t), max(s.end, t+gap)
		s.due = s.end
		w.due.fix(s.idx)
	}
	w.foldLast(s, v, pos)
	return nil
}

// open makes a window [start, end) of k and schedules it.
func (w *windower[T, K, V]) open(k K, start, end int64) *win[K, V] {
	w.seq++
	var wn *win[K, V]
	if n := len(w.freeWins); n > 0 {
		wn = w.freeWins[n-1]
		w.freeWins[n-1] = nil
		w.freeWins = w.freeWins[:n-1]
	} else {
		wn = new(win[K, V])
	}
	*wn = win[K, V]{key: k, start: start, end: end, due: end, seq: w.seq, idx: -1}
	if w.kind.gap > 0 { // a session: its value is its own (a bucket's window's is its entry, bucket.add)
		wn.own = winHot[V]{val: w.agg.init, c: 1}
	}
	w.due.push(wn)
	w.count++
	return wn
}

func (w *windower[T, K, V]) fold(wn *win[K, V], v T, pos uint64) {
	h := wn.hot()
	if h.c == 1 && w.agg.first != nil {
		h.val = w.agg.first(v)
	} else {
		h.val = w.agg.fold(h.val, v)
	}
	h.c++
	if pos != noPos {
		wn.poss = append(wn.poss, pos)
	}
}

// foldLast folds the item in hand into wn, the only window it falls into (so its last),
// and counts it: succeeded, and held until wn fires.
func (w *windower[T, K, V]) foldLast(wn *win[K, V], v T, pos uint64) {
	w.fold(wn, v, pos)
	wn.owns++
	w.heldN++
	w.t.succeeded++
	w.inHand = false
}

// fireDue fires the open windows, and forgets the fired ones, that the watermark
// passed, in order of due.
func (w *windower[T, K, V]) fireDue() error {
	for len(w.due) > 0 && w.due[0].due <= w.wm {
		wn := w.due[0]
		if wn.fired {
			w.forget(wn, true)
			continue
		}
		if err := w.fire(wn); err != nil {
			return err
		}
	}
	return nil
}

// owned is how many items wn holds: whose last window it is, not fired yet.
// itemsTumbling does not count them in owns: in a fast stage every item is in one
// window, which is forgotten once it fires, so those of a window are its count.
func (w *windower[T, K, V]) owned(wn *win[K, V]) int {
	if w.fast {
		return wn.hot().c - 1
	}
	return wn.owns
}

// fire emits an open window's first result, then keeps it for late items (due again
// at end + retention) or forgets it. A window forgotten is forgotten before its result
// is sent, so that a reader who has the result sees it no longer counted open.
func (w *windower[T, K, V]) fire(wn *win[K, V]) error {
	wn.fired = true
	w.heldN -= int64(w.owned(wn))
	wn.owns = 0
	res, pos := w.result(wn, false)
	if w.retain > 0 {
		wn.due = wn.end + int64(w.retain)
		w.due.fix(wn.idx)
	} else {
		w.forget(wn, true)
	}
	return w.send(res, pos)
}

// emit sends the result of a window the stage keeps.
func (w *windower[T, K, V]) emit(wn *win[K, V], update bool) error {
	return w.send(w.result(wn, update))
}

// result is the window's result, carrying the positions folded since the last one.
func (w *windower[T, K, V]) result(wn *win[K, V], update bool) (WindowResult[K, V], uint64) {
	h := wn.hot()
	res := WindowResult[K, V]{
		Key: wn.key, Start: time.Unix(0, wn.start).UTC(), End: time.Unix(0, wn.end).UTC(),
		Value: h.val, Count: h.c - 1, Update: update,
	}
	pos := w.track.result(wn.poss)
	wn.poss = nil
	if update {
		w.ws.updates.Add(1)
	}
	return res, pos
}

// send sends a result on. The count of windows held is published first: the sender
// may hand the result on at once (inline, to the producer's sender; queued, when its
// run is full), and the report must not count open a window whose result is out.
func (w *windower[T, K, V]) send(res WindowResult[K, V], pos uint64) error {
	if w.q == nil {
		w.publish()
	} else {
		w.ws.open.Store(int64(w.count))
	}
	err := w.out.put(res, pos)
	w.t.emitted++ // sent, or counted unsent by put
	return err
}

// forget drops a window from the stage's state; closed settles the share of its items
// it kept for late items.
func (w *windower[T, K, V]) forget(wn *win[K, V], closed bool) {
	if wn.idx >= 0 {
		w.due.remove(wn.idx)
	}
	w.count--
	if w.kind.gap > 0 {
		list := w.sessions[wn.key]
		if i := slices.Index(list, wn); i >= 0 {
			list = slices.Delete(list, i, i+1)
		}
		if len(list) == 0 {
			delete(w.sessions, wn.key)
		} else {
			w.sessions[wn.key] = list
		}
	} else {
		b := w.wins[wn.start]
		b.remove(wn)
		if b.n == 0 {
			delete(w.wins, wn.start)
			if w.lastStart == wn.start {
				w.lastBucket = nil
			}
			if len(w.freeBuckets) < cap(w.freeBuckets) {
				w.freeBuckets = append(w.freeBuckets, b)
			}
		}
	}
	if closed {
		w.track.closed(wn.all)
	}
	wn.all = nil
	if w.kind.gap == 0 && len(w.freeWins) < w.max {
		// Nothing refers to it any more: the next window opened reuses it. A session
		// merged into another may still be looked at by its caller: never reused.
		var zero win[K, V]
		*wn = zero
		wn.idx = -1
		w.freeWins = append(w.freeWins, wn)
	}
}

// makeRoom acts on the window due first, the stage being at its bound: it fires it
// (the watermark moves to its end) or, fired already, forgets it (its items are late
// from now on); with WithWindowBackpressure it waits for the idle clock instead.
func (w *windower[T, K, V]) makeRoom() error {
	if w.cfg.backpressure {
		return w.waitRoom()
	}
	return w.force()
}

// force acts on the window due first before its time, and on every other window its
// due moves the watermark past: each counts in Forced.
func (w *windower[T, K, V]) force() error {
	wn := w.due[0]
	if wn.fired {
		w.ws.forced.Add(1)
		w.floor = max(w.floor, wn.end)
		w.forget(wn, true)
		return nil
	}
	w.wm = max(w.wm, wn.due)
	w.ws.forced.Add(int64(w.due.countDue(w.wm)))
	return w.fireDue()
}

// idleAnchor is the watermark the idle clock moves on from: the stage's or, while a
// watermark per input has not moved (an input sent nothing yet), the one the greatest
// event time gives (MinInt64: none).
func (w *windower[T, K, V]) idleAnchor() int64 {
	if w.wm == math.MinInt64 && w.maxEvent != math.MinInt64 {
		return w.maxEvent - int64(w.cfg.maxDelay)
	}
	return w.wm
}

// idleAt is when the idle clock brings the watermark to the due of the window due
// first, and what the watermark is at now.
func (w *windower[T, K, V]) idleAt() time.Time {
	return w.last.Add(w.cfg.idle + time.Duration(w.due[0].due-w.anchor))
}

func (w *windower[T, K, V]) idleTick() error {
	if w.anchor == math.MinInt64 { // no watermark to move on from
		return nil
	}
	if wm := w.anchor + int64(time.Since(w.last)-w.cfg.idle); wm > w.wm {
		w.wm = wm
	}
	return w.fireDue()
}

// waitRoom waits, taking no input, until the idle clock brings the window due first to
// its time, and acts on it.
func (w *windower[T, K, V]) waitRoom() error {
	if err := w.out.flush(); err != nil { // publish before wait
		return err
	}
	w.commit()
	w.publish()
	// Each wait is an idle period of its own, from the watermark as it is now: a second
	// wait in one run of items must not count again the idle time the first one used.
	w.anchor, w.last = w.idleAnchor(), time.Now()
	if w.anchor == math.MinInt64 { // no watermark for the clock to move on: fire early
		return w.force()
	}
	t := w.idleTimer(time.Until(w.idleAt()))
	select {
	case <-t:
	case <-w.ctx.Done():
		return context.Cause(w.ctx)
	}
	return w.idleTick()
}

func (w *windower[T, K, V]) idleTimer(d time.Duration) <-chan time.Time {
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	return w.timer.C
}

// idle waits, parked, for input, for the idle clock to bring a window to its time, for
// a checkpointed source that waits for a save that needs items the windows hold, or for
// the run to stop (see consumer.take).
func (w *windower[T, K, V]) idle(wake <-chan struct{}) (bool, error) {
	var tick <-chan time.Time
	if w.cfg.idle > 0 && len(w.due) > 0 && !w.last.IsZero() && w.anchor != math.MinInt64 {
		tick = w.idleTimer(time.Until(w.idleAt()))
		defer w.timer.Stop()
	}
	var hungry, headMoved <-chan struct{}
	if w.track.on && w.count > 0 {
		if hungry = w.track.hungry(); hungry == w.judged {
			hungry, headMoved = nil, w.moved
		}
	}
	act := func(err error) (bool, error) {
		w.publish()
		if err == nil {
			err = w.out.flush()
		}
		return false, err
	}
	select {
	case <-wake:
		return true, nil
	case <-tick:
		return act(w.idleTick())
	case <-headMoved:
		w.judged, w.moved = nil, nil
		return false, nil
	case <-hungry:
		var holds bool
		if holds, w.moved = w.track.holdsHead(w.positions()); !holds {
			w.judged = hungry // wait for input or the head to move; then judge again
			return false, nil
		}
		w.moved = nil
		return act(w.force())
	case <-w.ctx.Done():
		return false, context.Cause(w.ctx)
	}
}

// positions returns the positions the windows hold unsettled.
func (w *windower[T, K, V]) positions() []uint64 {
	var poss []uint64
	for _, wn := range w.due {
		poss = append(poss, wn.poss...)
		poss = append(poss, wn.all...)
	}
	return poss
}

// finish fires every open window left, in order of due, and forgets every window: the
// input ended.
func (w *windower[T, K, V]) finish() error {
	for len(w.due) > 0 {
		wn := w.due[0]
		if wn.fired {
			w.forget(wn, true)
			continue
		}
		wn.fired = true
		w.heldN -= int64(w.owned(wn))
		wn.owns = 0
		res, pos := w.result(wn, false)
		w.forget(wn, true) // before the result is out (see send)
		if err := w.send(res, pos); err != nil {
			return err
		}
	}
	w.publish()
	return w.out.flush()
}

// setLate sets a late item aside: to WithLateItems' destination, or, without one, it
// fails the run with ErrLate.
func (w *windower[T, K, V]) setLate(v T, pos uint64, t int64) error {
	w.ws.late.Add(1)
	msg := fmt.Sprintf("%v: event time %s, watermark %s", ErrLate,
		time.Unix(0, t).UTC().Format(time.RFC3339Nano), time.Unix(0, w.wm).UTC().Format(time.RFC3339Nano))
	if w.late == nil {
		w.t.failed++
		w.inHand = false
		w.row.addError("late", func(e *ErrorCount) { e.Failed++ })
		return &StageError{Stage: w.name, Err: fmt.Errorf("%w%s", ErrLate, msg[len(ErrLate.Error()):])}
	}
	rec := DeadLetter[T]{
		Stage: w.name, Item: v, Class: ClassItem, ErrType: "late",
		FirstError: msg, LastError: msg, Time: time.Now(),
	}
	if err := w.out.flush(); err != nil { // the destination may wait: publish first
		w.t.failed++
		w.inHand = false
		return err
	}
	w.commit()
	w.publish()
	if err := w.late(w.track.lateScope(w.ctx, &pos), rec); err != nil {
		w.t.failed++
		w.inHand = false
		if w.ctx.Err() != nil { // the run stopped meanwhile: its cause, not the destination's echo
			return context.Cause(w.ctx)
		}
		return &StageError{Stage: w.name, Err: fmt.Errorf("late-item destination: %w", err)}
	}
	w.track.lateDone(pos, stripItem(rec))
	w.t.deadLettered++
	w.inHand = false
	w.row.addCause("late", causeMessage(ErrLate))
	w.row.addError("late", func(e *ErrorCount) { e.DeadLettered++ })
	return nil
}

// floorDiv is a / b rounded towards minus infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}
