package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// record is one input record.
type record struct {
	ID     int     `json:"id"`
	Name   string  `json:"name"`
	Amount float64 `json:"amount"`
}

// openRecords returns the checkpointed source's function (the records from position
// pos on) and how many records there are. A file is checked when the command starts,
// so that an unreadable one is a usage error (status 2), not a failed run.
func openRecords(c config) (func(ctx context.Context, pos int64) iter.Seq2[record, error], int64, error) {
	if c.input == "" {
		return generated(c.n, c.seed), int64(c.n), nil
	}
	ext := strings.ToLower(filepath.Ext(c.input))
	if ext != ".jsonl" && ext != ".csv" {
		return nil, 0, fmt.Errorf("-input %s: want a .jsonl or .csv file", c.input)
	}
	f, err := os.Open(c.input)
	if err != nil {
		return nil, 0, fmt.Errorf("-input: %w", err)
	}
	// Read it once through, so that a malformed record is reported before the run.
	n := 0
	for _, err := range readFile(f, ext, 0) {
		if err != nil {
			_ = f.Close()
			return nil, 0, fmt.Errorf("-input %s: %w", c.input, err)
		}
		n++
	}
	if err := f.Close(); err != nil {
		return nil, 0, err
	}
	return func(_ context.Context, pos int64) iter.Seq2[record, error] {
		return func(yield func(record, error) bool) {
			f, err := os.Open(c.input)
			if err != nil {
				yield(record{}, err)
				return
			}
			defer f.Close() //nolint:errcheck // read-only
			for r, err := range readFile(f, ext, pos) {
				if !yield(r, err) || err != nil {
					return
				}
			}
		}
	}, int64(n), nil
}

// generated yields n records from position pos on; record i is the same in every run.
func generated(n int, seed uint64) func(ctx context.Context, pos int64) iter.Seq2[record, error] {
	return func(_ context.Context, pos int64) iter.Seq2[record, error] {
		return func(yield func(record, error) bool) {
			for i := int(pos); i < n; i++ {
				rng := rand.New(rand.NewPCG(seed, uint64(i)))
				r := record{ID: i, Name: fmt.Sprintf("customer-%05d", rng.IntN(100_000)), Amount: float64(rng.IntN(100_000)) / 100}
				if !yield(r, nil) {
					return
				}
			}
		}
	}
}

// readFile yields the records of a JSON Lines or CSV file (a header line id,name,amount
// first) from the skip-th record on.
func readFile(r io.Reader, ext string, skip int64) iter.Seq2[record, error] {
	return func(yield func(record, error) bool) {
		var k int64
		emit := func(rec record, err error) bool {
			k++
			if k <= skip && err == nil {
				return true
			}
			return yield(rec, err)
		}
		if ext == ".jsonl" {
			sc := bufio.NewScanner(r)
			for line := 1; sc.Scan(); line++ {
				if strings.TrimSpace(sc.Text()) == "" {
					continue
				}
				var rec record
				if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
					yield(record{}, fmt.Errorf("line %d: %w", line, err))
					return
				}
				if !emit(rec, nil) {
					return
				}
			}
			if err := sc.Err(); err != nil {
				yield(record{}, err)
			}
			return
		}
		cr := csv.NewReader(r)
		head, err := cr.Read()
		if err != nil || len(head) != 3 || head[0] != "id" || head[1] != "name" || head[2] != "amount" {
			yield(record{}, errors.New(`want a header line "id,name,amount"`))
			return
		}
		for line := 2; ; line++ {
			row, err := cr.Read()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				yield(record{}, err)
				return
			}
			id, err1 := strconv.Atoi(row[0])
			amount, err2 := strconv.ParseFloat(row[2], 64)
			if err := errors.Join(err1, err2); err != nil {
				yield(record{}, fmt.Errorf("line %d: %w", line, err))
				return
			}
			if !emit(record{ID: id, Name: row[1], Amount: amount}, nil) {
				return
			}
		}
	}
}
