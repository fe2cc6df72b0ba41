package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopipeline/pipeline"
)

// This example shows the quick start: a slice source, a concurrent stage, and Collect,
// which runs the pipeline and returns what reached the end. With several workers the
// output comes in completion order, so it is sorted before printing.
func Example() {
	p := pipeline.New()
	words := pipeline.FromSlice(p, []string{"pipeline", "go", "stage", "sink"})
	lengths := pipeline.Then(words, pipeline.NewStage("length", 4, func(_ context.Context, w string) (string, error) {
		return fmt.Sprintf("%s=%d", w, len(w)), nil
	}))
	out, err := pipeline.Collect(context.Background(), lengths)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	slices.Sort(out)
	fmt.Println(out)
	// Output: [go=2 pipeline=8 sink=4 stage=5]
}

// This example shows a one-to-one stage that changes the item type (IDs to users).
// One worker keeps the input order.
func ExampleNewStage() {
	type user struct {
		ID   int
		Name string
	}
	names := map[int]string{1: "ada", 2: "grace", 3: "linus"}
	fetch := pipeline.NewStage("fetch", 1, func(_ context.Context, id int) (user, error) {
		return user{ID: id, Name: names[id]}, nil // a lookup that could fail or block
	})

	p := pipeline.New()
	users, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{1, 2, 3}), fetch))
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	for _, u := range users {
		fmt.Printf("%d: %s\n", u.ID, u.Name)
	}
	// Output:
	// 1: ada
	// 2: grace
	// 3: linus
}

// This example shows a stage that emits any number of outputs per input: here it
// splits lines into words, and an empty line emits nothing.
func ExampleNewFlatStage() {
	split := pipeline.NewFlatStage("split", 1, func(_ context.Context, line string, emit func(string)) error {
		for w := range strings.FieldsSeq(line) {
			emit(w)
		}
		return nil
	})

	p := pipeline.New()
	words, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []string{"to be", "", "or not to be"}), split))
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println(words)
	out, _ := p.Report().Stage("split")
	fmt.Printf("%d lines in, %d words out\n", out.In, out.Out)
	// Output:
	// [to be or not to be]
	// 3 lines in, 6 words out
}

// This example shows a sink: a terminal stage that consumes items, here by printing
// them. Run returns when every item has been consumed.
func ExampleNewSink() {
	p := pipeline.New()
	printer := pipeline.NewSink("print", 1, func(_ context.Context, s string) error {
		_, err := fmt.Println(s)
		return err
	})
	pipeline.To(pipeline.FromSlice(p, []string{"first", "second", "third"}), printer)
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
	}
	// Output:
	// first
	// second
	// third
}

// This example shows To ending a chain in a sink that saves items; several sink
// workers save concurrently, so the result is sorted before printing.
func ExampleTo() {
	var (
		mu    sync.Mutex
		saved []int
	)
	save := pipeline.NewSink("save", 4, func(_ context.Context, v int) error {
		mu.Lock()
		defer mu.Unlock()
		saved = append(saved, v)
		return nil
	})

	p := pipeline.New()
	squares := pipeline.Then(pipeline.FromSlice(p, []int{1, 2, 3, 4}), pipeline.NewStage("square", 2, func(_ context.Context, v int) (int, error) {
		return v * v, nil
	}))
	pipeline.To(squares, save)
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	slices.Sort(saved)
	fmt.Println(saved)
	// Output: [1 4 9 16]
}

// This example shows All: the caller ranges over the end of the pipeline. Breaking out
// of the loop stops the run, here of an endless source; the loop returns once every
// goroutine of the run has exited.
func ExampleAll() {
	p := pipeline.New()
	naturals := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
		for i := 1; ; i++ {
			if err := emit(i); err != nil {
				return err // the run is stopping
			}
		}
	})
	squares := pipeline.Then(naturals, pipeline.NewStage("square", 1, func(_ context.Context, v int) (int, error) {
		return v * v, nil
	}))
	for sq, err := range pipeline.All(context.Background(), squares) {
		if err != nil {
			fmt.Println("error:", err)
			break
		}
		fmt.Println(sq)
		if sq >= 9 {
			break
		}
	}
	fmt.Println("run error:", p.Report().Err)
	// Output:
	// 1
	// 4
	// 9
	// run error: <nil>
}

// This example shows Collect returning the run's error: the first item that fails to
// parse stops the run, and the error names the stage.
func ExampleCollect() {
	parse := pipeline.NewStage("parse", 1, func(_ context.Context, s string) (int, error) {
		return strconv.Atoi(s)
	})

	p := pipeline.New()
	nums, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []string{"1", "2", "3"}), parse))
	fmt.Println(nums, err)

	p = pipeline.New()
	_, err = pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []string{"1", "x", "3"}), parse))
	fmt.Println(err)
	if se, ok := errors.AsType[*pipeline.StageError](err); ok {
		fmt.Println("failed stage:", se.Stage)
	}
	// Output:
	// [1 2 3] <nil>
	// pipeline: stage "parse": strconv.Atoi: parsing "x": invalid syntax
	// failed stage: parse
}

// This example shows Map, an inline operator: a cheap transformation that runs in the
// producing goroutine, with no queue and no worker of its own.
func ExampleMap() {
	p := pipeline.New()
	upper := pipeline.Map(pipeline.FromSlice(p, []string{"a", "b", "c"}), strings.ToUpper)
	out, err := pipeline.Collect(context.Background(), upper)
	fmt.Println(out, err)
	// Output: [A B C] <nil>
}

// This example shows Filter, an inline operator that drops items; the report counts
// what it dropped.
func ExampleFilter() {
	p := pipeline.New()
	even := pipeline.Filter(pipeline.FromSlice(p, []int{1, 2, 3, 4, 5, 6}), func(v int) bool { return v%2 == 0 })
	out, err := pipeline.Collect(context.Background(), even)
	fmt.Println(out, err)
	for _, s := range p.Report().Stages {
		if s.Kind == pipeline.KindFilter {
			fmt.Println("filtered out:", s.Filtered)
		}
	}
	// Output:
	// [2 4 6] <nil>
	// filtered out: 3
}

// This example shows ForEach, the inline end: after an ordered stage its function sees
// the items in input order, one call at a time, in the goroutine that restores the
// order, so it keeps its sum without a lock.
func ExampleForEach() {
	p := pipeline.New()
	squares := pipeline.Then(pipeline.FromSlice(p, []int{1, 2, 3, 4}), pipeline.NewStage("square", 4,
		func(_ context.Context, v int) (int, error) { return v * v, nil }, pipeline.WithOrdered(0)))
	sum := 0
	pipeline.ForEach(squares, func(v int) error {
		sum += v
		fmt.Print(v, " ")
		return nil
	})
	err := p.Run(context.Background())
	fmt.Println("=", sum, err)
	// Output: 1 4 9 16 = 30 <nil>
}

// This example shows Generate, a source that runs a function: here it reads pages
// until the last one, and stops early when emit reports that the run is stopping.
func ExampleGenerate() {
	pages := [][]string{{"a", "b"}, {"c"}, {"d", "e"}} // say, an API's result pages
	p := pipeline.New()
	items := pipeline.Generate(p, func(ctx context.Context, emit func(string) error) error {
		for _, page := range pages { // a real source would fetch each page with ctx
			for _, it := range page {
				if err := emit(it); err != nil {
					return err
				}
			}
		}
		return nil
	})
	out, err := pipeline.Collect(context.Background(), items)
	fmt.Println(out, err)
	// Output: [a b c d e] <nil>
}

// This example shows FromSeq2, a source from an iterator of values and errors: the
// first error stops the run as an error of the source.
func ExampleFromSeq2() {
	lines := func(text string, failAt int) iter.Seq2[string, error] {
		return func(yield func(string, error) bool) {
			for i, l := range strings.Split(text, "\n") {
				if i == failAt {
					yield("", errors.New("read: connection reset"))
					return
				}
				if !yield(l, nil) {
					return
				}
			}
		}
	}

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.FromSeq2(p, lines("x\ny\nz", -1)))
	fmt.Println(out, err)

	p = pipeline.New()
	_, err = pipeline.Collect(context.Background(), pipeline.FromSeq2(p, lines("x\ny\nz", 1)))
	fmt.Println(err)
	// Output:
	// [x y z] <nil>
	// pipeline: stage "FromSeq2": read: connection reset
}

// This example shows FromChan: the caller owns the channel, sends to it and closes it;
// the run ends when the channel is closed and drained.
func ExampleFromChan() {
	ch := make(chan int)
	go func() {
		defer close(ch)
		for i := range 4 {
			ch <- i
		}
	}()

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.FromChan(p, ch))
	fmt.Println(out, err)
	// Output: [0 1 2 3] <nil>
}

// This example shows WithRetry: a call that fails with a Transient error is retried,
// here after a constant wait, and succeeds on its third attempt. The report counts the
// retries.
func ExampleWithRetry() {
	var calls int
	flaky := pipeline.NewStage("call", 1, func(_ context.Context, v int) (int, error) {
		calls++
		if calls < 3 {
			return 0, pipeline.Transient(errors.New("503 service unavailable"))
		}
		return v * 10, nil
	}, pipeline.WithRetry(5, pipeline.ConstantBackoff(time.Millisecond)))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{4}), flaky))
	fmt.Println(out, err)
	s, _ := p.Report().Stage("call")
	fmt.Println("attempts:", calls, "retried:", s.Retried)
	// Output:
	// [40] <nil>
	// attempts: 3 retried: 2
}

// This example shows WithTimeout: an attempt that runs past the timeout has its
// context canceled and its item dead-lettered as a timeout, while the other items go
// on.
func ExampleWithTimeout() {
	dead := pipeline.NewDeadLetterBuffer[string](10)
	lookup := pipeline.NewStage("lookup", 2, func(ctx context.Context, host string) (string, error) {
		if host == "slow.example" {
			<-ctx.Done() // a call that would hang, but honours its context
			return "", ctx.Err()
		}
		return host + " ok", nil
	}, pipeline.WithTimeout(10*time.Millisecond), pipeline.WithDeadLetter(dead.Add))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []string{"a.example", "slow.example", "b.example"}), lookup))
	slices.Sort(out)
	fmt.Println(out, err)
	for _, dl := range dead.Items() {
		fmt.Printf("%s: %s (%s)\n", dl.Item, dl.LastError, dl.ErrType)
	}
	// Output:
	// [a.example ok b.example ok] <nil>
	// slow.example: timed out after 10ms: context deadline exceeded (timeout)
}

// This example shows what a run reports of a stage function that ignores its context:
// an EventStuck (and a log line with WithLogger) once the attempt has run a quarter of
// its timeout past it, and the attempt's age in Snapshot while it runs.
func ExampleEventStuck() {
	stuck := make(chan pipeline.Event, 1)
	p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
		if e.Kind == pipeline.EventStuck {
			stuck <- e
		}
	}))
	release := make(chan struct{})
	pipeline.To(pipeline.FromSlice(p, []string{"legacy.example"}), pipeline.NewSink("call", 1, func(context.Context, string) error {
		<-release // a call that hangs and never looks at its context
		return nil
	}, pipeline.WithTimeout(10*time.Millisecond)))

	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	e := <-stuck
	s, _ := p.Snapshot().Stage("call")
	fmt.Println(e.Kind, e.Stage, e.Age > 10*time.Millisecond, s.OldestAttempt >= e.Age)
	close(release) // what a stuck call needs: something outside the pipeline to end it
	fmt.Println(<-done)
	// Output:
	// stuck call true true
	// <nil>
}

// This example shows WithDeadLetter with a function of your own: items that fail with
// a Permanent error are set aside, with their error, and the run carries on.
func ExampleWithDeadLetter() {
	var (
		mu   sync.Mutex
		dead []string
	)
	keep := func(_ context.Context, dl pipeline.DeadLetter[string]) error {
		mu.Lock()
		defer mu.Unlock()
		dead = append(dead, fmt.Sprintf("%s %q: %s", dl.Stage, dl.Item, dl.LastError))
		return nil // an error here would stop the run: the item could not be kept
	}
	parse := pipeline.NewStage("parse", 1, func(_ context.Context, s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil {
			return 0, pipeline.Permanent(err)
		}
		return n, nil
	}, pipeline.WithDeadLetter(keep))

	p := pipeline.New()
	nums, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []string{"1", "two", "3", "4.0"}), parse))
	fmt.Println(nums, err)
	for _, d := range dead {
		fmt.Println(d)
	}
	// Output:
	// [1 3] <nil>
	// parse "two": strconv.Atoi: parsing "two": invalid syntax
	// parse "4.0": strconv.Atoi: parsing "4.0": invalid syntax
}

// This example shows WithErrorBudget: the stage tolerates up to 20 % dead-lettered
// items, judged once 10 items are settled; here every item fails, so the budget trips
// at the tenth and the run aborts with a *BudgetError.
func ExampleWithErrorBudget() {
	dead := pipeline.NewDeadLetterBuffer[int](100)
	validate := pipeline.NewStage("validate", 1, func(_ context.Context, v int) (int, error) {
		return 0, pipeline.Permanent(fmt.Errorf("item %d: invalid", v))
	}, pipeline.WithDeadLetter(dead.Add), pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.2, MinSample: 10}))

	p := pipeline.New()
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, make([]int, 1000)), validate),
		pipeline.NewSink("save", 1, func(context.Context, int) error { return nil }))
	err := p.Run(context.Background())
	fmt.Println(err)
	fmt.Println(errors.Is(err, pipeline.ErrBudgetExceeded))
	if be, ok := errors.AsType[*pipeline.BudgetError](err); ok {
		fmt.Printf("%d of %d failed\n", be.Failed, be.Seen)
	}
	fmt.Println("dead letters:", len(dead.Items()))
	// Output:
	// pipeline: stage "validate": pipeline: error budget exceeded: 10/10 items failed (max 0.2), aborted
	// true
	// 10 of 10 failed
	// dead letters: 10
}

// This example shows WithClassifier: the stage's errors carry no marker, and the
// classifier decides that a missing record is an item error (dead-lettered, which
// needs a destination) while anything else stays fatal.
func ExampleWithClassifier() {
	errNotFound := errors.New("not found")
	classify := func(err error) pipeline.Class {
		if errors.Is(err, errNotFound) {
			return pipeline.ClassItem
		}
		return pipeline.ClassFatal
	}
	db := map[int]string{1: "one", 3: "three"}
	dead := pipeline.NewDeadLetterBuffer[int](10)
	get := pipeline.NewStage("get", 1, func(_ context.Context, id int) (string, error) {
		v, ok := db[id]
		if !ok {
			return "", fmt.Errorf("get %d: %w", id, errNotFound)
		}
		return v, nil
	}, pipeline.WithClassifier(classify), pipeline.WithDeadLetter(dead.Add))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{1, 2, 3}), get))
	fmt.Println(out, err)
	for _, dl := range dead.Items() {
		fmt.Printf("dead letter: %d (%s: %s)\n", dl.Item, dl.Class, dl.LastError)
	}
	// Output:
	// [one three] <nil>
	// dead letter: 2 (item: get 2: not found)
}

// This example shows DeadLetterFile: dead letters are appended to a JSON Lines file,
// one record per line, and ReadDeadLetters reads them back.
func ExampleDeadLetterFile() {
	dir, err := os.MkdirTemp("", "deadletters")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	path := filepath.Join(dir, "dead.jsonl")

	f, err := pipeline.OpenDeadLetterFile[string](path, pipeline.WithSyncEvery(100))
	if err != nil {
		fmt.Println(err)
		return
	}
	parse := pipeline.NewStage("parse", 1, func(_ context.Context, s string) (int, error) {
		n, err := strconv.Atoi(s)
		return n, pipeline.Permanent(err)
	}, pipeline.WithDeadLetter(f.Add))
	p := pipeline.New()
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, []string{"7", "x", "8", "y"}), parse),
		pipeline.NewSink("save", 1, func(context.Context, int) error { return nil }))
	runErr := p.Run(context.Background())
	if err := f.Close(); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("run:", runErr)

	dls, err := pipeline.ReadDeadLetters[string](path)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, dl := range dls {
		fmt.Printf("%s %q after %d attempt(s): %s\n", dl.Stage, dl.Item, dl.Attempts, dl.LastError)
	}
	// Output:
	// run: <nil>
	// parse "x" after 1 attempt(s): strconv.Atoi: parsing "x": invalid syntax
	// parse "y" after 1 attempt(s): strconv.Atoi: parsing "y": invalid syntax
}

// This example shows Replay: after a fix, the items a stage dead-lettered into a file
// are fed through the fixed stage again.
func ExampleReplay() {
	dir, err := os.MkdirTemp("", "replay")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	path := filepath.Join(dir, "dead.jsonl")

	// The first run: prices with a comma as decimal separator are rejected.
	f, err := pipeline.OpenDeadLetterFile[string](path)
	if err != nil {
		fmt.Println(err)
		return
	}
	strict := pipeline.NewStage("price", 1, func(_ context.Context, s string) (float64, error) {
		v, err := strconv.ParseFloat(s, 64)
		return v, pipeline.Permanent(err)
	}, pipeline.WithDeadLetter(f.Add))
	p := pipeline.New()
	ok, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []string{"1.5", "2,25", "3,75"}), strict))
	fmt.Println("first run:", ok, err)
	if err := f.Close(); err != nil {
		fmt.Println(err)
		return
	}

	// The fix, fed with the dead letters of stage "price".
	fixed := pipeline.NewStage("price", 1, func(_ context.Context, s string) (float64, error) {
		return strconv.ParseFloat(strings.ReplaceAll(s, ",", "."), 64)
	})
	p = pipeline.New()
	again, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.Replay[string](p, path, "price"), fixed))
	fmt.Println("replay:", again, err)
	// Output:
	// first run: [1.5] <nil>
	// replay: [2.25 3.75] <nil>
}

// This example shows the report of a run: for every source, stage and sink, where its
// items went, and the dead letters grouped by cause. Report.String formats the same as
// a table.
func ExamplePipeline_Report() {
	p := pipeline.New()
	parse := pipeline.NewStage("parse", 2, func(_ context.Context, s string) (int, error) {
		n, err := strconv.Atoi(s)
		return n, pipeline.Permanent(err)
	}, pipeline.WithDeadLetter(pipeline.NewDeadLetterBuffer[string](100).Add))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, []string{"1", "2", "x", "4", "y"}), parse),
		pipeline.NewSink("save", 1, func(context.Context, int) error { return nil }))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	rep := p.Report()
	for _, s := range rep.Stages {
		fmt.Printf("%-9s %-6s in=%d ok=%d dead=%d\n", s.Name, s.Kind, s.In, s.Succeeded, s.DeadLettered)
	}
	for _, c := range rep.Causes() {
		fmt.Printf("%d × %s %q\n", c.Count, c.Type, c.Message)
	}
	// Output:
	// FromSlice source in=5 ok=5 dead=0
	// parse     stage  in=5 ok=3 dead=2
	// save      sink   in=3 ok=3 dead=0
	// 2 × *strconv.NumError "invalid syntax"
}

// This example shows the kinds of the rows of a report: a switch on StageReport.Kind
// with the Kind constants picks each row's telling figures. A Kind is a string: it
// prints, and marshals to JSON, as its name.
func ExampleKind() {
	p := pipeline.New()
	even := pipeline.Filter(pipeline.FromSlice(p, []int{1, 2, 3, 4, 5, 6, 7, 8}), func(v int) bool { return v%2 == 0 })
	squares := pipeline.Then(even, pipeline.NewStage("square", 2, func(_ context.Context, v int) (int, error) { return v * v, nil }))
	pipeline.ToBatches(squares, 2, pipeline.NewSink("save", 1, func(context.Context, []int) error { return nil }))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	for _, s := range p.Report().Stages {
		switch s.Kind {
		case pipeline.KindSource:
			fmt.Printf("%-9s %-6s sent %d\n", s.Name, s.Kind, s.Out)
		case pipeline.KindFilter:
			fmt.Printf("%-9s %-6s dropped %d\n", s.Name, s.Kind, s.Filtered)
		case pipeline.KindBatch:
			fmt.Printf("%-9s %-6s %d items in %d batches\n", s.Name, s.Kind, s.In, s.Out)
		case pipeline.KindStage, pipeline.KindSink:
			fmt.Printf("%-9s %-6s workers=%d ok=%d\n", s.Name, s.Kind, s.Workers, s.Succeeded)
		}
	}
	b, _ := json.Marshal(struct{ Kind pipeline.Kind }{pipeline.KindBatch})
	fmt.Println(string(b))
	// Output:
	// FromSlice source sent 8
	// Filter    filter dropped 4
	// square    stage  workers=2 ok=4
	// Batch     batch  4 items in 2 batches
	// save      sink   workers=1 ok=2
	// {"Kind":"batch"}
}

// This example shows WorkersNeeded sizing a stage by Little's law: 750 items/s at 20 ms
// each keep 15 items in service, 19 with 25 % headroom.
func ExampleWorkersNeeded() {
	fmt.Println(pipeline.WorkersNeeded(750, 20*time.Millisecond, 1.25))
	fmt.Println(pipeline.WorkersNeeded(750, 2*time.Millisecond, 1.25))
	// Output:
	// 19
	// 2
}

// This example shows the error markers: Transient (retry it), Permanent (set the item
// aside) and Fatal (stop the run). They keep the error's text and chain, and the
// outermost marker wins.
func ExampleTransient() {
	errBusy := errors.New("server busy")
	for _, err := range []error{
		errBusy,
		pipeline.Transient(errBusy),
		pipeline.Permanent(errBusy),
		pipeline.Fatal(errBusy),
		pipeline.Permanent(pipeline.Transient(errBusy)),
		fmt.Errorf("call 3: %w", pipeline.Transient(errBusy)),
	} {
		class, marked := pipeline.ClassOf(err)
		fmt.Printf("%-20s marked=%-5v class=%-9v is busy: %v\n", err, marked, class, errors.Is(err, errBusy))
	}
	// Output:
	// server busy          marked=false class=fatal     is busy: true
	// server busy          marked=true  class=transient is busy: true
	// server busy          marked=true  class=item      is busy: true
	// server busy          marked=true  class=fatal     is busy: true
	// server busy          marked=true  class=item      is busy: true
	// call 3: server busy  marked=true  class=transient is busy: true
}

// This example shows New with a pipeline-wide option (WithBuffer sets every stage's
// default queue size), and that a built pipeline can be run again: each run reads the
// slice afresh and gets its own queues, workers and counters.
func ExampleNew() {
	p := pipeline.New(pipeline.WithBuffer(8))
	sum := 0
	pipeline.To(pipeline.FromSlice(p, []int{1, 2, 3}), pipeline.NewSink("sum", 1, func(_ context.Context, v int) error {
		sum += v
		return nil
	}))
	for run := 1; run <= 2; run++ {
		if err := p.Run(context.Background()); err != nil {
			fmt.Println("error:", err)
			return
		}
		s, _ := p.Report().Stage("sum")
		fmt.Printf("run %d: sum=%d, the sink took %d items, its queue holds %d\n", run, sum, s.In, s.QueueCap)
	}
	// Output:
	// run 1: sum=6, the sink took 3 items, its queue holds 8
	// run 2: sum=12, the sink took 3 items, its queue holds 8
}

// This example shows Then joining stages of different item types: strings are parsed
// into ints, doubled, and formatted back. The compiler checks that each stage's input
// type is the item type of the stream it is attached to.
func ExampleThen() {
	parse := pipeline.NewStage("parse", 1, func(_ context.Context, s string) (int, error) {
		return strconv.Atoi(s)
	})
	double := pipeline.NewStage("double", 1, func(_ context.Context, n int) (int, error) {
		return 2 * n, nil
	})
	format := pipeline.NewStage("format", 1, func(_ context.Context, n int) (string, error) {
		return fmt.Sprintf("<%d>", n), nil
	})

	p := pipeline.New()
	nums := pipeline.Then(pipeline.FromSlice(p, []string{"1", "20", "300"}), parse) // a *Stream[int]
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.Then(nums, double), format))
	fmt.Println(out, err)
	// Output: [<2> <40> <600>] <nil>
}

// This example shows Run stopped by its caller: the parent context is canceled with a
// cause (say, on SIGTERM), every stage stops, and Run returns that cause once every
// goroutine of the run has exited.
func ExamplePipeline_Run() {
	errShutdown := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)

	p := pipeline.New()
	naturals := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
		for i := 0; ; i++ {
			if err := emit(i); err != nil {
				return err
			}
		}
	})
	pipeline.To(naturals, pipeline.NewSink("consume", 1, func(_ context.Context, v int) error {
		if v == 3 {
			cancel(errShutdown)
		}
		return nil
	}))
	err := p.Run(ctx)
	fmt.Println(err, errors.Is(err, errShutdown))
	s, _ := p.Report().Stage("consume")
	fmt.Println("consumed before stopping:", s.Succeeded)
	// Output:
	// shutting down true
	// consumed before stopping: 4
}

// This example shows ErrRunning: a pipeline runs one run at a time, and a Run called
// while it is running (here from its own sink) returns ErrRunning at once, leaving the
// run in progress alone.
func ExampleErrRunning() {
	p := pipeline.New()
	var second error
	pipeline.To(pipeline.FromSlice(p, []int{1}), pipeline.NewSink("sink", 1, func(ctx context.Context, _ int) error {
		second = p.Run(ctx)
		return nil
	}))
	err := p.Run(context.Background())
	fmt.Println(err, errors.Is(second, pipeline.ErrRunning))
	// Output: <nil> true
}

// This example shows FromSlice: a source of a slice's items, in order. One worker in
// the sink keeps that order.
func ExampleFromSlice() {
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []string{"mon", "tue", "wed"}), pipeline.NewSink("print", 1, func(_ context.Context, day string) error {
		fmt.Println(day)
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
	}
	// Output:
	// mon
	// tue
	// wed
}

// This example shows FromSeq, a source from an iterator: here an endless one, read
// until the loop over All breaks. Stopping the run breaks the loop over the iterator
// too, so its cleanup runs before All returns.
func ExampleFromSeq() {
	ticks := func(yield func(int) bool) {
		defer fmt.Println("iterator cleaned up") // say, closing a file or a cursor
		for i := 1; ; i++ {
			if !yield(i) {
				return
			}
		}
	}

	p := pipeline.New()
	for v, err := range pipeline.All(context.Background(), pipeline.FromSeq(p, ticks)) {
		if err != nil {
			fmt.Println("error:", err)
			break
		}
		fmt.Println("tick", v)
		if v == 2 {
			break
		}
	}
	fmt.Println("done")
	// Output:
	// tick 1
	// tick 2
	// iterator cleaned up
	// done
}

// This example shows Merge joining two sources into one stream (fan-in). Items come
// in arrival order, so the result is sorted before printing; the order of each input
// is kept.
func ExampleMerge() {
	p := pipeline.New()
	east := pipeline.FromSlice(p, []string{"east-1", "east-2"})
	west := pipeline.FromSlice(p, []string{"west-1", "west-2", "west-3"})
	out, err := pipeline.Collect(context.Background(), pipeline.Merge(east, west))
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println("east in order:", slices.IsSorted(slices.DeleteFunc(slices.Clone(out), func(s string) bool { return s[0] != 'e' })))
	slices.Sort(out)
	fmt.Println(out)
	for _, s := range p.Report().Stages {
		if s.Kind == pipeline.KindSource {
			fmt.Printf("%s sent %d\n", s.Name, s.Out)
		}
	}
	// Output:
	// east in order: true
	// [east-1 east-2 west-1 west-2 west-3]
	// FromSlice sent 2
	// FromSlice#2 sent 3
}

// This example shows Tee copying every item to two branches (broadcast): one archives
// the orders, the other sums them. The slower branch sets the pace of both.
func ExampleTee() {
	var (
		archived []int
		total    int
	)
	p := pipeline.New()
	branches := pipeline.Tee(pipeline.FromSlice(p, []int{100, 250, 75}), 2)
	pipeline.To(branches[0], pipeline.NewSink("archive", 1, func(_ context.Context, v int) error {
		archived = append(archived, v)
		return nil
	}))
	pipeline.To(branches[1], pipeline.NewSink("total", 1, func(_ context.Context, v int) error {
		total += v
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println("archived:", archived)
	fmt.Println("total:", total)
	// Output:
	// archived: [100 250 75]
	// total: 425
}

// This example shows WithOrdered: four workers handle items concurrently and item 0
// finishes after item 3 (it waits for it), yet the stage emits its outputs in input
// order.
func ExampleWithOrdered() {
	var (
		mu       sync.Mutex
		finished []int
	)
	item3Done := make(chan struct{})
	square := pipeline.NewStage("square", 4, func(ctx context.Context, v int) (int, error) {
		switch v {
		case 0:
			select { // a slow item at the head: the window holds the others back
			case <-item3Done:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		case 3:
			defer close(item3Done)
		}
		mu.Lock()
		finished = append(finished, v)
		mu.Unlock()
		return v * v, nil
	}, pipeline.WithOrdered(0))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{0, 1, 2, 3}), square))
	fmt.Println(out, err)
	fmt.Println("item 0 finished after item 3:", slices.Index(finished, 0) > slices.Index(finished, 3))
	// Output:
	// [0 1 4 9] <nil>
	// item 0 finished after item 3: true
}

// This example shows WithKey: the events of one account are applied one at a time and
// in input order, by the worker that the account hashes to, while different accounts
// are applied concurrently.
func ExampleWithKey() {
	type event struct {
		Account string
		Seq     int
	}
	events := []event{{"alice", 1}, {"bob", 1}, {"alice", 2}, {"carol", 1}, {"bob", 2}, {"alice", 3}, {"carol", 2}}

	var (
		mu      sync.Mutex
		applied = map[string][]int{}
	)
	apply := pipeline.NewSink("apply", 3, func(_ context.Context, e event) error {
		mu.Lock()
		defer mu.Unlock()
		applied[e.Account] = append(applied[e.Account], e.Seq)
		return nil
	}, pipeline.WithKey(func(e event) string { return e.Account }))

	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, events), apply)
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	for _, account := range slices.Sorted(maps.Keys(applied)) {
		fmt.Println(account, applied[account])
	}
	// Output:
	// alice [1 2 3]
	// bob [1 2]
	// carol [1 2]
}

// This example shows WithPartition: orders already carry the number of their shard (0
// to 2), and each of the three workers writes one shard, its orders in input order.
// With WithKey, two shards could hash to one worker and leave another idle.
func ExampleWithPartition() {
	type order struct {
		Shard, ID int
	}
	orders := []order{{0, 1}, {1, 2}, {2, 3}, {0, 4}, {2, 5}, {1, 6}, {0, 7}}

	var (
		mu      sync.Mutex
		written = map[int][]int{}
	)
	write := pipeline.NewSink("write", 3, func(_ context.Context, o order) error {
		mu.Lock()
		defer mu.Unlock()
		written[o.Shard] = append(written[o.Shard], o.ID)
		return nil
	}, pipeline.WithPartition(func(o order) int { return o.Shard }))

	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, orders), write)
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	for _, shard := range slices.Sorted(maps.Keys(written)) {
		fmt.Println("shard", shard, written[shard])
	}
	// Output:
	// shard 0 [1 4 7]
	// shard 1 [2 6]
	// shard 2 [3 5]
}

// This example shows Batch grouping items into slices of 3, in arrival order; the
// last, partial batch is flushed when the input ends. The report counts the flushes by
// reason.
func ExampleBatch() {
	p := pipeline.New()
	batches, err := pipeline.Collect(context.Background(), pipeline.Batch(pipeline.FromSlice(p, []int{1, 2, 3, 4, 5, 6, 7}), 3))
	fmt.Println(batches, err)
	s, _ := p.Report().Stage("Batch")
	fmt.Printf("%d items in %d batches: %d full, %d at the end\n", s.In, s.Out, s.Flushes.Size, s.Flushes.End)
	// Output:
	// [[1 2 3] [4 5 6] [7]] <nil>
	// 7 items in 3 batches: 2 full, 1 at the end
}

// This example shows WithLinger: a batch that is not full is flushed once its first
// item has waited for the linger, so a slow trickle of items is not held back. Here the
// source sends the next item only after the sink got the previous one, so each batch
// of up to 10 items can only leave by the linger. Real code would linger for a second
// or so; the output does not depend on the value.
func ExampleWithLinger() {
	got := make(chan struct{}, 1)
	p := pipeline.New()
	trickle := pipeline.Generate(p, func(ctx context.Context, emit func(string) error) error {
		for _, s := range []string{"a", "b", "c"} {
			if err := emit(s); err != nil {
				return err
			}
			select { // wait until the sink got it: a trickle
			case <-got:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	write := pipeline.NewSink("write", 1, func(_ context.Context, batch []string) error {
		fmt.Println("write", batch)
		got <- struct{}{}
		return nil
	})
	pipeline.ToBatches(trickle, 10, write, pipeline.WithLinger(5*time.Millisecond))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	s, _ := p.Report().Stage("Batch")
	fmt.Printf("flushes: %d by linger, %d full, %d at the end\n", s.Flushes.Linger, s.Flushes.Size, s.Flushes.End)
	// Output:
	// write [a]
	// write [b]
	// write [c]
	// flushes: 3 by linger, 0 full, 0 at the end
}

// This example shows WithMaxBytes: batches of up to 10 items, but of at most 12 bytes
// of text. An item larger than the limit makes a batch of its own.
func ExampleWithMaxBytes() {
	words := []string{"alpha", "beta", "gamma", "delta", "a-very-long-word", "pi"}
	p := pipeline.New()
	batches := pipeline.Batch(pipeline.FromSlice(p, words), 10, pipeline.WithMaxBytes(12, func(s string) int { return len(s) }))
	out, err := pipeline.Collect(context.Background(), batches)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	for _, b := range out {
		fmt.Printf("%q (%d bytes)\n", b, len(strings.Join(b, "")))
	}
	s, _ := p.Report().Stage("Batch")
	fmt.Printf("flushes: %d by bytes, %d at the end\n", s.Flushes.Bytes, s.Flushes.End)
	// Output:
	// ["alpha" "beta"] (9 bytes)
	// ["gamma" "delta"] (10 bytes)
	// ["a-very-long-word"] (16 bytes)
	// ["pi"] (2 bytes)
	// flushes: 3 by bytes, 1 at the end
}

// This example shows Flatten undoing a Batch: ids are looked up a batch at a time (one
// query for several ids), and the names flow on one by one.
func ExampleFlatten() {
	names := map[int]string{1: "ada", 2: "grace", 3: "linus", 4: "ken", 5: "rob"}
	lookup := pipeline.NewStage("lookup", 1, func(_ context.Context, ids []int) ([]string, error) {
		out := make([]string, len(ids)) // say, SELECT name FROM users WHERE id IN (...)
		for i, id := range ids {
			out[i] = names[id]
		}
		return out, nil
	})

	p := pipeline.New()
	batches := pipeline.Batch(pipeline.FromSlice(p, []int{1, 2, 3, 4, 5}), 2)
	out, err := pipeline.Collect(context.Background(), pipeline.Flatten(pipeline.Then(batches, lookup)))
	fmt.Println(out, err)
	s, _ := p.Report().Stage("lookup")
	fmt.Println("queries:", s.Succeeded)
	// Output:
	// [ada grace linus ken rob] <nil>
	// queries: 3
}

// This example shows ToBatches feeding a sink that takes a batch per call, such as a
// database's bulk insert.
func ExampleToBatches() {
	insert := pipeline.NewSink("insert", 1, func(_ context.Context, rows []string) error {
		fmt.Printf("INSERT %d rows %v\n", len(rows), rows)
		return nil
	})
	p := pipeline.New()
	pipeline.ToBatches(pipeline.FromSlice(p, []string{"a", "b", "c", "d", "e"}), 2, insert)
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
	}
	// Output:
	// INSERT 2 rows [a b]
	// INSERT 2 rows [c d]
	// INSERT 1 rows [e]
}

// This example shows FromCheckpoint: a checkpointed source that a second run resumes where
// the first one stopped. The first run fails at item "c" (the disk is full); the
// position saved is that of "c", the first item whose write is not committed. After
// the fix, the same pipeline runs again from there, and each item is written once.
func ExampleFromCheckpoint() {
	dir, err := os.MkdirTemp("", "resume")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	store := pipeline.NewFileCheckpoint(filepath.Join(dir, "position"))

	lines := []string{"a", "b", "c", "d", "e"} // say, the lines of a file
	from := func(_ context.Context, pos int64) iter.Seq2[string, error] {
		fmt.Println("reading from position", pos)
		return func(yield func(string, error) bool) {
			for _, l := range lines[pos:] {
				if !yield(l, nil) {
					return
				}
			}
		}
	}
	diskFull := true
	writes := map[string]int{}
	write := pipeline.NewSink("write", 1, func(_ context.Context, l string) error {
		if l == "c" && diskFull {
			return errors.New("disk full")
		}
		writes[l]++ // an idempotent write, keyed by the item, would be safe to redo
		return nil
	})

	p := pipeline.New()
	pipeline.To(pipeline.FromCheckpoint(p, store, from), write)
	err = p.Run(context.Background())
	fmt.Println("first run:", err)
	fmt.Println("saved position:", p.Report().Checkpoint)

	diskFull = false
	err = p.Run(context.Background())
	fmt.Println("second run:", err)
	fmt.Println("saved position:", p.Report().Checkpoint)
	fmt.Println("writes per item:", writes)
	// Output:
	// reading from position 0
	// first run: pipeline: stage "write": disk full
	// saved position: 2
	// reading from position 2
	// second run: <nil>
	// saved position: 5
	// writes per item: map[a:1 b:1 c:1 d:1 e:1]
}

// This example shows FileCheckpoint, a CheckpointStore in a file: Load returns 0 until
// something is saved, and Save replaces the file atomically.
func ExampleFileCheckpoint() {
	dir, err := os.MkdirTemp("", "checkpoint")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	path := filepath.Join(dir, "orders.pos")
	store := pipeline.NewFileCheckpoint(path)

	ctx := context.Background()
	pos, err := store.Load(ctx)
	fmt.Println("before any save:", pos, err)
	if err := store.Save(ctx, 1200); err != nil {
		fmt.Println(err)
		return
	}
	pos, err = store.Load(ctx)
	fmt.Println("after a save:", pos, err)
	b, err := os.ReadFile(path)
	fmt.Printf("the file holds %q %v\n", b, err)
	// Output:
	// before any save: 0 <nil>
	// after a save: 1200 <nil>
	// the file holds "1200\n" <nil>
}

// This example shows WithSaveEvery and WithMaxRedo on a checkpointed source: the
// position is saved each time 2 more items are committed, and the source never gets
// more than 4 items past the saved position, so a crash would redo at most 4 items
// (the bound holds back a fast source; WithSaveInterval adds saves by time). The sink
// checks the bound by reading the saved position as it writes each item.
func ExampleWithSaveEvery() {
	dir, err := os.MkdirTemp("", "saveevery")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	store := pipeline.NewFileCheckpoint(filepath.Join(dir, "position"))

	var saves atomic.Int64
	p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
		if e.Kind == pipeline.EventCheckpoint {
			saves.Add(1)
		}
	}))
	from := func(_ context.Context, pos int64) iter.Seq2[int64, error] {
		return func(yield func(int64, error) bool) {
			for i := pos; i < 20; i++ { // the item at position i is i
				if !yield(i, nil) {
					return
				}
			}
		}
	}
	var ahead int64 // the most items written past the saved position
	write := pipeline.NewSink("write", 1, func(ctx context.Context, pos int64) error {
		saved, err := store.Load(ctx)
		if err != nil {
			return err
		}
		ahead = max(ahead, pos+1-saved)
		return nil
	})
	pipeline.To(pipeline.FromCheckpoint(p, store, from, pipeline.WithSaveEvery(2), pipeline.WithMaxRedo(4)), write)
	err = p.Run(context.Background())
	fmt.Println("run:", err, "saved position:", p.Report().Checkpoint)
	fmt.Println("at most 4 items past the saved position:", ahead <= 4)
	fmt.Println("saved at least 20/4 times:", saves.Load() >= 5)
	// Output:
	// run: <nil> saved position: 20
	// at most 4 items past the saved position: true
	// saved at least 20/4 times: true
}

// This example shows Snapshot reading a run in progress: the sink is stuck on its first
// item (in real life, a slow database), the two items behind it fill its queue, and the
// source waits for room. A progress loop would print Snapshot().Line() every few
// seconds.
func ExamplePipeline_Snapshot() {
	started, emitted, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	p := pipeline.New()
	src := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
		for i := range 3 {
			if err := emit(i); err != nil {
				return err
			}
		}
		close(emitted) // item 0 is in the sink's hands, items 1 and 2 in its queue
		return nil
	})
	pipeline.To(src, pipeline.NewSink("write", 1, func(ctx context.Context, v int) error {
		if v == 0 {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}, pipeline.WithBuffer(2)))

	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	<-started
	<-emitted
	snap := p.Snapshot()
	s, _ := snap.Stage("write")
	fmt.Println("running:", snap.Running)
	fmt.Printf("write: queue %d/%d, busy workers %d/%d, in flight %d\n", s.QueueLen, s.QueueCap, s.Busy, s.Workers, s.InFlight)

	close(release)
	fmt.Println("run:", <-done)
	s, _ = p.Snapshot().Stage("write") // between runs: the last run's report
	fmt.Printf("write: %d succeeded, queue %d, busy workers %d\n", s.Succeeded, s.QueueLen, s.Busy)
	// Output:
	// running: true
	// write: queue 2/2, busy workers 1/1, in flight 1
	// run: <nil>
	// write: 3 succeeded, queue 0, busy workers 0
}

// This example shows Line, the one-line progress report, on a Snapshot of a run whose
// "parse" stage is stuck on its first item: its queue is full, all its workers are busy,
// and the sink after it waits with an empty queue. Nothing has been sent on yet, so
// both rates are 0/s.
func ExampleReport_Line() {
	started, emitted, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	p := pipeline.New()
	src := pipeline.Generate(p, func(_ context.Context, emit func(string) error) error {
		for _, s := range []string{"1", "2", "3"} {
			if err := emit(s); err != nil {
				return err
			}
		}
		close(emitted)
		return nil
	})
	parse := pipeline.NewStage("parse", 1, func(ctx context.Context, s string) (int, error) {
		if s == "1" {
			close(started)
			select { // stuck, until the example has printed the line
			case <-release:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		return strconv.Atoi(s)
	}, pipeline.WithBuffer(2))
	pipeline.To(pipeline.Then(src, parse), pipeline.NewSink("write", 1, func(context.Context, int) error { return nil }))

	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	<-started
	<-emitted // items "2" and "3" wait in the queue of "parse"
	fmt.Println(p.Snapshot().Line())
	close(release)
	fmt.Println("run:", <-done)
	// Output:
	// parse 0/s q=2/2 busy=1/1 | write 0/s q=0/64 busy=0/1
	// run: <nil>
}

// This example shows Bottleneck reading the final report of a run whose "slow" stage
// held its first item until its queue had filled up, while the sink after it kept up.
// Its Why field gives the evidence, with timings that vary from run to run; with a
// target rate, Suggested gives the workers the stage needs for it.
func ExampleReport_Bottleneck() {
	release := make(chan struct{})
	p := pipeline.New()
	src := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
		defer close(release)
		for i := range 5 {
			if err := emit(i); err != nil {
				return err
			}
		}
		return nil // item 0 is in the worker's hands, items 1 to 4 fill the queue
	})
	slow := pipeline.NewStage("slow", 1, func(ctx context.Context, v int) (int, error) {
		if v == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		return v, nil
	}, pipeline.WithBuffer(4))
	save := pipeline.NewSink("save", 1, func(context.Context, int) error { return nil }, pipeline.WithBuffer(16))
	pipeline.To(pipeline.Then(src, slow), save)
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	b := p.Report().Bottleneck(0)
	fmt.Printf("bottleneck: %q with %d worker(s)\n", b.Stage, b.Workers)
	// Output: bottleneck: "slow" with 1 worker(s)
}

// This example shows WithObserver counting a run's events by kind: a retry for each
// extra attempt, a dead letter for each item set aside, and a stage-done for each stage
// whose workers have all exited. The observer is called from several workers at once,
// so it locks.
func ExampleWithObserver() {
	var (
		mu     sync.Mutex
		counts = map[string]int{}
	)
	p := pipeline.New(pipeline.WithObserver(func(e pipeline.Event) {
		mu.Lock()
		defer mu.Unlock()
		counts[e.Kind.String()]++
	}))

	attempts := make([]atomic.Int32, 9)
	process := pipeline.NewStage("process", 3, func(_ context.Context, v int) (int, error) {
		n := attempts[v].Add(1)
		switch {
		case v%3 == 0:
			return 0, pipeline.Permanent(errors.New("invalid"))
		case v%3 == 1 && n < 3:
			return 0, pipeline.Transient(errors.New("busy")) // succeeds on its third attempt
		}
		return v, nil
	}, pipeline.WithRetry(3, nil), pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(9)), process),
		pipeline.NewSink("save", 2, func(context.Context, int) error { return nil }))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	for _, kind := range slices.Sorted(maps.Keys(counts)) {
		fmt.Println(kind, counts[kind])
	}
	// Output:
	// dead-letter 3
	// retry 6
	// stage-done 2
}

// This example shows WithLogger writing a run's events to a slog.Logger: a retry at
// Debug, a dead letter at Warn, a finished stage at Info. The handler drops the time
// so that the output is stable.
func ExampleWithLogger() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))
	p := pipeline.New(pipeline.WithLogger(logger))

	failedOnce := false
	send := pipeline.NewSink("send", 1, func(_ context.Context, to string) error {
		switch {
		case to == "flaky@example.com" && !failedOnce:
			failedOnce = true
			return pipeline.Transient(errors.New("connection reset"))
		case !strings.Contains(to, "@"):
			return pipeline.Permanent(fmt.Errorf("bad address %q", to))
		}
		return nil
	}, pipeline.WithRetry(3, nil), pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[string]))
	pipeline.To(pipeline.FromSlice(p, []string{"ada@example.com", "flaky@example.com", "nobody"}), send)
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
	}
	// Output:
	// level=DEBUG msg="pipeline: retrying item" stage=send attempt=1 error="connection reset"
	// level=WARN msg="pipeline: item dead-lettered" stage=send attempts=1 error="bad address \"nobody\""
	// level=INFO msg="pipeline: stage done" stage=send
}

// This example shows DiscardDeadLetter: the stage may set items aside, and the report
// still counts them by cause, but nothing keeps them.
func ExampleDiscardDeadLetter() {
	parse := pipeline.NewStage("parse", 1, func(_ context.Context, s string) (int, error) {
		n, err := strconv.Atoi(s)
		return n, pipeline.Permanent(err)
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[string]))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []string{"1", "x", "2", "y", "z"}), parse))
	fmt.Println(out, err)
	rep := p.Report()
	fmt.Println("set aside:", rep.DeadLettered())
	for _, c := range rep.Causes() {
		fmt.Printf("%d × %s %q\n", c.Count, c.Type, c.Message)
	}
	// Output:
	// [1 2] <nil>
	// set aside: 3
	// 3 × *strconv.NumError "invalid syntax"
}

// This example shows ReadDeadLetters reading a dead-letter file, here one left by a
// run that crashed while writing its third record: the torn last line is ignored.
func ExampleReadDeadLetters() {
	dir, err := os.MkdirTemp("", "readdeadletters")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	path := filepath.Join(dir, "dead.jsonl")
	records := `{"stage":"parse","item":"x","attempts":1,"class":"item","err_type":"*strconv.NumError","first_error":"invalid x","last_error":"invalid x","time":"2025-01-02T03:04:05Z"}
{"stage":"fetch","item":"42","attempts":3,"class":"transient","err_type":"error","first_error":"503","last_error":"timeout","time":"2025-01-02T03:04:06Z"}
{"stage":"parse","item":"y","attem`
	if err := os.WriteFile(path, []byte(records), 0o600); err != nil {
		fmt.Println(err)
		return
	}

	dls, err := pipeline.ReadDeadLetters[string](path)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, dl := range dls {
		fmt.Printf("%s %q: %s after %d attempt(s), first %q, last %q\n", dl.Stage, dl.Item, dl.Class, dl.Attempts, dl.FirstError, dl.LastError)
	}
	// Output:
	// parse "x": item after 1 attempt(s), first "invalid x", last "invalid x"
	// fetch "42": transient after 3 attempt(s), first "503", last "timeout"
}

// This example shows ClassOf checking the errors a stage function returns, as a unit
// test of the function would: its markers say which HTTP statuses are worth a retry,
// and which items should be set aside.
func ExampleClassOf() {
	check := func(status int) error {
		switch {
		case status == 429 || status >= 500:
			return pipeline.Transient(fmt.Errorf("status %d", status))
		case status >= 400:
			return pipeline.Permanent(fmt.Errorf("status %d", status))
		case status >= 300:
			return fmt.Errorf("unexpected redirect %d", status) // unmarked: the classifier decides
		}
		return nil
	}
	for _, status := range []int{200, 302, 404, 429, 503} {
		err := check(status)
		if err == nil {
			fmt.Println(status, "ok")
			continue
		}
		class, marked := pipeline.ClassOf(err)
		fmt.Println(status, class, marked)
	}
	// Output:
	// 200 ok
	// 302 fatal false
	// 404 item true
	// 429 transient true
	// 503 transient true
}

// This example shows Fatal overriding a stage's classifier: the classifier sets every
// error aside, but an expired token would fail every item after it, so the function
// marks it Fatal and the run stops.
func ExampleFatal() {
	dead := pipeline.NewDeadLetterBuffer[string](10)
	call := pipeline.NewStage("call", 1, func(_ context.Context, req string) (string, error) {
		switch req {
		case "bad-input":
			return "", errors.New("invalid request")
		case "after-expiry":
			return "", pipeline.Fatal(errors.New("401 unauthorized"))
		}
		return req + " done", nil
	}, pipeline.WithClassifier(func(error) pipeline.Class { return pipeline.ClassItem }), pipeline.WithDeadLetter(dead.Add))

	p := pipeline.New()
	// What Collect returns with the error depends on how far the loop got before the
	// run stopped; the error and the dead letters do not.
	_, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []string{"a", "bad-input", "b", "after-expiry", "c"}), call))
	fmt.Println(err)
	fmt.Println("dead letters:", len(dead.Items()))
	// Output:
	// pipeline: stage "call": 401 unauthorized
	// dead letters: 1
}

// This example shows Permanent on a stage with retries: a malformed address is set
// aside at once, while a transient failure is retried until the attempts run out.
func ExamplePermanent() {
	dead := pipeline.NewDeadLetterBuffer[string](10)
	send := pipeline.NewSink("send", 1, func(_ context.Context, to string) error {
		switch {
		case !strings.Contains(to, "@"):
			return pipeline.Permanent(fmt.Errorf("bad address %q", to))
		case to == "down@example.com":
			return pipeline.Transient(errors.New("mailbox unavailable"))
		}
		return nil
	}, pipeline.WithRetry(3, nil), pipeline.WithDeadLetter(dead.Add))

	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, []string{"ada@example.com", "nobody", "down@example.com"}), send)
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	for _, dl := range dead.Items() {
		fmt.Printf("%s: %s after %d attempt(s): %s\n", dl.Item, dl.Class, dl.Attempts, dl.LastError)
	}
	// Output:
	// nobody: item after 1 attempt(s): bad address "nobody"
	// down@example.com: transient after 3 attempt(s): mailbox unavailable
}

// This example shows the waits of ExponentialBackoff: they double from the base up to
// the limit, and each is drawn at random from the upper half of its range (jitter), so
// the example prints the ranges and checks the waits against them.
func ExampleExponentialBackoff() {
	backoff := pipeline.ExponentialBackoff(100*time.Millisecond, time.Second) // for WithRetry(n, backoff)
	for retry := 1; retry <= 6; retry++ {
		hi := min(100*time.Millisecond<<(retry-1), time.Second)
		d := backoff(retry)
		fmt.Printf("retry %d waits %v to %v: %v\n", retry, hi/2, hi, hi/2 <= d && d <= hi)
	}
	// Output:
	// retry 1 waits 50ms to 100ms: true
	// retry 2 waits 100ms to 200ms: true
	// retry 3 waits 200ms to 400ms: true
	// retry 4 waits 400ms to 800ms: true
	// retry 5 waits 500ms to 1s: true
	// retry 6 waits 500ms to 1s: true
}

// This example shows ConstantBackoff: the same wait before every retry.
func ExampleConstantBackoff() {
	backoff := pipeline.ConstantBackoff(250 * time.Millisecond) // for WithRetry(n, backoff)
	fmt.Println(backoff(1), backoff(2), backoff(10))
	// Output: 250ms 250ms 250ms
}

// This example shows a Backoff of your own: any function from the retry number to a
// wait, here a linear one capped at a second.
func ExampleBackoff() {
	var linear pipeline.Backoff = func(retry int) time.Duration { // for WithRetry(n, linear)
		return min(time.Duration(retry)*300*time.Millisecond, time.Second)
	}
	for retry := 1; retry <= 4; retry++ {
		fmt.Println(retry, linear(retry))
	}
	// Output:
	// 1 300ms
	// 2 600ms
	// 3 900ms
	// 4 1s
}

// This example shows WithBuffer bounding a stage's queue, and the backpressure it
// gives: while the sink is stuck on its first item, the source can put only 2 more in
// the queue, and then waits until the sink takes one.
func ExampleWithBuffer() {
	var emitted atomic.Int64
	three := make(chan struct{})
	p := pipeline.New()
	src := pipeline.Generate(p, func(_ context.Context, emit func(int64) error) error {
		for i := range int64(10) {
			if err := emit(i); err != nil {
				return err
			}
			if emitted.Add(1) == 3 {
				close(three)
			}
		}
		return nil
	})
	var ahead int64 // the most items the source was ahead of the sink
	write := pipeline.NewSink("write", 1, func(ctx context.Context, v int64) error {
		if v == 0 {
			select { // stuck until the source has filled the queue
			case <-three:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		ahead = max(ahead, emitted.Load()-v)
		return nil
	}, pipeline.WithBuffer(2))
	pipeline.To(src, write)
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	s, _ := p.Report().Stage("write")
	fmt.Printf("queue capacity %d, peak length %d\n", s.QueueCap, s.PeakQueue)
	fmt.Println("most items sent ahead of the sink:", ahead)
	// Output:
	// queue capacity 2, peak length 2
	// most items sent ahead of the sink: 3
}

// This example shows a batch sink that sets aside the rows its database rejected
// itself: the report counts them in the sink's row, apart from the batches.
func ExampleSetAside() {
	p := pipeline.New()
	pipeline.ToBatches(pipeline.FromSlice(p, []int{1, 2, 3, 4, 5, 6}), 3, pipeline.NewSink("load", 1, func(ctx context.Context, rows []int) error {
		for _, r := range rows {
			if r == 4 { // say the database refused it, and it went to a dead-letter table
				pipeline.SetAside(ctx, fmt.Errorf("row %d: value out of range", r))
			}
		}
		return nil
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	load, _ := p.Report().Stage("load")
	fmt.Println("batches:", load.Succeeded, "rows set aside:", load.SetAside, "causes:", load.Causes)
	// Output:
	// batches: 2 rows set aside: 1 causes: [{error row #: value out of range 1}]
}

// This example shows a DeadLetterBuffer that keeps at most 2 dead letters: the rest
// are counted as overflow, and the report still counts every item set aside.
func ExampleDeadLetterBuffer() {
	dead := pipeline.NewDeadLetterBuffer[int](2)
	reject := pipeline.NewStage("reject", 1, func(_ context.Context, v int) (int, error) {
		if v%2 == 1 {
			return 0, pipeline.Permanent(fmt.Errorf("odd: %d", v))
		}
		return v, nil
	}, pipeline.WithDeadLetter(dead.Add))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, ints(10)), reject))
	fmt.Println(out, err)
	for _, dl := range dead.Items() {
		fmt.Println("kept:", dl.Item, dl.LastError)
	}
	fmt.Println("overflow:", dead.Overflow())
	fmt.Println("set aside in all:", p.Report().DeadLettered())
	// Output:
	// [0 2 4 6 8] <nil>
	// kept: 1 odd: 1
	// kept: 3 odd: 3
	// overflow: 3
	// set aside in all: 5
}

// This example shows a PanicError: a panic in a stage function does not crash the
// process; the run fails with the panic's value and stack, and errors.As sees through
// it to a panic value that is an error (here a runtime.Error).
func ExamplePanicError() {
	divide := pipeline.NewStage("divide", 1, func(_ context.Context, d int) (int, error) {
		return 100 / d, nil
	})
	p := pipeline.New()
	_, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, []int{5, 0, 4}), divide))
	fmt.Println(err)
	if pe, ok := errors.AsType[*pipeline.PanicError](err); ok {
		fmt.Println("stack captured:", len(pe.Stack) > 0)
	}
	_, isRuntime := errors.AsType[runtime.Error](err)
	fmt.Println("runtime error:", isRuntime)
	// Output:
	// pipeline: stage "divide": panic: runtime error: integer divide by zero
	// stack captured: true
	// runtime error: true
}

// This example shows a Budget that drains: once more than half of the last 4 items
// have failed, the stage stops taking new items, lets the ones it holds finish, and
// the run returns a *BudgetError. The items never started are counted in the report.
func ExampleBudget() {
	validate := pipeline.NewStage("validate", 1, func(_ context.Context, v int) (int, error) {
		if v >= 3 { // from item 3 on, a bad upstream sends garbage
			return 0, pipeline.Permanent(fmt.Errorf("item %d: garbage", v))
		}
		return v, nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]),
		pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.5, MinSample: 4, Window: 4, Drain: true}))

	p := pipeline.New()
	out, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.FromSlice(p, ints(100)), validate))
	fmt.Println(out)
	fmt.Println(err)
	if be, ok := errors.AsType[*pipeline.BudgetError](err); ok {
		fmt.Printf("%d of the last %d failed, drained: %v\n", be.Failed, be.Seen, be.Drained)
	}
	rep := p.Report()
	fmt.Println("set aside:", rep.DeadLettered(), "not started:", rep.NotStarted())
	// Output:
	// [0 1 2]
	// pipeline: stage "validate": pipeline: error budget exceeded: 3/4 of the last 4 items failed (max 0.5), drained
	// 3 of the last 4 failed, drained: true
	// set aside: 3 not started: 94
}

// This example shows Report.String: the account of a run as a table, one row per
// source, stage and sink, then the main causes of dead letters. A queue of 1 keeps the
// peak queue column stable for the example.
func ExampleReport_String() {
	parse := pipeline.NewStage("parse", 1, func(_ context.Context, s string) (int, error) {
		n, err := strconv.Atoi(s)
		return n, pipeline.Permanent(err)
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[string]))
	p := pipeline.New(pipeline.WithBuffer(1))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, []string{"1", "x", "3", "4"}), parse),
		pipeline.NewSink("save", 2, func(context.Context, int) error { return nil }))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Print(p.Report())
	// Output:
	// stage            kind    wrk        in        ok       out  retried     dead   failed notstart  dropped       queue
	// FromSlice        source    0         4         4         4        0        0        0        0        0           -
	// parse            stage     1         4         3         3        0        1        0        0        0         1/1
	// save             sink      2         3         3         3        0        0        0        0        0         1/1
	// dead letters: 1 × *strconv.NumError "invalid syntax"
}

// This example shows WithTotal declaring the size of an input that its source cannot
// count, here the lines of a file read by a checkpointed source: a second run, resumed
// after the first stopped at "c", starts with two lines done, and reports its progress
// as (Resumed + Out) / Total.
func ExampleWithTotal() {
	dir, err := os.MkdirTemp("", "total")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	store := pipeline.NewFileCheckpoint(filepath.Join(dir, "position"))

	lines := []string{"a", "b", "c", "d", "e"} // say, a file of 5 lines, counted once by wc -l
	from := func(_ context.Context, pos int64) iter.Seq2[string, error] {
		return func(yield func(string, error) bool) {
			for _, l := range lines[pos:] {
				if !yield(l, nil) {
					return
				}
			}
		}
	}
	run := func(stopAt string) pipeline.Report {
		p := pipeline.New()
		src := pipeline.FromCheckpoint(p, store, from, pipeline.WithName("read"), pipeline.WithTotal(int64(len(lines))))
		pipeline.To(src, pipeline.NewSink("write", 1, func(_ context.Context, l string) error {
			if l == stopAt {
				return errors.New("disk full")
			}
			return nil
		}))
		_ = p.Run(context.Background())
		return p.Report()
	}
	rep := run("c")
	fmt.Println("first run:", rep.Err, "at position", rep.Checkpoint)
	rep = run("")
	read, _ := rep.Stage("read")
	fmt.Printf("second run: %d done before, %d read of %d: %.0f %%\n",
		read.Resumed, read.Out, read.Total, 100*float64(read.Resumed+read.Out)/float64(read.Total))
	// Output:
	// first run: pipeline: stage "write": disk full at position 2
	// second run: 2 done before, 3 read of 5: 100 %
}
