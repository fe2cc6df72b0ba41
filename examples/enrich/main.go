// Command enrich is the project's realistic "main job": it enriches generated events
// by calling a flaky service, and shows every error policy of a stage at work.
//
//	source   n generated CSV lines (seeded PCG: the same -seed gives the same input)
//	parse    inline Map: line → event
//	enrich   16 workers call a simulated service (~1 ms each) that fails now and then:
//	         ~1 % permanent errors (dead-lettered at once), ~2 % transient errors
//	         (retried with exponential backoff, then succeed) and a few calls that
//	         hang until their 500 ms timeout (dead-lettered as timeouts); an error
//	         budget stops the run if more than 5 % of the items fail
//	store    2 workers append the enriched events to a JSON Lines file
//
// While it runs, it shows the pipeline's live state every 200 ms (Snapshot().Line()):
// on a terminal as one line refreshed in place, otherwise as plain lines on standard
// error. At the end it prints the run's report, its bottleneck and where the output and
// the dead letters went, and exits with status 1 if the run failed. Nothing goes to the
// network.
//
//	go run ./examples/enrich -n 10000 -workers 16 -seed 1
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"iter"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gopipeline/pipeline"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "enrich:", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 10_000, "number of generated records")
	workers := flag.Int("workers", 16, "workers of the enrich stage")
	seed := flag.Uint64("seed", 1, "seed of the generated records and of the service's faults")
	out := flag.String("out", "", "JSON Lines output file (default: a new temporary file)")
	dlPath := flag.String("deadletters", "", "dead-letter file (default: in a new temporary directory)")
	flag.Parse()
	if *n < 0 || *workers < 1 {
		return errors.New("-n must be >= 0 and -workers >= 1")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	if *dlPath == "" {
		dir, err := os.MkdirTemp("", "enrich-")
		if err != nil {
			return err
		}
		*dlPath = filepath.Join(dir, "deadletters.jsonl")
	}
	dead, err := pipeline.OpenDeadLetterFile[event](*dlPath)
	if err != nil {
		return err
	}
	var f *os.File
	if *out == "" {
		f, err = os.CreateTemp("", "enrich-*.jsonl")
	} else {
		f, err = os.Create(*out)
	}
	if err != nil {
		return errors.Join(err, dead.Close())
	}
	st := &store{w: bufio.NewWriter(f)}

	svc := &service{seed: *seed, attempts: make(map[int]int)}

	p := pipeline.New()
	lines := pipeline.FromSeq(p, generate(*n, *seed))
	events := pipeline.Map(lines, parse)
	enriched := pipeline.Then(events, pipeline.NewStage("enrich", *workers, svc.enrich,
		pipeline.WithTimeout(500*time.Millisecond),
		pipeline.WithRetry(3, pipeline.ExponentialBackoff(5*time.Millisecond, 50*time.Millisecond)),
		pipeline.WithDeadLetter(dead.Add),
		pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: 0.05, MinSample: 200}),
	))
	pipeline.To(enriched, pipeline.NewSink("store", 2, st.write))

	start := time.Now()
	stopProgress := showProgress(p, 200*time.Millisecond)
	runErr := p.Run(ctx)
	stopProgress()
	elapsed := time.Since(start)

	// The output and the dead letters are only complete once flushed and closed.
	closeErr := errors.Join(st.flush(), f.Close(), dead.Close())

	rep := p.Report()
	fmt.Print(rep)
	fmt.Println(rep.Bottleneck(0))
	fmt.Printf("\n%d records in %v\n", *n, elapsed.Round(time.Millisecond))
	fmt.Printf("output:       %d lines in %s\n", st.lines, f.Name())
	fmt.Printf("dead letters: %d records in %s\n", rep.DeadLettered(), *dlPath)
	if runErr != nil {
		return fmt.Errorf("run failed: %w", runErr)
	}
	return closeErr
}

// showProgress prints p's live state (a Snapshot, on one line) every interval, from its
// own goroutine, until the returned function is called; that function waits for the
// goroutine to exit, so nothing is printed after it returns. On a terminal the line is
// rewritten in place (carriage return, then clear to the end of the line); otherwise
// (a file, a pipe) each snapshot is a plain line on standard error, so that standard
// output holds only the final report.
func showProgress(p *pipeline.Pipeline, interval time.Duration) (stop func()) {
	tty := isTerminal(os.Stdout)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				if tty {
					fmt.Print("\r\x1b[K") // leave a clean line for the report
				}
				return
			case <-tick.C:
				line := p.Snapshot().Line()
				if tty {
					fmt.Print("\r" + line + "\x1b[K")
				} else {
					fmt.Fprintln(os.Stderr, line)
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// isTerminal reports whether f is a terminal (a character device).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// generate yields n lines "id,user,amount_cents", from a PCG seeded with seed.
func generate(n int, seed uint64) iter.Seq[string] {
	return func(yield func(string) bool) {
		rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
		for id := range n {
			line := fmt.Sprintf("%d,u%04d,%d", id, rng.IntN(5000), 100+rng.IntN(99_900))
			if !yield(line) {
				return
			}
		}
	}
}

// event is a parsed input line.
type event struct {
	ID          int    `json:"id"`
	User        string `json:"user"`
	AmountCents int64  `json:"amount_cents"`
}

// parse turns a generated line into an event. The generator only writes well-formed
// lines, so parse cannot fail and runs inline, as a Map; input from outside would need a
// stage that dead-letters the lines it cannot read.
func parse(line string) event {
	id, user, amount := splitLine(line)
	i, _ := strconv.Atoi(id)
	a, _ := strconv.ParseInt(amount, 10, 64)
	return event{ID: i, User: user, AmountCents: a}
}

func splitLine(line string) (id, user, amount string) {
	id, rest, _ := strings.Cut(line, ",")
	user, amount, _ = strings.Cut(rest, ",")
	return id, user, amount
}

// enrichedEvent is an event with what the service knows about its user.
type enrichedEvent struct {
	event
	Country string `json:"country"`
	Tier    string `json:"tier"`
}

var (
	errUnknownUser = errors.New("unknown user")
	errUnavailable = errors.New("service unavailable")
)

// service simulates a remote user service with about 1 ms of latency. Which calls fail,
// and how, depends only on the seed and the event's ID, so a run is reproducible whatever
// the order in which the workers take the events.
type service struct {
	seed uint64

	mu       sync.Mutex
	attempts map[int]int // calls so far, for the events whose first calls fail
}

// fault is what the service does with one event.
type fault uint8

const (
	ok        fault = iota
	permanent       // always fails: retrying cannot help
	transient       // fails on its first one or two calls, then succeeds
	hang            // never answers: the call returns only when its context is done
)

func (s *service) enrich(ctx context.Context, ev event) (enrichedEvent, error) {
	rng := rand.New(rand.NewPCG(s.seed, uint64(ev.ID)))
	latency := 900*time.Microsecond + time.Duration(rng.Int64N(int64(200*time.Microsecond)))
	var f fault
	switch u := rng.Float64(); {
	case u < 0.01:
		f = permanent
	case u < 0.03:
		f = transient
	case u < 0.0305:
		f = hang
	}
	failures := 1 + rng.IntN(2) // for transient faults: calls that fail before one succeeds

	if f == hang {
		<-ctx.Done()
		return enrichedEvent{}, ctx.Err()
	}
	if err := sleep(ctx, latency); err != nil {
		return enrichedEvent{}, err
	}
	switch f {
	case permanent:
		return enrichedEvent{}, pipeline.Permanent(fmt.Errorf("%w: %s", errUnknownUser, ev.User))
	case transient:
		s.mu.Lock()
		s.attempts[ev.ID]++
		call := s.attempts[ev.ID]
		s.mu.Unlock()
		if call <= failures {
			return enrichedEvent{}, pipeline.Transient(fmt.Errorf("%w: call %d for event %d", errUnavailable, call, ev.ID))
		}
	}
	countries := [...]string{"DE", "FR", "JP", "US", "BR", "IN"}
	tiers := [...]string{"free", "pro", "enterprise"}
	return enrichedEvent{
		event:   ev,
		Country: countries[rng.IntN(len(countries))],
		Tier:    tiers[rng.IntN(len(tiers))],
	}, nil
}

// sleep waits for d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// store writes enriched events as JSON Lines; its workers share one buffered writer.
type store struct {
	mu    sync.Mutex
	w     *bufio.Writer
	lines int
}

func (s *store) write(_ context.Context, ev enrichedEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	s.lines++
	return nil
}

func (s *store) flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Flush()
}
