// Command resume is a resumable job: it transforms 20,000 generated records and
// upserts them, 500 at a time, into a store on disk, and picks up where it left off
// after a crash.
//
//	source     pipeline.Resume over records 0..n-1 (deterministic: record i depends
//	           only on i), restarted from the position saved in <dir>/checkpoint
//	transform  8 workers compute each record's digest
//	store      batches of 500 (ToBatches) upserted by ID into a map that is saved as
//	           JSON (<dir>/records.json) after every batch, so writing a record again
//	           changes nothing: the sink is idempotent, as FromCheckpoint requires
//
// The checkpoint is the position of the first record whose batch may not be in the
// store yet; it is saved only after the store has committed, so a crash redoes a few
// batches at most, and the upserts make the redo harmless. With -crash-after N the
// process exits abruptly (os.Exit(3), no cleanup) after committing N batches; run it
// again without the flag to finish the job:
//
//	go run ./examples/resume -crash-after 10
//	go run ./examples/resume
//
// A run prints the position it resumed from and the run's report; a run that finishes
// the job checks that the store holds every record exactly once, with the right value.
// When the folder holds a finished job, a new run starts over (as does -reset).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"iter"
	"maps"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"

	"github.com/gopipeline/pipeline"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "resume:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", filepath.Join(os.TempDir(), "pipeline-resume-example"), "folder of the checkpoint and the store")
	n := flag.Int("n", 20_000, "number of records")
	crashAfter := flag.Int("crash-after", 0, "exit abruptly (status 3) after committing this many batches (0: never)")
	reset := flag.Bool("reset", false, "start over: forget the checkpoint and the store")
	flag.Parse()
	if *n < 0 || *crashAfter < 0 {
		return errors.New("-n and -crash-after must be >= 0")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	ckPath, storePath := filepath.Join(*dir, "checkpoint"), filepath.Join(*dir, "records.json")
	ck := pipeline.NewFileCheckpoint(ckPath)
	if !*reset {
		if pos, err := ck.Load(ctx); err != nil {
			return err
		} else if pos >= int64(*n) {
			fmt.Printf("the job in %s is complete: starting over\n", *dir)
			*reset = true
		}
	}
	if *reset {
		if err := errors.Join(removeIfExists(ckPath), removeIfExists(storePath)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	st, err := openStore(storePath)
	if err != nil {
		return err
	}

	committed := 0 // batches committed by this process (the sink has one worker)
	p := pipeline.New()
	// The position is saved every 1000 committed records. WithMaxRedo bounds how far the
	// source may run ahead of the saved position, hence the redo after a crash. It must
	// leave room for every record in flight, counted in records: transform's queue and
	// workers (64 + 8), the batch stage's queue and partial batch (64 + 500), and the
	// store's queue and worker, one batch of 500 each: about 1,650, plus up to 1000
	// committed but not yet saved. 4000 leaves room: a source that waited for a save
	// would make the batch stage flush partial batches early, to let the save happen.
	records := pipeline.FromCheckpoint(p, ck, func(_ context.Context, pos int64) iter.Seq2[record, error] {
		fmt.Printf("resuming from position %d of %d (the store holds %d records)\n", pos, *n, st.len())
		return generate(int(pos), *n)
	}, pipeline.WithSaveEvery(1000), pipeline.WithMaxRedo(4000))
	out := pipeline.Then(records, pipeline.NewStage("transform", 8, transform))
	pipeline.ToBatches(out, 500, pipeline.NewSink("store", 1, func(ctx context.Context, batch []result) error {
		if err := st.upsert(batch); err != nil {
			return err
		}
		committed++
		if committed == *crashAfter {
			fmt.Printf("crash after %d committed batches (checkpoint at %d)\n", committed, p.Snapshot().Checkpoint)
			os.Exit(3) // no cleanup, no final checkpoint: as if the machine went down
		}
		return nil
	}, pipeline.WithBuffer(1))) // a queued batch is 500 records: a short queue is plenty

	runErr := p.Run(ctx)
	rep := p.Report()
	fmt.Print(rep)
	fmt.Printf("checkpoint at %d; %d batches committed by this run; %d records written again after a resume (upserts)\n",
		rep.Checkpoint, committed, st.rewritten)
	if runErr != nil {
		return fmt.Errorf("run failed: %w", runErr)
	}
	if err := st.verify(*n); err != nil {
		return err
	}
	fmt.Printf("done: %s holds every one of the %d records exactly once\n", storePath, *n)
	return nil
}

// record is an input record. Record i depends only on i, so a resumed run reads the
// same records as the run that crashed.
type record struct {
	ID    int    `json:"id"`
	Name  string `json:"name"`
	Value int    `json:"value"`
}

// result is a record with what the transform stage computed.
type result struct {
	record
	Digest string `json:"digest"`
}

func recordAt(i int) record {
	rng := rand.New(rand.NewPCG(uint64(i), 0x9e3779b97f4a7c15))
	return record{ID: i, Name: fmt.Sprintf("user-%05d", rng.IntN(100_000)), Value: rng.IntN(1_000_000)}
}

// generate yields the records from position pos (that is, ID pos) to n-1.
func generate(pos, n int) iter.Seq2[record, error] {
	return func(yield func(record, error) bool) {
		for i := pos; i < n; i++ {
			if !yield(recordAt(i), nil) {
				return
			}
		}
	}
}

// transform computes the record's digest: a stand-in for real per-record work.
func transform(_ context.Context, r record) (result, error) {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d/%s/%d", r.ID, r.Name, r.Value))
	return result{record: r, Digest: hex.EncodeToString(sum[:8])}, nil
}

// store keeps results by ID and saves all of them to a JSON file after every upsert,
// atomically (a temporary file, synced, renamed over the old one): after a crash the
// file holds the store as of some upsert that returned.
type store struct {
	path string

	mu        sync.Mutex
	recs      map[int]result
	rewritten int // upserts of an ID the store already held: work redone after a resume
}

func openStore(path string) (*store, error) {
	s := &store{path: path, recs: map[int]result{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	var rs []result
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, r := range rs {
		s.recs[r.ID] = r
	}
	return s, nil
}

func (s *store) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

// upsert writes a batch by ID and saves the store; writing a result again is harmless.
func (s *store) upsert(batch []result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range batch {
		if _, ok := s.recs[r.ID]; ok {
			s.rewritten++
		}
		s.recs[r.ID] = r
	}
	ids := slices.Sorted(maps.Keys(s.recs))
	rs := make([]result, len(ids))
	for i, id := range ids {
		rs[i] = s.recs[id]
	}
	b, err := json.Marshal(rs)
	if err != nil {
		return err
	}
	return writeAtomic(s.path, b)
}

// verify checks that the store holds exactly the records 0..n-1, each with its result.
func (s *store) verify(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.recs) != n {
		return fmt.Errorf("the store holds %d records, want %d", len(s.recs), n)
	}
	for id := range n {
		want, _ := transform(context.Background(), recordAt(id))
		if got, ok := s.recs[id]; !ok || got != want {
			return fmt.Errorf("record %d: got %+v, want %+v", id, got, want)
		}
	}
	return nil
}

// writeAtomic replaces the file at path with b: a crash leaves the old or the new file.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	return nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
