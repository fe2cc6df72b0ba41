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
// The job's state lives in -dir (by default $TMPDIR/pipeline-etl): output.jsonl,
// deadletters.jsonl, checkpoint, and job.json, which remembers -n so that a resumed
// run goes on with the same records (a -n given extends or shortens the job). With
// -db it lives in the database instead (tables etl_enriched, etl_deadletters, etl_job
// and pgpipe's checkpoint), and -dir is not touched, so that the two modes never share
// a dead-letter file. A run of a job already done says so and exits 0.
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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
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
	nSet     bool // -n was given: it overrides the number a resumed job remembers
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
	fs.IntVar(&c.n, "n", 10_000, "number of generated records (when there is no -input); a resumed job remembers its own")
	fs.StringVar(&c.input, "input", "", "read records from this JSON Lines (.jsonl) or CSV (.csv) file instead")
	fs.StringVar(&c.dir, "dir", filepath.Join(os.TempDir(), "pipeline-etl"), "folder of the output, the dead letters and the checkpoint (not used with -db)")
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
	fs.Visit(func(f *flag.Flag) { c.nSet = c.nSet || f.Name == "n" })
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The job's state: in -dir (the file mode), or in the database (-db), never both, so
	// that one mode's -fresh leaves the other's output and dead letters alone.
	var (
		store      pipeline.CheckpointStore
		pg         *pgLoad
		out        *output
		dead       *deadFile
		deadLetter func(context.Context, pipeline.DeadLetter[record]) error
		ckptAt     string
		resumed    string // where the job's remembered -n came from, if it did
	)
	if c.db != "" {
		var err error
		if pg, err = openPG(ctx, c.db, c.fresh, c.batch); err != nil {
			return err
		}
		defer pg.pool.Close()
		if c.input == "" {
			if c.n, resumed, err = pg.remember(ctx, c.n, c.nSet); err != nil {
				return err
			}
		}
		store, deadLetter = pg.store, pg.addDead
		ckptAt = fmt.Sprintf("PostgreSQL, job %q", pgJob)
	} else {
		if c.fresh {
			for _, f := range []string{"output.jsonl", "deadletters.jsonl", "checkpoint", jobFile} {
				if err := os.Remove(filepath.Join(c.dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
			}
		}
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			return err
		}
		if c.input == "" {
			var err error
			if c.n, resumed, err = remember(filepath.Join(c.dir, jobFile), c.n, c.nSet); err != nil {
				return err
			}
		}
		ckptAt = filepath.Join(c.dir, "checkpoint")
		store = pipeline.NewFileCheckpoint(ckptAt)
	}
	records, total, err := openRecords(c)
	if err != nil {
		return &exitError{2, err}
	}
	// A job already done says so, rather than run to print a table of zeros.
	if pos, err := store.Load(ctx); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	} else if pos >= total {
		say(stdout, "etl: already complete at %s records (checkpoint: %s); -fresh starts over\n", thousands(total), ckptAt)
		return nil
	}
	if resumed != "" {
		say(stderr, "etl: resuming the job of %s records in %s (-n changes it, -fresh starts over)\n", thousands(c.n), resumed)
	}
	if pg == nil {
		if out, err = openOutput(filepath.Join(c.dir, "output.jsonl")); err != nil {
			return err
		}
		defer out.close()
		if dead, err = openDead(filepath.Join(c.dir, "deadletters.jsonl")); err != nil {
			return err
		}
		defer dead.close()
		deadLetter = dead.add
	}

	svc, err := startService(c.seed)
	if err != nil {
		return err
	}
	defer svc.close() //nolint:errcheck // the process ends: nothing waits on its listener
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.workers}}
	defer client.CloseIdleConnections()

	p := pipeline.New(pipeline.WithBuffer(2 * c.workers))
	src := pipeline.FromCheckpoint(p, store, records, pipeline.WithName("read"), pipeline.WithSaveEvery(c.batch),
		pipeline.WithTotal(total)) // for the progress line and the web view: done / total, percent, ETA
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
		pipeline.ToBatches(enriched, c.batch, pipeline.NewSink("load", 1, out.write), // its batch row: Batch, as pgpipe's
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
		say(stdout, "checkpoint:   %s (position %d)\n", ckptAt, rep.Checkpoint)
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

// jobFile is the file in -dir that remembers the job's -n, so that a resumed run goes on
// with the same records.
const jobFile = "job.json"

// remember returns the number of records of the job in dir: n when given (-n) or when
// the job is new, else the one the job was started with (and then the folder, where it
// came from); it saves the result.
func remember(path string, n int, given bool) (int, string, error) {
	var job struct{ N int }
	from := ""
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return 0, "", err
	case json.Unmarshal(b, &job) != nil:
		return 0, "", fmt.Errorf("%s: not a job file (-fresh starts over)", path)
	case !given && job.N != n:
		n, from = job.N, filepath.Dir(path)
	}
	b, _ = json.Marshal(struct{ N int }{n})
	return n, from, os.WriteFile(path, append(b, '\n'), 0o644)
}

// thousands formats n with thousands separators: 10,000.
func thousands[T int | int64](n T) string {
	s := strconv.FormatInt(int64(n), 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
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
		line := fmt.Sprintf("%6.1fs%s | %s", snap.Elapsed.Seconds(), progressOf(snap, "read"), snap.Line())
		if term {
			say(w, "\r\033[K%s", line)
		} else {
			say(w, "%v\n", line)
		}
	}
}

// progressOf returns the progress of the source named src beside what the checkpoint
// holds: " read 6,000/10,000 60% committed 5,500 55% eta 5s" when the source knows its
// total (the records a resumed run found done counted as read, the ETA at the source's
// recent rate), " committed 5,500" when it does not. Read runs ahead of committed by
// the records in flight and those settled past a gap; the job is done when committed
// reaches the total. It is "" for a run without a checkpoint and a source without a
// total.
func progressOf(snap pipeline.Report, src string) string {
	var line string
	s, ok := snap.Stage(src)
	known := ok && s.Total > 0
	if known {
		done := min(s.Resumed+s.Out, s.Total)
		line = fmt.Sprintf(" read %s/%s %d%%", thousands(done), thousands(s.Total), 100*done/s.Total)
	}
	if snap.Checkpoint >= 0 {
		line += " committed " + thousands(snap.Checkpoint)
		if known {
			line += fmt.Sprintf(" %d%%", 100*min(snap.Checkpoint, s.Total)/s.Total)
		}
	}
	if known && s.Rate > 0 && s.Resumed+s.Out < s.Total {
		eta := time.Duration(float64(s.Total-s.Resumed-s.Out) / s.Rate * float64(time.Second))
		line += " eta " + eta.Round(100*time.Millisecond).String()
	}
	return line
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
