package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"

	"github.com/gopipeline/pipeline"
)

// enriched is one output record.
type enriched struct {
	record
	Score   int    `json:"score"`
	Segment string `json:"segment"`
}

// output appends enriched records to a JSON Lines file, idempotently: it knows the ids
// already in the file (read when it opens), and writes a record only once, so that the
// records a resumed run redoes are not duplicated.
type output struct {
	path       string
	mu         sync.Mutex
	f          *os.File
	have       map[int]bool
	writtenNow int
}

func openOutput(path string) (*output, error) {
	have, err := idsIn(path)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &output{path: path, f: f, have: have}, nil
}

// idsIn returns the ids of the records in a JSON Lines file; a torn last line (a crash
// mid-write) is cut off.
func idsIn(path string) (map[int]bool, error) {
	have := map[int]bool{}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return have, nil
	}
	if err != nil {
		return nil, err
	}
	good := 0
	for i := 0; i < len(b); {
		j := i
		for j < len(b) && b[j] != '\n' {
			j++
		}
		if j == len(b) { // no newline: torn
			break
		}
		var r struct {
			ID int `json:"id"`
		}
		if err := json.Unmarshal(b[i:j], &r); err != nil {
			return nil, err
		}
		have[r.ID] = true
		i, good = j+1, j+1
	}
	if good < len(b) {
		if err := os.Truncate(path, int64(good)); err != nil {
			return nil, err
		}
	}
	return have, nil
}

// write is the load stage's function: it appends the batch's new records and syncs.
func (o *output) write(_ context.Context, batch []enriched) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := bufio.NewWriter(o.f)
	n := 0
	for _, e := range batch {
		if o.have[e.ID] {
			continue
		}
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, _ = w.Write(append(b, '\n'))
		n++
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := o.f.Sync(); err != nil {
		return err
	}
	for _, e := range batch {
		o.have[e.ID] = true
	}
	o.writtenNow += n
	return nil
}

func (o *output) close() { _ = o.f.Close() }

// deadFile is the dead-letter file, written at most once per record id.
type deadFile struct {
	path     string
	f        *pipeline.DeadLetterFile[record]
	mu       sync.Mutex
	have     map[int]bool
	addedNow int
}

func openDead(path string) (*deadFile, error) {
	have := map[int]bool{}
	if _, err := os.Stat(path); err == nil {
		dls, err := pipeline.ReadDeadLetters[record](path)
		if err != nil {
			return nil, err
		}
		for _, dl := range dls {
			have[dl.Item.ID] = true
		}
	}
	f, err := pipeline.OpenDeadLetterFile[record](path, pipeline.WithSyncEvery(1))
	if err != nil {
		return nil, err
	}
	return &deadFile{path: path, f: f, have: have}, nil
}

func (d *deadFile) add(ctx context.Context, dl pipeline.DeadLetter[record]) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.have[dl.Item.ID] {
		return nil
	}
	if err := d.f.Add(ctx, dl); err != nil {
		return err
	}
	d.have[dl.Item.ID] = true
	d.addedNow++
	return nil
}

func (d *deadFile) close() { _ = d.f.Close() }
