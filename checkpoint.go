package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CheckpointStore keeps a pipeline's progress: the position of the first source item
// whose effects are not all committed. Load returns 0 when nothing was saved yet; a
// negative position is an error that fails the run. Save
// must be atomic: after a crash, Load returns either the previous or the new position.
type CheckpointStore interface {
	Load(ctx context.Context) (int64, error)
	Save(ctx context.Context, pos int64) error
}

// FileCheckpoint is a [CommittedStore] in a file: the position in decimal on the first
// line, then one line "from to" per range of positions settled above it (committed,
// dead-lettered or filtered out), so that a resumed run skips them. A file of an
// earlier release, the position alone, reads as a position with no ranges. Each save
// writes a temporary file in the same directory, syncs it, renames it over the file and
// syncs the directory, so that the file always holds a whole save. It is safe for
// concurrent use.
type FileCheckpoint struct {
	mu   sync.Mutex
	path string
}

// NewFileCheckpoint returns a store at path; the file need not exist yet.
func NewFileCheckpoint(path string) *FileCheckpoint { return &FileCheckpoint{path: path} }

// Load implements [CheckpointStore].
func (f *FileCheckpoint) Load(ctx context.Context) (int64, error) {
	pos, _, err := f.LoadCommitted(ctx)
	return pos, err
}

// LoadCommitted implements [CommittedStore].
func (f *FileCheckpoint) LoadCommitted(context.Context) (int64, []PositionRange, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.load()
}

// load reads the file; f.mu must be held.
func (f *FileCheckpoint) load() (int64, []PositionRange, error) {
	b, err := os.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	bad := func() (int64, []PositionRange, error) {
		return 0, nil, fmt.Errorf("pipeline: checkpoint %s holds %q, not a position", f.path, b)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	pos, err := strconv.ParseInt(strings.TrimSpace(lines[0]), 10, 64)
	if err != nil || pos < 0 {
		return bad()
	}
	var ranges []PositionRange
	for _, l := range lines[1:] {
		// Two numbers and nothing else: Sscanf took "5 10junk" for the range [5, 10).
		from, to, ok := strings.Cut(strings.TrimSpace(l), " ")
		r := PositionRange{}
		r.From, err = strconv.ParseInt(from, 10, 64)
		if !ok || err != nil {
			return bad()
		}
		if r.To, err = strconv.ParseInt(to, 10, 64); err != nil || r.From < 0 || r.To <= r.From {
			return bad()
		}
		ranges = append(ranges, r)
	}
	return pos, ranges, nil
}

// Save implements [CheckpointStore]: it writes pos and keeps the ranges above it.
func (f *FileCheckpoint) Save(ctx context.Context, pos int64) error {
	return f.SaveCommitted(ctx, pos, nil)
}

// SaveCommitted implements [CommittedStore]: it writes the larger of pos and the stored
// position, and the union of committed and the ranges the file held, above it.
func (f *FileCheckpoint) SaveCommitted(_ context.Context, pos int64, committed []PositionRange) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, ranges, err := f.load()
	if err != nil {
		return err
	}
	pos = max(pos, old) // never back: a position is only ever saved after what it covers settled
	var b strings.Builder
	b.WriteString(strconv.FormatInt(pos, 10) + "\n")
	for _, r := range mergeRanges(committed, ranges, pos) {
		fmt.Fprintf(&b, "%d %d\n", r.From, r.To)
	}
	dir := filepath.Dir(f.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(f.path)+".tmp*")
	if err != nil {
		return err
	}
	// After a successful rename there is nothing left to remove: the error is expected.
	defer func() { _ = os.Remove(tmp.Name()) }()
	_, err = tmp.WriteString(b.String())
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), f.path)
	}
	if err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// WithSaveEvery makes a checkpointed run ([FromCheckpoint]) save its position each time it has
// advanced by n items. It panics if n < 1. The default is 1000.
func WithSaveEvery(n int) CheckpointOption {
	if n < 1 {
		panic(fmt.Sprintf("pipeline: WithSaveEvery(%d): need at least 1", n))
	}
	return checkpointOpt(func(c *config) { c.saveEvery = n })
}

// WithMaxRedo bounds the work a crash can cost: the checkpointed source ([FromCheckpoint])
// waits whenever it is n items past the last saved position, so that a resume redoes at
// most n items. n must be more than [WithSaveEvery]'s count, or FromCheckpoint panics. The
// default is the save count plus the pipeline's capacity in flight (the sum, over its
// stages, of queue size, workers, reorder window and partial batch), which never slows
// a run whose items all settle in time; a smaller n trades throughput for less redo
// when a straggler holds the watermark back.
func WithMaxRedo(n int) CheckpointOption {
	if n < 1 {
		panic(fmt.Sprintf("pipeline: WithMaxRedo(%d): need at least 1", n))
	}
	return checkpointOpt(func(c *config) { c.maxRedo = n })
}

// WithSaveInterval makes a checkpointed run ([FromCheckpoint]) also save its position every d,
// when it has advanced. It panics if d <= 0. The default is 1 s.
func WithSaveInterval(d time.Duration) CheckpointOption {
	if d <= 0 {
		panic(fmt.Sprintf("pipeline: WithSaveInterval(%v): need a positive interval", d))
	}
	return checkpointOpt(func(c *config) { c.saveInterval = d })
}

// FromCheckpoint returns a checkpointed source: the source of a job that can stop or
// crash and start again where it left off, its first run included. At the start of each
// run, the run loads the position from store and calls from(ctx, pos), which must yield
// the source's items from position pos on: the item at position k is the k-th item of the input (0-based)
// in a fixed order, such as a line of a file or a row in key order. An error from
// from's sequence fails the run.
//
// The run tracks every item derived from each position through the stages (flat-map
// outputs, batches, tees) and saves the watermark: the end of the longest prefix of
// positions whose items all settled. An item settles when a sink's function returns nil
// for it (its effect is committed), when it is dead-lettered, or when it is filtered
// out; an item that failed, or was never started, holds the watermark back. The
// position is saved every [WithSaveEvery] items and [WithSaveInterval], and once more
// when the run ends, however it ends; a failing Save fails the run.
//
// After a crash, the next run redoes the items after the saved position: at most
// [WithMaxRedo] items, by default the save count plus the items in flight (in queues,
// workers, reorder windows and batches). Sinks must therefore be idempotent: write with
// a key derived from the item (an upsert, a file named by the item's id) rather than
// appending. The watermark takes
// a mutex per settled item.
//
// A pipeline has at most one checkpointed source; FromCheckpoint panics on a
// second one.
func FromCheckpoint[T any](p *Pipeline, store CheckpointStore, from func(ctx context.Context, pos int64) iter.Seq2[T, error], opts ...CheckpointOption) *Stream[T] {
	if store == nil || from == nil {
		panic("pipeline: FromCheckpoint needs a store and a function")
	}
	if p != nil && (p.ck != nil || p.ack != nil) {
		panic("pipeline: FromCheckpoint: the pipeline already has a tracked source (FromCheckpoint or FromAcked)")
	}
	cfg := configure("FromCheckpoint", opts, CheckpointOption.checkpointOption)
	if cfg.saveEvery == 0 {
		cfg.saveEvery = 1000
	}
	if cfg.saveInterval == 0 {
		cfg.saveInterval = time.Second
	}
	var start func() int64
	s := newSourceNamed(p, "FromCheckpoint", cfg.name, nil, cfg.total, false, nil, func(ctx context.Context, emit func(T) error) error {
		for v, err := range from(ctx, start()) {
			if err != nil {
				return err
			}
			if err := emit(v); err != nil {
				return err
			}
		}
		return nil
	})
	if cfg.maxRedo != 0 && cfg.maxRedo <= cfg.saveEvery {
		panic(fmt.Sprintf("pipeline: FromCheckpoint: WithMaxRedo(%d) must be more than the save count %d", cfg.maxRedo, cfg.saveEvery))
	}
	p.ck = &checkpointCfg{store: store, every: cfg.saveEvery, interval: cfg.saveInterval, maxRedo: cfg.maxRedo, source: s, lag: cfg.lag}
	start = func() int64 { return p.ck.loaded }
	return s
}

type checkpointCfg struct {
	store    CheckpointStore
	every    int
	interval time.Duration
	maxRedo  int
	source   any                   // the *Stream of the checkpointed source
	lag      func() []PartitionLag // WithLag (lag.go), nil without
	loaded   int64                 // the position loaded for the current run
}

// checkpointTracker is a checkpointed run's [tracker]: the watermark over the source's
// positions, the saves, and what [Commit] needs to know (commit.go).
type checkpointTracker struct {
	lineage        // refs, groups and the source's wait (tracker.go), under mu
	start   uint64 // the first position of the run

	next    uint64              // every position below is settled
	settled map[uint64]struct{} // settled positions above next
	since   int                 // positions settled since the last poke
	every   int                 // poke the saver after this many
	poke    chan struct{}       // the saver's wake-up, capacity 1
	saved   uint64              // the position saved last
	limit   uint64              // the source stays below saved+limit (WithMaxRedo)
	// moved is closed when next advances; made only when a batch that judged a wait not
	// to concern it watches for the head to move (it may then hold the new head).
	moved chan struct{}
	skip  []PositionRange // committed above start in an earlier run (commit.go); the source's own
	prior []PositionRange // the same ranges, kept whole for every save (commit.go)
	// above counts the positions that settled above next: a save of a CommittedStore
	// is due when it changed since savedAbove (the saver's, then finish's, in turn).
	above, savedAbove uint64
	// committing counts the Commits whose function runs, per node their preview walked;
	// commitWake is closed when one ends, made only when a Commit waits (commit.go).
	committing map[uint64]int
	commitWake chan struct{}
}

func newCheckpointTracker(start uint64, every int) *checkpointTracker {
	t := &checkpointTracker{
		start: start, next: start, every: every, saved: start, limit: ^uint64(0) >> 1,
		settled: map[uint64]struct{}{}, poke: make(chan struct{}, 1),
	}
	t.init()
	return t
}

// split implements [tracker].
func (t *checkpointTracker) split(pos uint64, k int) {
	if t.refer(pos, k) {
		t.settle(pos)
	}
}

// ungroup implements [tracker].
func (t *checkpointTracker) ungroup(pos uint64, n int) []uint64 {
	m, now := t.members(pos, n)
	if now {
		t.settle(pos)
	}
	return m
}

// settle implements [tracker].
func (t *checkpointTracker) settle(pos uint64) {
	if pos == noPos {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.settleLocked(pos)
}

// settleAll implements [tracker].
func (t *checkpointTracker) settleAll(positions []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, pos := range positions {
		if pos != noPos {
			t.settleLocked(pos)
		}
	}
}

// setAside implements [tracker]: a dead-lettered item settles as a committed one.
func (t *checkpointTracker) setAside(pos uint64, _ *ackMark) { t.settle(pos) }

// settleLocked settles one item derived from pos; t.mu must be held. A position whose
// items have all settled goes into settled if it is above next; next itself advances
// the watermark over every settled position after it, and pokes the saver every
// `every` positions or while the source starves.
func (t *checkpointTracker) settleLocked(pos uint64) {
	for _, p := range t.unwindLocked(pos) {
		if p != t.next {
			t.settled[p] = struct{}{}
			t.above++
			continue
		}
		n := 1
		t.next++
		if t.moved != nil {
			close(t.moved)
			t.moved = nil
		}
		for {
			if _, ok := t.settled[t.next]; !ok {
				break
			}
			delete(t.settled, t.next)
			t.next++
			n++
		}
		t.since += n
		if t.since >= t.every || t.starving {
			t.since = 0
			t.pokeSaver()
		}
	}
}

// admit implements [tracker]: the source waits while pos >= saved+limit.
func (t *checkpointTracker) admit(ctx context.Context, pos uint64, _ func(Settlement)) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.waitLocked(ctx, func() bool { return pos >= t.saved+t.limit }, t.pokeSaver); err != nil {
		return 0, err
	}
	return t.saved + t.limit, nil
}

// markSaved records a saved position and wakes a waiting source.
func (t *checkpointTracker) markSaved(pos int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.saved = uint64(pos)
	t.openLocked()
}

// holdsHead implements [tracker]: positions hold the source back when they include the
// watermark's next position, or a batch of positions, which may. When they do not,
// moved is closed once the head moves on, when the batch must judge again (the item
// that held the head may have settled elsewhere: dead-lettered, filtered, or dropped
// by a flat stage).
func (t *checkpointTracker) holdsHead(positions []uint64) (holds bool, moved <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range positions {
		if p == t.next || p&groupBit != 0 || t.refs[p] > 0 {
			return true, nil
		}
	}
	if t.moved == nil {
		t.moved = make(chan struct{})
	}
	return false, t.moved
}

// handsBack implements [tracker]: a checkpointed source cannot take an item back.
func (*checkpointTracker) handsBack(uint64) bool { return false }

func (t *checkpointTracker) pokeSaver() {
	select {
	case t.poke <- struct{}{}:
	default:
	}
}

func (t *checkpointTracker) watermark() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(t.next)
}

// saver saves the watermark when poked or at each interval, until stop is closed.
// A failed save fails the run (r.fail); the saver then stops.
func (t *checkpointTracker) saver(ctx context.Context, store CheckpointStore, interval time.Duration, stop <-chan struct{}, r *run) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.poke:
		case <-tick.C:
		}
		if _, err := t.save(ctx, store, r); err != nil {
			if ctx.Err() == nil { // else the run stopped for another reason first
				r.fail(&StageError{Stage: "checkpoint", Err: err})
			}
			return
		}
	}
}

// finish implements [tracker]: it saves once more, with the parent context's values
// and no cancellation.
func (t *checkpointTracker) finish(r *run) error {
	if err := safely(func() error {
		_, err := t.save(context.WithoutCancel(r.parent), r.p.ck.store, r)
		return err
	}); err != nil {
		return &StageError{Stage: "checkpoint", Err: err}
	}
	return nil
}

// progress returns what a save records: the watermark, the ranges settled above it when
// ranges is set (those loaded at the start of the run included, for a CommittedStore),
// and the count of positions settled above the watermark so far, which changes
// whenever the ranges do.
func (t *checkpointTracker) progress(ranges bool) (w int64, above []PositionRange, n uint64) {
	t.mu.Lock()
	next, n := t.next, t.above
	var ps []uint64
	if ranges {
		ps = make([]uint64, 0, len(t.settled))
		for p := range t.settled {
			ps = append(ps, p)
		}
	}
	t.mu.Unlock()
	if !ranges {
		return int64(next), nil, n
	}
	slices.Sort(ps)
	for _, p := range ps {
		if k := len(above); k > 0 && above[k-1].To == int64(p) {
			above[k-1].To++
			continue
		}
		above = append(above, PositionRange{From: int64(p), To: int64(p) + 1})
	}
	return int64(next), mergeRanges(above, t.prior, int64(next)), n
}

// mergeRanges returns the union of a and b (each sorted by From), cut below from, with
// touching and overlapping ranges joined.
func mergeRanges(a, b []PositionRange, from int64) []PositionRange {
	all := make([]PositionRange, 0, len(a)+len(b))
	for _, r := range slices.Concat(a, b) {
		if r.From = max(r.From, from); r.From < r.To {
			all = append(all, r)
		}
	}
	slices.SortFunc(all, func(x, y PositionRange) int { return cmp.Compare(x.From, y.From) })
	out := all[:0]
	for _, r := range all {
		if k := len(out); k > 0 && r.From <= out[k-1].To {
			out[k-1].To = max(out[k-1].To, r.To)
			continue
		}
		out = append(out, r)
	}
	return out
}

// save saves the run's progress to store if it moved since the last save: the
// watermark, and for a [CommittedStore] the ranges settled above it. It is called by
// the saver, then once more by finish when the run has ended, never at once.
func (t *checkpointTracker) save(ctx context.Context, store CheckpointStore, r *run) (saved bool, err error) {
	cs, committed := store.(CommittedStore)
	w, above, n := t.progress(committed)
	last := r.saved.Load()
	if w == last && (!committed || n == t.savedAbove) {
		return false, nil
	}
	if committed {
		err = cs.SaveCommitted(ctx, w, above)
	} else {
		err = store.Save(ctx, w)
	}
	if err != nil {
		return false, err
	}
	t.savedAbove = n
	r.saved.Store(w)
	r.savedAt.Store(time.Now().UnixNano())
	t.markSaved(w)
	if w != last {
		r.emit(ctx, Event{Kind: EventCheckpoint, Stage: "checkpoint", Position: w})
	}
	return true, nil
}
