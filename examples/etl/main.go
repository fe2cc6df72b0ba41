// Command etl is the project's main job: an extract-enrich-load pipeline against real
// services, resumable after a crash, with live progress and a live web view.
//
//	read     records, generated (-n) or from a JSON Lines or CSV file (-input), from
//	         the position the checkpoint saved: a rerun resumes where the last run
//	         stopped (-fresh starts over)
//	enrich   workers call an HTTP service that the command starts on loopback: a long
//	         tail of latency, 429 and 503 with Retry-After, 404s, malformed bodies and
//	         calls that hang; per-attempt timeout, retries with a backoff that honours
//	         Retry-After (pipeline.RetryAfter), a dead-letter file and an error budget
//	load     batches appended to a JSON Lines file (idempotent: a record already in the
//	         file is not written again, so a resumed run never duplicates one), or,
//	         with -db, upserted into PostgreSQL by the postgres connector, with the
//	         checkpoint committed in the same transactions and the dead letters in the
//	         table etl_deadletters, each committed with the progress it makes, so that
//	         a resumed run neither redoes nor sets aside again a record the last run
//	         dead-lettered (scripts/postgres.sh start prints the URL of a throwaway
//	         server)
//
// It prints live progress (one line refreshed in place on a terminal, plain lines
// otherwise), serves the live web view of the pipeline on loopback (-web), and at the
// end prints the run's report, the main causes of dead letters, the bottleneck and
// where the output and the dead letters are. It exits 0 on success, 1 when the run
// failed, was interrupted or the error budget stopped it, and 2 for bad flags or an
// unreadable input.
//
//	go run . -n 10000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/dashboard"
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// config is the command line.
type config struct {
	n        int
	input    string
	dir      string
	fresh    bool
	workers  int
	timeout  time.Duration
	attempts int
	batch    int
	budget   float64
	web      string
	db       string
	seed     uint64
	progress time.Duration
}

// exitError carries the exit status of a failure: 2 for bad usage or input, 1 else.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usage(format string, a ...any) error {
	return &exitError{2, fmt.Errorf(format, a...)}
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("etl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.n, "n", 10_000, "number of generated records (when there is no -input)")
	fs.StringVar(&c.input, "input", "", "read records from this JSON Lines (.jsonl) or CSV (.csv) file instead")
	fs.StringVar(&c.dir, "dir", filepath.Join(os.TempDir(), "pipeline-etl"), "folder of the output, the dead letters and the checkpoint")
	fs.BoolVar(&c.fresh, "fresh", false, "start over: forget the checkpoint, the output and the dead letters")
	fs.IntVar(&c.workers, "workers", 16, "concurrent calls to the enrichment service")
	fs.DurationVar(&c.timeout, "timeout", 300*time.Millisecond, "timeout of one call")
	fs.IntVar(&c.attempts, "attempts", 4, "calls per record, the first included")
	fs.IntVar(&c.batch, "batch", 500, "records per write")
	fs.Float64Var(&c.budget, "budget", 0.05, "stop when more than this share of records fails")
	fs.StringVar(&c.db, "db", "", "write into this PostgreSQL database (a URL) instead of a file")
	fs.StringVar(&c.web, "web", "127.0.0.1:0", `address of the live web view ("" for none)`)
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the generated records and of the service's faults")
	fs.DurationVar(&c.progress, "progress", 500*time.Millisecond, "interval of the progress lines")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, &exitError{0, err}
		}
		return c, &exitError{2, errors.New("bad flags (see -h)")}
	}
	switch {
	case fs.NArg() > 0:
		return c, usage("unexpected argument %q (see -h)", fs.Arg(0))
	case c.n < 0:
		return c, usage("-n must not be negative")
	case c.workers < 1 || c.attempts < 1 || c.batch < 1:
		return c, usage("-workers, -attempts and -batch must be at least 1")
	case c.timeout <= 0 || c.progress <= 0:
		return c, usage("-timeout and -progress must be positive")
	case !(c.budget > 0 && c.budget < 1):
		return c, usage("-budget must be in (0, 1)")
	}
	return c, nil
}

func realMain(args []string, stdout, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	if err == nil {
		err = run(c, stdout, stderr)
	}
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.code == 0:
		return 0
	case errors.As(err, &ee):
		say(stderr, "etl: %v\n", ee.err)
		return ee.code
	default:
		say(stderr, "etl: %v\n", err)
		return 1
	}
}

func run(c config, stdout, stderr io.Writer) error {
	records, err := openRecords(c)
	if err != nil {
		return &exitError{2, err}
	}
	if c.fresh {
		for _, f := range []string{"output.jsonl", "deadletters.jsonl", "checkpoint"} {
			if err := os.Remove(filepath.Join(c.dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	out, err := openOutput(filepath.Join(c.dir, "output.jsonl"))
	if err != nil {
		return err
	}
	defer out.close()
	dead, err := openDead(filepath.Join(c.dir, "deadletters.jsonl"))
	if err != nil {
		return err
	}
	defer dead.close()

	svc, err := startService(c.seed)
	if err != nil {
		return err
	}
	defer svc.close() //nolint:errcheck // the process ends: nothing waits on its listener
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.workers}}
	defer client.CloseIdleConnections()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var (
		store pipeline.CheckpointStore = pipeline.NewFileCheckpoint(filepath.Join(c.dir, "checkpoint"))
		pg    *pgLoad
	)
	deadLetter := dead.add
	if c.db != "" {
		pg, err = openPG(ctx, c.db, c.fresh, c.batch)
		if err != nil {
			return err
		}
		defer pg.pool.Close()
		store, deadLetter = pg.store, pg.addDead
	}

	p := pipeline.New(pipeline.WithBuffer(2 * c.workers))
	src := pipeline.FromCheckpoint(p, store, records, pipeline.WithName("read"), pipeline.WithSaveEvery(c.batch))
	enriched := pipeline.Then(src, pipeline.NewStage("enrich", c.workers, enricher(client, svc.addr),
		pipeline.WithTimeout(c.timeout),
		pipeline.WithRetry(c.attempts, pipeline.ExponentialBackoff(20*time.Millisecond, time.Second)), // at least Retry-After
		pipeline.WithClassifier(classify),
		pipeline.WithDeadLetter(deadLetter),
		pipeline.WithErrorBudget(pipeline.Budget{MaxRatio: c.budget, MinSample: 200}),
	))
	if pg != nil {
		pg.w.To(enriched, "load", 2)
	} else {
		pipeline.ToBatches(enriched, c.batch, pipeline.NewSink("load", 1, out.write), pipeline.WithName("batch"),
			pipeline.WithLinger(200*time.Millisecond))
	}

	if c.web != "" {
		addr, closeWeb, err := serveDashboard(c.web, p)
		if err != nil {
			return err
		}
		defer closeWeb()
		say(stderr, "etl: live view at http://%s/debug/pipeline/\n", addr)
	}
	done := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		showProgress(p, stderr, c.progress, done)
	}()
	runErr := p.Run(ctx)
	close(done)
	<-progressDone

	rep := p.Report()
	say(stdout, "\n%v", rep)
	if b := rep.Bottleneck(0); b.Stage != "" {
		say(stdout, "%v\n", b)
	}
	if pg != nil {
		n, err := pg.rows(context.WithoutCancel(ctx))
		if err != nil {
			return err
		}
		say(stdout, "output:       PostgreSQL table %s (%d rows)\n", pgTable, n)
		say(stdout, "checkpoint:   PostgreSQL, job %q (position %d)\n", pgJob, rep.Checkpoint)
	} else {
		say(stdout, "output:       %s (%d records written this run)\n", out.path, out.writtenNow)
		say(stdout, "checkpoint:   %s (position %d)\n", filepath.Join(c.dir, "checkpoint"), rep.Checkpoint)
	}
	if pg != nil {
		say(stdout, "dead letters: PostgreSQL table %s (%d this run)\n", pgDead, pg.added.Load()+pg.w.Stats().DeadLettered)
	} else {
		say(stdout, "dead letters: %s (%d this run)\n", dead.path, dead.addedNow)
	}
	switch {
	case runErr == nil:
		return nil
	case errors.Is(runErr, pipeline.ErrBudgetExceeded):
		return fmt.Errorf("stopped by the error budget: %w", runErr)
	case ctx.Err() != nil:
		return errors.New("interrupted: run again to resume where it stopped")
	}
	return runErr
}

// serveDashboard serves the live web view of p at addr, on loopback by default.
func serveDashboard(addr string, p *pipeline.Pipeline) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, &exitError{2, fmt.Errorf("-web %s: %w", addr, err)}
	}
	h := dashboard.New()
	h.Add("etl", p)
	mux := http.NewServeMux()
	mux.Handle("/debug/pipeline/", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	srv.RegisterOnShutdown(h.Close)
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// showProgress prints the pipeline's live state every interval until done is closed:
// one line refreshed in place on a terminal, plain lines otherwise.
func showProgress(p *pipeline.Pipeline, w io.Writer, every time.Duration, done <-chan struct{}) {
	term := isTerminal(w)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			if term {
				say(w, "\n")
			}
			return
		case <-t.C:
		}
		snap := p.Snapshot()
		line := fmt.Sprintf("%6.1fs ckpt=%d | %s", snap.Elapsed.Seconds(), snap.Checkpoint, snap.Line())
		if term {
			say(w, "\r\033[K%s", line)
		} else {
			say(w, "%v\n", line)
		}
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// say writes to the terminal; like fmt.Print's, its write errors are not worth a
// failure of the job.
func say(w io.Writer, format string, a ...any) { _, _ = fmt.Fprintf(w, format, a...) }
