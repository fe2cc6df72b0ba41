package pipeline_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/internal/scenario"
)

// from returns a FromCheckpoint function over the positions pos..n-1, yielding each position.
var from = scenario.Positions

// memStore is a CheckpointStore in memory that records every save.
type memStore struct {
	mu    sync.Mutex
	pos   int64
	saves []int64
	fail  error
}

func (m *memStore) Load(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pos, nil
}

func (m *memStore) Save(_ context.Context, pos int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.pos = pos
	m.saves = append(m.saves, pos)
	return nil
}

// memCommitted is a CommittedStore in memory. A test's destination records the run's
// progress in it in the "transaction" of its Commit's fn (record, or recordLocked
// beside the effects it keeps under mu), as a database sink does. A crashed store
// loses every save, as a process killed before its first save does: only what a
// Commit recorded remains.
type memCommitted struct {
	mu        sync.Mutex
	pos       int64
	committed []pipeline.PositionRange
	crashed   bool
}

func (s *memCommitted) Load(ctx context.Context) (int64, error) {
	pos, _, err := s.LoadCommitted(ctx)
	return pos, err
}

func (s *memCommitted) LoadCommitted(context.Context) (int64, []pipeline.PositionRange, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pos, slices.Clone(s.committed), nil
}

func (s *memCommitted) Save(ctx context.Context, pos int64) error {
	return s.SaveCommitted(ctx, pos, nil)
}

func (s *memCommitted) SaveCommitted(_ context.Context, pos int64, committed []pipeline.PositionRange) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.crashed {
		s.advanceLocked(pos, committed)
	}
	return nil
}

// record is one "transaction" of a destination that writes nothing but the progress.
func (s *memCommitted) record(p pipeline.Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recordLocked(p)
}

// recordLocked records p, when the run is checkpointed; s.mu is held.
func (s *memCommitted) recordLocked(p pipeline.Progress) {
	if p.Checkpointed {
		s.advanceLocked(p.Watermark, p.Committed)
	}
}

// advanceLocked moves the position up to pos and keeps the committed ranges above it;
// s.mu is held.
func (s *memCommitted) advanceLocked(pos int64, committed []pipeline.PositionRange) {
	s.pos = max(s.pos, pos)
	s.committed = append(slices.DeleteFunc(s.committed, func(r pipeline.PositionRange) bool { return r.To <= s.pos }), committed...)
}

func TestFileCheckpointRoundTrip(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ck")
	fc := pipeline.NewFileCheckpoint(path)
	pos, err := fc.Load(t.Context())
	require.NoError(t, err)
	assert.Zero(t, pos)
	for _, want := range []int64{1, 42, 1 << 40} {
		require.NoError(t, fc.Save(t.Context(), want))
		got, err := fc.Load(t.Context())
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file is left behind")

	for _, bad := range []string{"not a number", "-1", "5\n10 7", "5\n10", "5\n10 20junk", "5\n10 20 30", "5\nx 20"} {
		require.NoError(t, os.WriteFile(path, []byte(bad), 0o644))
		_, err = fc.Load(t.Context())
		require.Error(t, err, "%q", bad)
	}
	require.NoError(t, os.WriteFile(path, []byte("5\n10 20\n30 31\n"), 0o644))
	got, ranges, err := fc.LoadCommitted(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(5), got)
	assert.Equal(t, []pipeline.PositionRange{{From: 10, To: 20}, {From: 30, To: 31}}, ranges)
}

// TestCheckpointCompleteRun checks that a run through every kind of derivation (flat
// outputs, filters, dead letters, batches, Flatten, unordered and ordered stages) saves
// the end of the input as its final position, and that each effect happened once.
func TestCheckpointCompleteRun(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{false, true} {
		const n = 3000
		store := &memStore{}
		p := pipeline.New(pipeline.WithBuffer(8))
		var opts []pipeline.StageOption
		if ordered {
			opts = append(opts, pipeline.WithOrdered(0))
		}
		src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(100))
		flat := pipeline.Then(src, pipeline.NewFlatStage("flat", 4, func(_ context.Context, v int, emit func(int)) error {
			switch {
			case v%11 == 0:
				return pipeline.Permanent(errors.New("eleven"))
			case v%7 == 0: // two outputs
				emit(v)
				emit(-v)
			case v%5 == 0: // none
			default:
				emit(v)
			}
			return nil
		}, append(opts, pipeline.WithDeadLetter(pipeline.NewDeadLetterBuffer[int](n).Add))...))
		kept := pipeline.Filter(flat, func(v int) bool { return v%3 != 0 })
		var mu sync.Mutex
		seen := map[int]int{}
		out := pipeline.Flatten(pipeline.Batch(kept, 16))
		pipeline.ToBatches(out, 10, pipeline.NewSink("sink", 2, func(_ context.Context, b []int) error {
			mu.Lock()
			defer mu.Unlock()
			for _, v := range b {
				seen[v]++
			}
			return nil
		}))
		require.NoError(t, p.Run(t.Context()))
		assert.Equal(t, int64(n), store.pos)
		assert.Equal(t, int64(n), p.Report().Checkpoint)
		for i := range n {
			switch {
			case i%11 == 0, i%5 == 0 && i%7 != 0:
				assert.Zero(t, seen[i], i)
			case i%7 == 0:
				if i%3 != 0 {
					assert.Equal(t, 1, seen[i], i)
					assert.Equal(t, 1, seen[-i], i)
				}
			case i%3 != 0:
				assert.Equal(t, 1, seen[i], i)
			}
		}
		for i := 1; i < len(store.saves); i++ {
			assert.Less(t, store.saves[i-1], store.saves[i], "positions only grow")
		}
	}
}

// TestCheckpointStopsAtFailure checks that the watermark never passes an item whose
// effect was not committed, and that resuming finishes the input.
func TestCheckpointStopsAtFailure(t *testing.T) {
	t.Parallel()
	const n, bad = 2000, 1234
	store := &memStore{}
	committed := map[int]bool{}
	var mu sync.Mutex
	build := func(failAt int) *pipeline.Pipeline {
		p := pipeline.New(pipeline.WithBuffer(4))
		src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(50))
		work := pipeline.Then(src, pipeline.NewStage("work", 4, func(_ context.Context, v int) (int, error) { return v, nil }))
		pipeline.To(work, pipeline.NewSink("sink", 3, func(_ context.Context, v int) error {
			if v == failAt {
				return errors.New("sink down")
			}
			mu.Lock()
			committed[v] = true
			mu.Unlock()
			return nil
		}))
		return p
	}
	err := build(bad).Run(t.Context())
	require.ErrorContains(t, err, "sink down")
	assert.LessOrEqual(t, store.pos, int64(bad), "the watermark passed the failed item")
	for i := range int(store.pos) {
		assert.True(t, committed[i], "position %d is below the watermark but was not committed", i)
	}
	require.NoError(t, build(-1).Run(t.Context()))
	assert.Equal(t, int64(n), store.pos)
	for i := range n {
		assert.True(t, committed[i], i)
	}
}

func TestCheckpointSaveFailureFailsRun(t *testing.T) {
	t.Parallel()
	errDisk := errors.New("disk full")
	store := &memStore{fail: errDisk}
	p := pipeline.New()
	pipeline.To(pipeline.FromCheckpoint(p, store, from(500), pipeline.WithSaveEvery(10)),
		pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	err := p.Run(t.Context())
	require.ErrorIs(t, err, errDisk)
	se, ok := errors.AsType[*pipeline.StageError](err)
	require.True(t, ok)
	assert.Equal(t, "checkpoint", se.Stage)
}

// TestCheckpointInterval checks, in virtual time, that a slow trickle of items is saved
// every interval even when fewer than WithSaveEvery items settled.
func TestCheckpointInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &memStore{}
		p := pipeline.New()
		src := pipeline.FromCheckpoint(p, store, from(10), pipeline.WithSaveEvery(1000), pipeline.WithSaveInterval(time.Second))
		slow := pipeline.Then(src, pipeline.NewStage("slow", 1, func(ctx context.Context, v int) (int, error) {
			time.Sleep(350 * time.Millisecond)
			return v, nil
		}))
		pipeline.To(slow, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		require.NoError(t, p.Run(t.Context()))
		// 10 items at 350 ms (never on a tick): saves at 1 s (2 done), 2 s (5), 3 s (8), then 10 at the end.
		assert.Equal(t, []int64{2, 5, 8, 10}, store.saves)
	})
}

func TestResumeMisuse(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	pipeline.FromCheckpoint(p, &memStore{}, from(1))
	assertPanicsPipeline(t, func() { pipeline.FromCheckpoint(p, &memStore{}, from(1)) })
	assertPanicsPipeline(t, func() { pipeline.FromCheckpoint[int](pipeline.New(), nil, from(1)) })
	assertPanicsPipeline(t, func() { pipeline.WithSaveEvery(0) })
	assertPanicsPipeline(t, func() { pipeline.WithSaveInterval(0) })
}

// The crash test: a child process (this test binary, re-run) checkpoints a pipeline into
// an idempotent sink (one file per id) and is killed with SIGKILL at random points, then
// resumed. In the end every effect is there exactly once, and each resume redid no more
// than the bound the docs promise.

const (
	crashItems  = 4000
	crashEvery  = 100 // WithSaveEvery
	crashBuf    = 4   // WithBuffer of every queue
	crashWork   = 4   // workers of the work stage
	crashBatch  = 25  // batch size into the sink
	crashSinkWk = 2   // sink workers
)

// crashMaxRedo is the most items a resume may redo (WithMaxRedo).
const crashMaxRedo = 2 * crashEvery

func TestCheckpointCrashChild(t *testing.T) {
	dir := os.Getenv("PIPELINE_CRASH_DIR")
	if dir == "" {
		t.Skip("run by TestCheckpointCrash as a child process")
	}
	log, err := os.OpenFile(filepath.Join(dir, "log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer func() { require.NoError(t, log.Close()) }()
	dl, err := pipeline.OpenDeadLetterFile[int](filepath.Join(dir, "dead.jsonl"), pipeline.WithSyncEvery(1))
	require.NoError(t, err)
	defer func() { require.NoError(t, dl.Close()) }()
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex

	p := pipeline.New(pipeline.WithBuffer(crashBuf))
	src := pipeline.FromCheckpoint(p, pipeline.NewFileCheckpoint(filepath.Join(dir, "checkpoint")), from(crashItems),
		pipeline.WithSaveEvery(crashEvery), pipeline.WithMaxRedo(crashMaxRedo))
	work := pipeline.Then(src, pipeline.NewStage("work", crashWork, func(_ context.Context, v int) (int, error) {
		if v%97 == 0 {
			return 0, pipeline.Permanent(fmt.Errorf("item %d is bad", v))
		}
		return v, nil
	}, pipeline.WithDeadLetter(dl.Add)))
	kept := pipeline.Filter(work, func(v int) bool { return v%13 != 0 })
	pipeline.ToBatches(kept, crashBatch, pipeline.NewSink("sink", crashSinkWk, func(_ context.Context, b []int) error {
		for _, v := range b {
			// The idempotent effect: a file named by the id.
			if err := os.WriteFile(filepath.Join(dir, "effects", strconv.Itoa(v)), nil, 0o644); err != nil {
				return err
			}
			if _, err := fmt.Fprintf(log, "%d\n", v); err != nil {
				return err
			}
		}
		outMu.Lock()
		defer outMu.Unlock()
		if _, err := fmt.Fprintf(out, "commit %d\n", len(b)); err != nil {
			return err
		}
		return out.Flush()
	}))
	require.NoError(t, p.Run(context.Background()))
	_, err = fmt.Fprintln(out, "finished")
	require.NoError(t, err)
	require.NoError(t, out.Flush())
}

func TestCheckpointCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "effects"), 0o755))
	rng := rand.New(rand.NewPCG(1, 2)) // deterministic kill points
	seen := map[int]bool{}
	logOffset := 0
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 20, "the job never finished")
		killAfter := -1 // commits to wait for before the kill; -1: let it finish
		if attempt < 6 {
			killAfter = 1 + rng.IntN(40)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestCheckpointCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "PIPELINE_CRASH_DIR="+dir)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		sc := bufio.NewScanner(stdout)
		commits, finished, killed := 0, false, false
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "commit ") {
				commits++
				if commits == killAfter {
					require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
					killed = true
					break
				}
			}
			if line == "finished" {
				finished = true
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		werr := cmd.Wait()
		if !killed {
			require.NoError(t, werr)
		}

		// What this run appended to the log: the redo is what earlier runs had done.
		data, err := os.ReadFile(filepath.Join(dir, "log"))
		require.NoError(t, err)
		redo := 0
		for f := range strings.FieldsSeq(string(data[logOffset:])) {
			id, err := strconv.Atoi(f)
			require.NoError(t, err)
			if seen[id] {
				redo++
			}
			seen[id] = true
		}
		logOffset = len(data)
		assert.LessOrEqual(t, redo, crashMaxRedo, "run %d redid %d items", attempt, redo)
		t.Logf("run %d: killed=%v commits=%d redo=%d (bound %d)", attempt, killed, commits, redo, crashMaxRedo)
		if finished {
			break
		}
	}
	// Every item's effect is present exactly once (one file per id), and nothing else.
	entries, err := os.ReadDir(filepath.Join(dir, "effects"))
	require.NoError(t, err)
	got := map[int]bool{}
	for _, e := range entries {
		id, err := strconv.Atoi(e.Name())
		require.NoError(t, err)
		got[id] = true
	}
	dead, err := pipeline.ReadDeadLetters[int](filepath.Join(dir, "dead.jsonl"))
	require.NoError(t, err)
	deadIDs := map[int]bool{}
	for _, d := range dead {
		deadIDs[d.Item] = true
	}
	for i := range crashItems {
		switch {
		case i%97 == 0:
			assert.True(t, deadIDs[i], "item %d is dead-lettered", i)
			assert.False(t, got[i], i)
		case i%13 == 0:
			assert.False(t, got[i], "item %d is filtered out", i)
		default:
			assert.True(t, got[i], "item %d has its effect", i)
		}
	}
}

// resumeRun runs a checkpointed pipeline of n items in which item 0 waits for the run
// to stop (it holds the watermark at 0), every tenth item is dead-lettered, the rest
// reach a sink, and the run is canceled once item 0 started and every other item settled. It returns how
// often the stage function saw each item and the dead letters.
func resumeRun(t *testing.T, store pipeline.CheckpointStore, n int, calls map[int]int, dead func(context.Context, pipeline.DeadLetter[int]) error, block bool) error {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	settled, started := 0, false
	stopIfDue := func() { // under mu
		if block && started && settled == n-1 {
			cancel() // item 0 started and every other item settled: stop, as SIGINT does
		}
	}
	done := func() {
		mu.Lock()
		defer mu.Unlock()
		settled++
		stopIfDue()
	}
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(1000))
	s := pipeline.Then(src, pipeline.NewStage("work", 4, func(ctx context.Context, i int) (int, error) {
		mu.Lock()
		calls[i]++
		if i == 0 {
			// A worker that took item 0 may be passed over until the others settled; were
			// the run stopped then, item 0 would end not started, uncalled.
			started = true
			stopIfDue()
		}
		mu.Unlock()
		switch {
		case i == 0 && block:
			<-ctx.Done()
			return 0, ctx.Err()
		case i%10 == 5:
			return 0, pipeline.Permanent(fmt.Errorf("bad item %d", i))
		}
		return i, nil
	}, pipeline.WithDeadLetter(func(ctx context.Context, dl pipeline.DeadLetter[int]) error {
		if err := dead(ctx, dl); err != nil {
			return err
		}
		done()
		return nil
	}), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.5, MinSample: 4})))
	pipeline.To(s, pipeline.NewSink("sink", 2, func(context.Context, int) error {
		done()
		return nil
	}))
	return p.Run(ctx)
}

// TestResumeSkipsDeadLettered checks that a run resumed after a stop neither redoes nor
// dead-letters again the items the stopped run dead-lettered above its saved position
// (they were redone, set aside twice, and bunched into the resumed run's error budget).
func TestResumeSkipsDeadLettered(t *testing.T) {
	t.Parallel()
	const n = 200
	store := pipeline.NewFileCheckpoint(filepath.Join(t.TempDir(), "ck"))
	calls := map[int]int{}
	letters := map[int]int{}
	var mu sync.Mutex
	dead := func(_ context.Context, dl pipeline.DeadLetter[int]) error {
		mu.Lock()
		defer mu.Unlock()
		letters[dl.Item]++
		return nil
	}
	err := resumeRun(t, store, n, calls, dead, true)
	require.ErrorIs(t, err, context.Canceled)
	pos, above, err := store.LoadCommitted(t.Context())
	require.NoError(t, err)
	assert.Zero(t, pos, "item 0 holds the watermark")
	assert.Equal(t, []pipeline.PositionRange{{From: 1, To: n}}, above, "every other position is saved as settled")

	require.NoError(t, resumeRun(t, store, n, calls, dead, false))
	for i := range n {
		want := 1
		if i == 0 {
			want = 2 // stopped in the first run, redone in the second
		}
		assert.Equal(t, want, calls[i], "calls of item %d", i)
		if i%10 == 5 {
			assert.Equal(t, 1, letters[i], "dead letters of item %d", i)
		}
	}
	pos, above, err = store.LoadCommitted(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(n), pos)
	assert.Empty(t, above)
}

// TestDeadLetterCommitSurvivesCrash checks that a dead-letter destination that records
// the run's progress with Commit keeps its items from being redone after a crash that
// lost every save.
func TestDeadLetterCommitSurvivesCrash(t *testing.T) {
	t.Parallel()
	const n = 200
	store := &memCommitted{crashed: true}
	calls := map[int]int{}
	letters := map[int]int{}
	var mu sync.Mutex
	dead := func(ctx context.Context, dl pipeline.DeadLetter[int]) error {
		return pipeline.Commit(ctx, func(_ context.Context, p pipeline.Progress) error {
			require.True(t, p.Checkpointed, "a dead-letter destination is given the item's progress")
			mu.Lock()
			letters[dl.Item]++
			mu.Unlock()
			store.record(p)
			return nil
		})
	}
	err := resumeRun(t, store, n, calls, dead, true)
	require.ErrorIs(t, err, context.Canceled)
	store.crashed = false
	require.NoError(t, resumeRun(t, store, n, calls, dead, false))
	for i := 5; i < n; i += 10 {
		assert.Equal(t, 1, calls[i], "calls of dead-lettered item %d", i)
		assert.Equal(t, 1, letters[i], "dead letters of item %d", i)
	}
}

// A checkpointed run whose source waited for a save once must not stop for good when the
// head item later settles elsewhere (dead-lettered or filtered) while a Batch that did not
// hold the head waits for input.
func TestCheckpointBatchAfterHeadSettlesElsewhere(t *testing.T) {
	t.Parallel()
	// The hang depended on timing (half the runs with a redo bound of 2): try often.
	redos := []int{3, 5, 17}
	for range 20 {
		redos = append(redos, 2)
	}
	for _, redo := range redos {
		synctest.Test(t, func(t *testing.T) {
			const n = 300
			store := &memStore{}
			p := pipeline.New(pipeline.WithBuffer(2))
			src := pipeline.FromCheckpoint(p, store, from(n), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(redo))
			kept := pipeline.Filter(src, func(i int) bool { return i%7 != 3 })
			dl := pipeline.Then(kept, pipeline.NewStage("dl", 2, func(_ context.Context, i int) (int, error) {
				if i%5 == 1 {
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int])))
			var got atomic.Int64
			pipeline.ToBatches(dl, 10, pipeline.NewSink("sink", 1, func(_ context.Context, b []int) error {
				got.Add(int64(len(b)))
				return nil
			}))
			require.NoError(t, runWithin(t, p, time.Hour))
			assert.Equal(t, int64(n), store.pos, "the final checkpoint")
			checkAccounting(t, p.Report())
		})
	}
}

// negStore loads a negative position.
type negStore struct{ memStore }

func (*negStore) Load(context.Context) (int64, error) { return -1, nil }

// A store that loads a negative position fails the run with ErrBadCheckpoint.
func TestCheckpointNegativePositionFailsRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := pipeline.New()
		pipeline.To(pipeline.FromCheckpoint(p, &negStore{}, from(10)),
			pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
		err := runWithin(t, p, time.Hour)
		require.ErrorIs(t, err, pipeline.ErrBadCheckpoint)
	})
}

type panicStore struct{ load, save bool }

func (s panicStore) Load(context.Context) (int64, error) {
	if s.load {
		panic("load")
	}
	return 0, nil
}

func (s panicStore) Save(context.Context, int64) error {
	if s.save {
		panic("save")
	}
	return nil
}

// A CheckpointStore whose Save panics, called by the saver goroutine, fails the run with a
// *PanicError (it was not recovered).
func TestCheckpointSavePanicFailsRun(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, panicStore{save: true}, from(100), pipeline.WithSaveEvery(1))
	pipeline.To(src, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
	err := p.Run(context.Background())
	_, isPanic := errors.AsType[*pipeline.PanicError](err)
	assert.True(t, isPanic, "want the store's panic as the run's error, got %v", err)
}

// A CheckpointStore whose Load panics, under Collect (where exec runs in a goroutine), fails
// the run with a *PanicError.
func TestCheckpointLoadPanicFailsCollect(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromCheckpoint(p, panicStore{load: true}, from(10))
	_, err := pipeline.Collect(context.Background(), src)
	_, isPanic := errors.AsType[*pipeline.PanicError](err)
	assert.True(t, isPanic, "want the store's panic as the run's error, got %v", err)
}

// An observer that calls runtime.Goexit (t.FailNow) on EventCheckpoint in the saver goroutine
// does not hang the run (it ended the saver silently: the source, waiting for a save under
// WithMaxRedo, waited for ever).
func TestCheckpointObserverGoexitInSaverDoesNotHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Only the first save's event, which the saver goroutine sends: the final save's
		// is sent from Run's own goroutine, where a Goexit ends the caller (as any call
		// of its own would).
		var once atomic.Bool
		p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
			if e.Kind == pipeline.EventCheckpoint && once.CompareAndSwap(false, true) {
				runtime.Goexit()
			}
		}))
		src := pipeline.FromCheckpoint(p, &memStore{}, from(100), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(2))
		pipeline.To(src, pipeline.NewSink("s", 1, func(context.Context, int) error { return nil }))
		t.Log("run ended:", runWithin(t, p, time.Hour))
	})
}

// runSavingEach runs a pipeline whose checkpointed source of the positions 0 ... n-1
// saves each one (into a memStore) with WithMaxRedo(redo), and which wire ends; it
// checks that the run succeeds, saves the final position and that its report adds up.
func runSavingEach(t *testing.T, n, redo int, wire func(p *pipeline.Pipeline, src *pipeline.Stream[int])) {
	t.Helper()
	st := &memStore{}
	p := pipeline.New()
	wire(p, pipeline.FromCheckpoint(p, st, from(n), pipeline.WithSaveEvery(1), pipeline.WithMaxRedo(redo)))
	require.NoError(t, runWithin(t, p, time.Hour))
	assert.Equal(t, int64(n), st.pos)
	checkAccounting(t, p.Report())
}

// A checkpointed run through a tripping circuit breaker into batches saves the final position.
func TestCheckpointBreakerBatchSavesFinalPosition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		runSavingEach(t, 40, 3, func(_ *pipeline.Pipeline, src *pipeline.Stream[int]) {
			var calls atomic.Int64
			s := pipeline.Then(src, pipeline.NewStage("svc", 2, func(_ context.Context, i int) (int, error) {
				if k := calls.Add(1); k > 5 && k < 15 {
					return 0, pipeline.Transient(errBoom)
				}
				return i, nil
			}, pipeline.WithRetry(3, nil), pipeline.WithCircuitBreaker(pipeline.Breaker{Failures: 2, OpenFor: time.Second}), discardDead[int]()))
			pipeline.ToBatches(s, 10, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
		})
	})
}

// A checkpointed run whose items are dead-lettered (slowly) while later ones wait in a Batch
// saves the final position.
func TestCheckpointHeadDeadLetteredBatchSavesFinalPosition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		runSavingEach(t, 40, 2, func(_ *pipeline.Pipeline, src *pipeline.Stream[int]) {
			s := pipeline.Then(src, pipeline.NewStage("dl", 3, func(_ context.Context, i int) (int, error) {
				if i%3 == 0 {
					time.Sleep(time.Millisecond)
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, discardDead[int]()))
			pipeline.ToBatches(s, 10, pipeline.NewSink("s", 1, func(context.Context, []int) error { return nil }))
		})
	})
}

// Checkpointed runs through Tee, Batch+Flatten, flat, ordered and nested-Batch shapes, with
// dead letters and Commit, save the final position, whatever WithMaxRedo.
func TestCheckpointShapesSaveFinalPosition(t *testing.T) {
	const n = 60
	dlEvery := func(k int) *pipeline.Stage[int, int] {
		return pipeline.NewStage("dl", 3, func(_ context.Context, i int) (int, error) {
			time.Sleep(time.Duration(i%5) * time.Millisecond)
			if i%k == 0 {
				return 0, pipeline.Permanent(errBoom)
			}
			return i, nil
		}, discardDead[int]())
	}
	okSink := func(name string) *pipeline.Stage[[]int, struct{}] {
		return pipeline.NewSink(name, 2, func(ctx context.Context, _ []int) error {
			return pipeline.Commit(ctx, func(context.Context, pipeline.Progress) error { return nil })
		})
	}
	shapes := map[string]func(p *pipeline.Pipeline, s *pipeline.Stream[int]){
		"tee2batches": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			br := pipeline.Tee(s, 2)
			pipeline.ToBatches(pipeline.Filter(br[0], func(i int) bool { return i%2 == 0 }), 7, okSink("a"))
			pipeline.ToBatches(pipeline.Then(br[1], dlEvery(3)), 5, okSink("b"))
		},
		"batchflattenbatch": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			b := pipeline.Flatten(pipeline.Batch(s, 4))
			pipeline.ToBatches(pipeline.Then(b, dlEvery(4)), 6, okSink("a"))
		},
		"flat": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			f := pipeline.Then(s, pipeline.NewFlatStage("flat", 2, func(_ context.Context, i int, emit func(int)) error {
				for k := range i % 3 {
					emit(i*10 + k)
				}
				return nil
			}))
			pipeline.ToBatches(f, 8, okSink("a"))
		},
		"ordered": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			o := pipeline.Then(s, pipeline.NewStage("o", 3, func(_ context.Context, i int) (int, error) {
				time.Sleep(time.Duration(7-i%7) * time.Millisecond)
				if i%6 == 0 {
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, pipeline.WithOrdered(3), discardDead[int]()))
			pipeline.ToBatches(o, 9, okSink("a"))
		},
		"batchofbatch": func(p *pipeline.Pipeline, s *pipeline.Stream[int]) {
			b := pipeline.Batch(pipeline.Batch(pipeline.Then(s, dlEvery(5)), 3), 4)
			pipeline.To(b, pipeline.NewSink("a", 1, func(ctx context.Context, _ [][]int) error {
				return pipeline.Commit(ctx, func(context.Context, pipeline.Progress) error { return nil })
			}))
		},
	}
	for name, shape := range shapes {
		for _, redo := range []int{2, 3, 6} {
			t.Run(name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					runSavingEach(t, n, redo, shape)
				})
			})
		}
	}
}

// TestResumedProgress checks that a resumed run's source counts the positions settled
// by earlier runs, before its start and committed beyond it, as Resumed, so that
// Resumed + Out reaches the declared total when the run completes.
func TestResumedProgress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		pos       int64
		committed []pipeline.PositionRange
		resumed   int64
	}{
		{"first run", 0, nil, 0},
		{"resumed", 40, nil, 40},
		{"resumed with commits beyond", 40, []pipeline.PositionRange{{From: 60, To: 70}}, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &memCommitted{pos: tc.pos, committed: tc.committed}
			p := pipeline.New()
			src := pipeline.FromCheckpoint(p, store, from(100), pipeline.WithTotal(100), pipeline.WithName("read"))
			pipeline.To(src, pipeline.NewSink("sink", 2, func(context.Context, int) error { return nil }))
			require.NoError(t, p.Run(t.Context()))
			read := row(t, p.Report(), "read")
			assert.Equal(t, int64(100), read.Total)
			assert.Equal(t, tc.resumed, read.Resumed)
			assert.Equal(t, 100-tc.resumed, read.Out, "the positions read again")
			assert.Equal(t, read.Out, read.In, "Resumed is in neither In nor Out")
			assert.Equal(t, read.Total, read.Resumed+read.Out, "a complete run's progress is its total")
		})
	}
}

// BenchmarkTrackedRun measures the per-item cost of a tracked run (a checkpoint, or
// acknowledgements): 100,000 items through a flat stage of 4 workers that emits one
// or two outputs per item, a Filter that drops a tenth, a Batch of 100 flattened
// again, and a sink of 2 workers, so that every kind of derived position (split,
// group, ungroup, settle) is on the path. Run it with
// go test -run '^$' -bench TrackedRun .
func BenchmarkTrackedRun(b *testing.B) {
	const items = 100_000
	wire := func(p *pipeline.Pipeline, src *pipeline.Stream[int]) {
		split := pipeline.Then(src, pipeline.NewFlatStage("split", 4, func(_ context.Context, v int, emit func(int)) error {
			emit(v)
			if v%4 == 0 {
				emit(-v)
			}
			return nil
		}))
		kept := pipeline.Filter(split, func(v int) bool { return v%10 != 3 })
		flat := pipeline.Flatten(pipeline.Batch(kept, 100))
		pipeline.To(flat, pipeline.NewSink("sink", 2, func(context.Context, int) error { return nil }))
	}
	b.Run("source=checkpoint", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p := pipeline.New()
			wire(p, pipeline.FromCheckpoint(p, &memStore{}, from(items)))
			if err := p.Run(b.Context()); err != nil {
				b.Fatal(err)
			}
		}
		reportPerItem(b, items)
	})
	b.Run("source=acked", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var settled atomic.Int64
			p := pipeline.New()
			wire(p, pipeline.FromAcked(p, func(ctx context.Context, emit func(int, func(pipeline.Settlement)) error) error {
				for i := range items {
					if err := emit(i, func(pipeline.Settlement) { settled.Add(1) }); err != nil {
						return err
					}
				}
				return nil
			}))
			if err := p.Run(b.Context()); err != nil {
				b.Fatal(err)
			}
			if settled.Load() != items {
				b.Fatalf("%d settled, want %d", settled.Load(), items)
			}
		}
		reportPerItem(b, items)
	})
}

// reportPerItem reports a benchmark's time per item and items per second, for runs of
// items items each.
func reportPerItem(b *testing.B, items int) {
	b.Helper()
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N*items)
	b.ReportMetric(ns, "ns/item")
	b.ReportMetric(1e9/ns, "items/s")
}
