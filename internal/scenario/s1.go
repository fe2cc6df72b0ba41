// Package scenario builds the seed scenarios that the tests of several packages run
// (the root package's, and the prometheus and otel adapters'), so that each checks the
// same pipeline against the same figures, and holds the test helpers the modules share
// (a child process, TestMain, Eventually, a database's URL). It is for tests only.
package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopipeline/pipeline"
)

// S1Fixture is the scenario1 object of bench/testdata/items.json: the ids that fail.
type S1Fixture struct {
	NItems    int   `json:"n_items"`
	Permanent []int `json:"permanent"`
	Transient []int `json:"transient"`
	Hang      []int `json:"hang"`
}

// LoadS1 reads the S1 fixture from the items.json file at path, and fails tb if it
// cannot.
func LoadS1(tb testing.TB, path string) S1Fixture {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var fx struct {
		Scenario1 S1Fixture `json:"scenario1"`
	}
	if err := json.Unmarshal(data, &fx); err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	if fx.Scenario1.NItems != 10_000 {
		tb.Fatalf("%s: scenario1 has %d items, want 10000", path, fx.Scenario1.NItems)
	}
	return fx.Scenario1
}

// S1Retry builds scenario S1 under the retry policy: ids 0..9999 → "enrich" (20
// workers, 1 ms per item; the fixture's permanent ids fail for good, its transient ids
// fail their first attempt, its hang ids block until their 1 s timeout; 3 attempts, 10
// ms apart; dead letters kept in memory) → "sink", which counts into sunk when it is not
// nil. opts go to pipeline.New after WithBuffer(100). Run it in testing/synctest to make
// it instant; it then ends at 1.4 s or so of virtual time with 9,895 items sunk, 105
// dead-lettered and 200 retried.
func S1Retry(fx S1Fixture, sunk *atomic.Int64, opts ...pipeline.PipelineOption) *pipeline.Pipeline {
	role := make([]byte, fx.NItems)
	for _, id := range fx.Permanent {
		role[id] = 'p'
	}
	for _, id := range fx.Transient {
		role[id] = 't'
	}
	for _, id := range fx.Hang {
		role[id] = 'h'
	}
	errBad, errReset := errors.New("bad record"), errors.New("connection reset")
	attempts := make([]atomic.Int32, fx.NItems)
	enrich := func(ctx context.Context, id int) (int, error) {
		time.Sleep(time.Millisecond)
		switch role[id] {
		case 'p':
			return 0, pipeline.Permanent(errBad)
		case 't':
			if attempts[id].Add(1) == 1 {
				return 0, pipeline.Transient(errReset)
			}
		case 'h':
			<-ctx.Done()
			return 0, ctx.Err()
		}
		return id, nil
	}
	ids := make([]int, fx.NItems)
	for i := range ids {
		ids[i] = i
	}
	p := pipeline.New(append([]pipeline.PipelineOption{pipeline.WithBuffer(100)}, opts...)...)
	enriched := pipeline.Then(pipeline.FromSlice(p, ids), pipeline.NewStage("enrich", 20, enrich,
		pipeline.WithTimeout(time.Second),
		pipeline.WithRetry(3, pipeline.ConstantBackoff(10*time.Millisecond)),
		pipeline.WithDeadLetter(pipeline.NewDeadLetterBuffer[int](1000).Add)))
	pipeline.To(enriched, pipeline.NewSink("sink", 1, func(context.Context, int) error {
		if sunk != nil {
			sunk.Add(1)
		}
		return nil
	}))
	return p
}
