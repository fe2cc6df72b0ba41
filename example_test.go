package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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
		if s.Kind == "filter" {
			fmt.Println("filtered out:", s.Filtered)
		}
	}
	// Output:
	// [2 4 6] <nil>
	// filtered out: 3
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

	f, err := pipeline.OpenDeadLetterFile[string](path, nil, 100)
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

	dls, err := pipeline.ReadDeadLetters[string](path, nil)
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
	f, err := pipeline.OpenDeadLetterFile[string](path, nil, 0)
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
	again, err := pipeline.Collect(context.Background(), pipeline.Then(pipeline.Replay[string](p, path, "price", nil), fixed))
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
