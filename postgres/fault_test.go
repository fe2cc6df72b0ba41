package pgpipe_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// The fault tests run a checkpointed job, break something in the middle, and check at
// the end that every row is in the table exactly once and that the checkpoint is at the
// end. They are not parallel: one of them stops the server.

// job is a checkpointed pipeline that writes events 0..n-1 into table.
type job struct {
	pool    *pgxpool.Pool
	table   string
	name    string
	n       int
	batch   int
	workers int
	upsert  bool
	// gate, when set, is called by the source before it emits position pos.
	gate func(ctx context.Context, pos int64) error
	// mapping, when set, replaces the plain struct mapping.
	mapping *pgpipe.Mapping[event]
	// events, when set, are the source's items instead of events 0..n-1 (n is then
	// len(events)).
	events []event
	// copts are given to the source, after WithSaveEvery(batch).
	copts []pipeline.CheckpointOption
	// popts and sopts are given to the pipeline and to the sink stage.
	popts []pipeline.PipelineOption
	sopts []pipeline.StageOption
}

func (j *job) run(ctx context.Context) (*pgpipe.Writer[event], error) {
	w, _, err := j.runReport(ctx)
	return w, err
}

// startReport runs the job in the background; the channel gives the run's error, and
// once it has, rep holds the run's report.
func (j *job) startReport(ctx context.Context, rep *pipeline.Report) <-chan error {
	done := make(chan error, 1)
	go func() {
		var err error
		_, *rep, err = j.runReport(ctx)
		done <- err
	}()
	return done
}

// runReport runs the job and returns the writer, the run's report and its error.
func (j *job) runReport(ctx context.Context) (*pgpipe.Writer[event], pipeline.Report, error) {
	store := pgpipe.NewCheckpoint(j.pool, j.name)
	p := pipeline.New(append([]pipeline.PipelineOption{pipeline.WithBuffer(256)}, j.popts...)...)
	src := pipeline.FromCheckpoint(p, store, func(ctx context.Context, pos int64) iter.Seq2[event, error] {
		return func(yield func(event, error) bool) {
			for i := pos; i < int64(j.n); i++ {
				if j.gate != nil {
					if err := j.gate(ctx, i); err != nil {
						yield(event{}, err)
						return
					}
				}
				e := event{ID: i, Name: "event " + strconv.FormatInt(i, 10), Score: float64(i)}
				if j.events != nil {
					e = j.events[i]
				}
				if !yield(e, nil) {
					return
				}
			}
		}
	}, append([]pipeline.CheckpointOption{pipeline.WithSaveEvery(j.batch)}, j.copts...)...)
	opts := []pgpipe.Option{pgpipe.WithCheckpoint(store), pgpipe.WithChunk(j.batch, 0)}
	if j.upsert {
		opts = append(opts, pgpipe.WithUpsert("id"))
	}
	m := pgpipe.Struct[event]()
	if j.mapping != nil {
		m = *j.mapping
	}
	w := pgpipe.NewWriter(j.pool, j.table, m, opts...)
	w.To(src, "load", j.workers, j.sopts...)
	err := p.Run(ctx)
	return w, p.Report(), err
}

// retried returns how many batches the report says were retried.
func retried(rep pipeline.Report) int64 {
	s, _ := rep.Stage("load")
	return s.Retried
}

// check asserts that every row is there exactly once and the checkpoint is at the end.
func (j *job) check(t *testing.T) {
	t.Helper()
	rows, distinct := count(t, j.pool, j.table)
	assert.Equal(t, int64(j.n), rows, "rows in the table")
	assert.Equal(t, int64(j.n), distinct, "distinct ids in the table")
	assert.Equal(t, int64(j.n), j.position(t), "the checkpoint")
	var above int
	require.NoError(t, j.pool.QueryRow(t.Context(), "SELECT count(*) FROM pgpipe_committed WHERE job = $1", j.name).Scan(&above))
	assert.Zero(t, above, "no committed range is left above the final watermark")
}

func (j *job) position(t *testing.T) int64 {
	t.Helper()
	var pos int64
	require.NoError(t, j.pool.QueryRow(t.Context(), "SELECT pos FROM pgpipe_checkpoint WHERE job = $1", j.name).Scan(&pos))
	return pos
}

// commits returns about how many batches of the job have committed (0 before the
// first): the rows in its table, in batches. (The checkpoint keeps no count of commits:
// a count in the job's row would make concurrent writers wait for one another.)
func (j *job) commits(ctx context.Context) int64 {
	var rows int64
	if err := j.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{j.table}.Sanitize()).Scan(&rows); err != nil {
		return -1
	}
	return rows / int64(j.batch)
}

func newJob(t *testing.T, pool *pgxpool.Pool, upsert bool, n, batch, workers int) *job {
	t.Helper()
	return &job{pool: pool, table: createEvents(t, pool, upsert), name: tableName("job"), n: n, batch: batch, workers: workers, upsert: upsert}
}

// waitFor polls cond against the server, a bounded number of times (each poll is a
// round trip to the server, which paces the loop) and for at most hangGuard, a bound
// that only a stalled run reaches: it then fails with what the server's backends do.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	stop := time.Now().Add(hangGuard)
	for range 200000 {
		if cond() {
			return
		}
		if time.Now().After(stop) {
			break
		}
	}
	t.Fatalf("timed out waiting for %s; the server's backends:\n%s", what, activity(t))
}

// hangGuard bounds a fault test's waits: far above what a passing run takes, far below
// the package's timeout, so that a stall fails the test (and its cleanup restores the
// server's settings) instead of timing out the whole package.
const hangGuard = 3 * time.Minute

// awaitRun waits for the run that reports on done, for at most hangGuard.
func awaitRun(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(hangGuard):
		t.Fatalf("the run did not end; the server's backends:\n%s", activity(t))
		return nil
	}
}

// activity describes the server's client backends, for a stalled test's message.
func activity(t *testing.T) string {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL(t))
	if err != nil {
		return err.Error()
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(context.Background(), `SELECT pid, state, coalesce(wait_event, ''), left(query, 80)
		FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for rows.Next() {
		var pid int32
		var state, wait, query string
		if err := rows.Scan(&pid, &state, &wait, &query); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  %d %s %s %q\n", pid, state, wait, query)
	}
	return b.String()
}

// gatedRun is a run of a job in a goroutine of its own, started by startGated: release
// lets its source go on; done reports the run's end, after w and rep are set.
type gatedRun struct {
	release chan struct{}
	done    chan error
	w       *pgpipe.Writer[event]
	rep     pipeline.Report
}

// startGated starts j with its source stopped before position at, and returns once the
// source got there.
func (j *job) startGated(t *testing.T, at int64) *gatedRun {
	t.Helper()
	reached := make(chan struct{})
	g := &gatedRun{release: make(chan struct{}), done: make(chan error, 1)}
	j.gate = gateAt(at, reached, g.release)
	go func() {
		w, rep, err := j.runReport(t.Context())
		g.w, g.rep = w, rep
		g.done <- err
	}()
	select {
	case <-reached:
	case err := <-g.done:
		t.Fatalf("the run ended before its source reached position %d: %v", at, err)
	}
	return g
}

// gateAt returns a gate that stops the source before position at until release is
// closed, and closes reached when it gets there.
func gateAt(at int64, reached, release chan struct{}) func(context.Context, int64) error {
	return func(ctx context.Context, pos int64) error {
		if pos != at {
			return nil
		}
		close(reached)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// TestFaultServerRestart stops the server the hard way (pg_ctl stop -m immediate) in
// the middle of a run and starts it again: the writers retry on new connections, and
// no row is lost or duplicated.
func TestFaultServerRestart(t *testing.T) {
	script := serverScript(t)
	for _, upsert := range []bool{true, false} {
		t.Run(fmt.Sprintf("upsert=%v", upsert), func(t *testing.T) {
			pool := newPool(t, 8)
			j := newJob(t, pool, upsert, 60000, 1000, 4)
			g := j.startGated(t, int64(j.n/2))
			server(t, script, "crash") // writers may be mid-COPY or mid-COMMIT
			close(g.release)           // the second half meets a server that is down
			server(t, script, "start")
			require.NoError(t, awaitRun(t, g.done))
			j.check(t)
			assert.Positive(t, retried(g.rep), "the writers met the server down")
			t.Logf("after the restart: %d batches retried, %+v", retried(g.rep), g.w.Stats())
		})
	}
}

// TestFaultTerminateDuringCopy kills the writer's backend (pg_terminate_backend) while
// its COPY is half sent.
func TestFaultTerminateDuringCopy(t *testing.T) {
	pool := newPool(t, 8)
	j := newJob(t, pool, false, 20000, 2000, 2)
	target := int64(j.n/2 + 17)
	inCopy, killed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	m := pgpipe.Func([]string{"id", "name", "score"}, func(e event) []any {
		if e.ID == target {
			once.Do(func() { // the COPY is under way: the rows before are sent
				close(inCopy)
				<-killed
			})
		}
		return []any{e.ID, e.Name, e.Score}
	})
	j.mapping = &m
	var rep pipeline.Report
	done := j.startReport(t.Context(), &rep)
	<-inCopy
	var pids []int32
	waitFor(t, "the COPY on the server", func() bool {
		pids = nil
		rows, err := pool.Query(t.Context(), `SELECT pid FROM pg_stat_activity WHERE query ILIKE 'copy %' AND query LIKE '%' || $1 || '%'`, j.table)
		require.NoError(t, err)
		for rows.Next() {
			var pid int32
			require.NoError(t, rows.Scan(&pid))
			pids = append(pids, pid)
		}
		require.NoError(t, rows.Err())
		return len(pids) > 0
	})
	for _, pid := range pids {
		mustExec(t, pool, "SELECT pg_terminate_backend($1)", pid)
	}
	close(killed)
	require.NoError(t, <-done)
	j.check(t)
	assert.Positive(t, retried(rep), "the batch whose COPY was cut is written again")
	t.Logf("terminated %d backend(s) mid-COPY at row %d", len(pids), target)
}

// TestFaultTerminateDuringCommit kills the writer's backend while its COMMIT runs (a
// deferred trigger on a row of the third batch makes COMMIT wait for a lock the test
// holds). The commit's outcome is unknown to the writer, which waits for the
// transaction to end, finds no mark of it, learns that it did not commit, and writes
// the batch again.
func TestFaultTerminateDuringCommit(t *testing.T) {
	pool := newPool(t, 8)
	j := newJob(t, pool, false, 20000, 2000, 4)
	// The checkpoint tables exist once a checkpoint was loaded.
	_, err := pgpipe.NewCheckpoint(pool, j.name+"_init").Load(t.Context())
	require.NoError(t, err)
	fn, trig := j.table+"_hold", j.table+"_hold"
	const lockKey = 424242
	mustExec(t, pool, fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock_shared(%d); RETURN NULL; END $$`, fn, lockKey))
	mustExec(t, pool, fmt.Sprintf(`CREATE CONSTRAINT TRIGGER %s AFTER INSERT ON %s
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.id = %d) EXECUTE FUNCTION %s()`, trig, j.table, 2*j.batch+1, fn))
	t.Cleanup(func() {
		mustExec(t, pool, "DROP TABLE IF EXISTS "+j.table) // and its trigger, before the function
		mustExec(t, pool, "DROP FUNCTION IF EXISTS "+fn+"()")
	})
	holder, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	_, err = holder.Exec(t.Context(), "SELECT pg_advisory_lock($1)", lockKey)
	require.NoError(t, err)

	var rep pipeline.Report
	done := j.startReport(t.Context(), &rep)
	var pid int32
	waitFor(t, "a COMMIT waiting in the trigger", func() bool {
		err := pool.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity
			WHERE lower(query) = 'commit' AND wait_event_type = 'Lock' AND datname = current_database()`).Scan(&pid)
		return err == nil
	})
	mustExec(t, pool, "SELECT pg_terminate_backend($1)", pid)
	_, err = holder.Exec(t.Context(), "SELECT pg_advisory_unlock($1)", lockKey)
	require.NoError(t, err)
	holder.Release()
	require.NoError(t, <-done)
	j.check(t)
	assert.Positive(t, retried(rep), "the batch whose COMMIT was lost is written again")
}

// TestFaultTwoInstances starts a job, starts it again while the first instance runs,
// and checks that the first cannot commit once the second took over.
func TestFaultTwoInstances(t *testing.T) {
	pool := newPool(t, 12)
	first := newJob(t, pool, false, 20000, 1000, 4)
	reached, release := make(chan struct{}), make(chan struct{})
	first.gate = gateAt(int64(first.n/2), reached, release)
	done := make(chan error, 1)
	go func() {
		_, err := first.run(t.Context())
		done <- err
	}()
	<-reached
	waitFor(t, "the first instance's commits", func() bool { return first.commits(t.Context()) >= 5 })

	second := *first
	second.gate = nil
	_, err := second.run(t.Context())
	require.NoError(t, err, "the second instance takes over and finishes the job")

	close(release)
	err = <-done
	require.ErrorIs(t, err, pgpipe.ErrFenced, "the first instance's next commit is fenced")
	t.Logf("first instance: %v", err)
	first.check(t)
}

// TestFaultCrashResume kills a child process running the job with SIGKILL at random
// commits, resumes it, and checks that the rows are there exactly once: insert mode,
// no unique key, four writers committing out of order.
func TestFaultCrashResume(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	pool := newPool(t, 4)
	j := newJob(t, pool, false, 100000, 500, 4)
	crashResume(t, j, nil)
	j.check(t)
}

// TestFaultCrashResumeUpsert is TestFaultCrashResume in upsert mode, with 30 % of the
// rows repeating an earlier id: after the kills and resumes, every id holds the value
// of its last row in source order (a resume must never write an older row over a
// newer one).
func TestFaultCrashResumeUpsert(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	pool := newPool(t, 4)
	events, last := repeatedKeys(40000, 0.3)
	j := newJob(t, pool, true, len(events), 500, 4)
	crashResume(t, j, []string{"PGPIPE_CRASH_UPSERT=1"})
	assert.Zero(t, staleKeys(t, pool, j.table, last), "ids holding an older value")
	assert.Equal(t, int64(j.n), j.position(t), "the checkpoint")
}

// crashResume runs j in child processes (TestCrashChild), killing the first five at
// random commits, until one finishes.
func crashResume(t *testing.T, j *job, env []string) {
	t.Helper()
	kills := 0
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 20, "the job never finished")
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", "-test.cpu=4")
		cmd.Env = append(os.Environ(), "PGPIPE_CRASH_TABLE="+j.table, "PGPIPE_CRASH_JOB="+j.name, "PGPIPE_CRASH_N="+strconv.Itoa(j.n))
		cmd.Env = append(cmd.Env, env...)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		killed := false
		if attempt < 5 {
			start := j.commits(t.Context())
			target := start + 2 + int64(attempt*3)
			for range 200000 {
				select {
				case err := <-waited:
					waited <- err
				default:
				}
				if len(waited) > 0 || j.commits(t.Context()) >= target {
					break
				}
			}
			if len(waited) == 0 {
				require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
				killed = true
				kills++
			}
		}
		err := <-waited
		if !killed {
			require.NoError(t, err)
			break
		}
		t.Logf("run %d killed at commit %d (position %d)", attempt, j.commits(t.Context()), j.position(t))
	}
	assert.Equal(t, 5, kills)
}

// TestCrashChild is the job of TestFaultCrashResume (and TestFaultCrashResumeUpsert),
// run in a child process.
func TestCrashChild(t *testing.T) {
	table := os.Getenv("PGPIPE_CRASH_TABLE")
	if table == "" {
		t.Skip("run by TestFaultCrashResume as a child process")
	}
	n, err := strconv.Atoi(os.Getenv("PGPIPE_CRASH_N"))
	require.NoError(t, err)
	pool := newPool(t, 8)
	j := &job{pool: pool, table: table, name: os.Getenv("PGPIPE_CRASH_JOB"), n: n, batch: 500, workers: 4}
	if os.Getenv("PGPIPE_CRASH_UPSERT") != "" {
		j.upsert = true
		j.events, _ = repeatedKeys(n, 0.3)
	}
	_, err = j.run(context.Background())
	require.NoError(t, err)
}

// TestFaultCommitAckLost loses the server's acknowledgment of a COMMIT that did
// commit (a proxy cuts the connection right after the server sent it). The writer
// cannot know the outcome, reads the checkpoint back, learns that the batch committed,
// and does not write it again: in insert mode, writing it again would duplicate it.
func TestFaultCommitAckLost(t *testing.T) {
	direct := newPool(t, 4)
	j := newJob(t, direct, false, 20000, 1000, 4)
	// The 1st COMMIT is the checkpoint's Load; lose the 4th, a batch's.
	proxy, u := newLossyProxy(t, 4)
	cfg, err := pgxpool.ParseConfig(u)
	require.NoError(t, err)
	cfg.MaxConns = int32(j.workers) // every connection held by a writer: the read-back needs its own
	j.pool, err = pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	defer j.pool.Close()
	_, rep, err := j.runReport(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(1), proxy.dropped.Load(), "one COMMIT acknowledgment was lost")
	assert.Zero(t, retried(rep), "the committed batch is not written again")
	j.pool = direct
	j.check(t)
}

// retriedOnce returns an observer option and a channel closed at the first retry of the
// sink stage "load".
func retriedOnce() (pipeline.PipelineOption, <-chan struct{}) {
	ch := make(chan struct{})
	var once sync.Once
	return pipeline.WithObserver(func(e pipeline.Event) {
		if e.Kind == pipeline.EventRetry && e.Stage == "load" {
			once.Do(func() { close(ch) })
		}
	}), ch
}

// TestFaultAttemptTimeoutRetried holds the job's advisory lock exclusively (as a Load
// of the job does while it waits for the commits in flight) past the sink's attempt
// timeout, so that the writers' commits wait for it: the attempt's own deadline is
// transient, and the batch is written again once the lock is free. It used to fail the
// run ("item failed (1 attempt)"). (It held the job's checkpoint row FOR UPDATE while
// commits locked the row FOR KEY SHARE; they no longer lock it.)
func TestFaultAttemptTimeoutRetried(t *testing.T) {
	pool := newPool(t, 8)
	j := newJob(t, pool, false, 6000, 1000, 2)
	obs, retried1 := retriedOnce()
	j.popts = []pipeline.PipelineOption{obs}
	j.sopts = []pipeline.StageOption{pipeline.WithTimeout(300 * time.Millisecond)}
	g := j.startGated(t, 0) // the checkpoint is loaded: its row exists
	holder, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(t.Context(), "SELECT pg_advisory_xact_lock(1885827184, hashtext($1))", j.name)
	require.NoError(t, err)
	close(g.release)
	select {
	case <-retried1: // a writer's attempt timed out waiting for the lock
	case err := <-g.done:
		t.Fatalf("the run ended while the job's lock was held: %v", err)
	}
	require.NoError(t, holder.Rollback(t.Context()))
	require.NoError(t, awaitRun(t, g.done))
	j.check(t)
	assert.Positive(t, retried(g.rep))
}

// TestFaultCommitWaitsForStandby makes every COMMIT wait for a synchronous standby that
// does not exist (synchronous_standby_names = 'nobody') past the sink's attempt
// timeout, for several batches. pgx then closes the connection and cancels the query,
// asynchronously; the cancel ends the wait and the transaction commits (it was
// committed locally already). The writer's read-back used to run before that, see the
// checkpoint row as it was, conclude "not committed" and write the batch again (insert
// mode: 1,000 rows twice); it now waits for the transaction to end.
func TestFaultCommitWaitsForStandby(t *testing.T) {
	pool := newPool(t, 8)
	standby := syncStandby(t, pool)
	j := newJob(t, pool, false, 20000, 1000, 1)
	// No periodic Save: it would wait for the standby too, with nobody to cancel it,
	// and hold the source up.
	j.copts = []pipeline.CheckpointOption{pipeline.WithSaveEvery(1 << 30), pipeline.WithSaveInterval(time.Hour)}
	j.sopts = []pipeline.StageOption{pipeline.WithTimeout(300 * time.Millisecond)}
	g := j.startGated(t, 5000)
	done := g.done
	standby("nobody")
	close(g.release)
	// The server's processes take the new setting in their own time: from the first
	// COMMIT seen waiting for the standby on, each one waits, times out and is resolved.
	waitFor(t, "a COMMIT waiting for the standby", func() bool {
		return len(done) > 0 || standbyWaiter(t, pool) != 0
	})
	before := j.commits(t.Context())
	const stalled = 6
	waitFor(t, "commits that waited for the standby", func() bool {
		return len(done) > 0 || j.commits(t.Context()) >= before+stalled
	})
	if len(done) > 0 {
		t.Fatalf("the run ended while COMMIT waited for the standby: %v", <-done)
	}
	standby("")
	require.NoError(t, awaitRun(t, done))
	rows, distinct := count(t, pool, j.table)
	t.Logf("%d commits waited for the standby; rows %d, distinct %d: %d duplicated", stalled, rows, distinct, rows-distinct)
	j.check(t)
}

// syncStandby returns a function that sets synchronous_standby_names ("" resets it) and
// reloads the configuration; the setting is reset when the test ends. It skips the
// test unless the role is a superuser (ALTER SYSTEM).
func syncStandby(t *testing.T, pool *pgxpool.Pool) func(names string) {
	t.Helper()
	var super bool
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super))
	if !super {
		t.Skip("ALTER SYSTEM needs a superuser")
	}
	set := func(names string) {
		if names == "" {
			mustExec(t, pool, "ALTER SYSTEM RESET synchronous_standby_names")
		} else {
			mustExec(t, pool, "ALTER SYSTEM SET synchronous_standby_names = '"+names+"'")
		}
		mustExec(t, pool, "SELECT pg_reload_conf()")
	}
	t.Cleanup(func() { set("") })
	return set
}

// standbyWaiter returns the pid of a backend whose COMMIT waits for a synchronous
// standby, or 0.
func standbyWaiter(t *testing.T, pool *pgxpool.Pool) int32 {
	t.Helper()
	var pid int32
	err := pool.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity
		WHERE wait_event = 'SyncRep' AND lower(query) = 'commit' AND datname = current_database() LIMIT 1`).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return pid
}

// commitWaitingForStandby starts a checkpointed job of one writer with a synchronous
// standby required that never comes ("nobody"), and returns once a COMMIT of the
// writer waits for it: the pool, the standby setter, the job, its run and the pid of
// the waiting backend.
func commitWaitingForStandby(t *testing.T) (*pgxpool.Pool, func(string), *job, *gatedRun, int32) {
	t.Helper()
	pool := newPool(t, 8)
	standby := syncStandby(t, pool)
	j := newJob(t, pool, false, 10000, 1000, 1)
	j.copts = []pipeline.CheckpointOption{pipeline.WithSaveEvery(1 << 30), pipeline.WithSaveInterval(time.Hour)}
	g := j.startGated(t, 5000)
	done := g.done
	standby("nobody")
	close(g.release)
	var pid int32
	waitFor(t, "a COMMIT waiting for the standby", func() bool {
		pid = standbyWaiter(t, pool)
		return len(done) > 0 || pid != 0
	})
	require.NotZero(t, pid, "the run ended first")
	return pool, standby, j, g, pid
}

// TestFaultTerminateDuringStandbyWait kills the writer's backend while its COMMIT waits
// for a synchronous standby. The transaction was committed locally, so it commits as
// the backend exits (with a warning): the writer, which lost its connection, reads the
// checkpoint back, learns that the batch committed, and does not write it again. (If
// the standby requirement is reset before the backend sees the termination, its COMMIT
// succeeds instead and the next batch meets the FATAL: TestFaultTerminateAsStandbyWaitEnds.)
func TestFaultTerminateDuringStandbyWait(t *testing.T) {
	pool, standby, j, g, pid := commitWaitingForStandby(t)
	done := g.done
	mustExec(t, pool, "SELECT pg_terminate_backend($1)", pid)
	standby("")
	require.NoError(t, awaitRun(t, done))
	j.check(t) // every row once: the batch was not written again
	assert.LessOrEqual(t, retried(g.rep), int64(1), "at most the next batch, whose first statement met the backend's FATAL")
}

// TestFaultTerminateAsStandbyWaitEnds terminates the writer's backend at the moment its
// COMMIT's wait for a synchronous standby ends: the backend is stopped (SIGSTOP) while
// it waits, terminated, its wait released (the standby requirement reset), then let go
// on. It finds its wait complete before it sees the termination, so its COMMIT
// succeeds, and the FATAL of its exit reaches the connection's next statement, the
// first of the next batch, which is retried: every row is there once. (This is the
// interleaving that TestFaultTerminateDuringStandbyWait meets about once in forty
// runs.)
func TestFaultTerminateAsStandbyWaitEnds(t *testing.T) {
	pool, standby, j, g, pid := commitWaitingForStandby(t)
	done := g.done
	// The backend's pid is its process's: the server runs on this machine
	// (scripts/postgres.sh), as this test's user or one it may signal.
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("stopping backend %d: %v (the test needs the server on this machine, started by scripts/postgres.sh)", pid, err)
		}
		t.Skipf("stopping backend %d: %v (the server is not on this machine)", pid, err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(int(pid), syscall.SIGCONT)
		}
	}()
	mustExec(t, pool, "SELECT pg_terminate_backend($1)", pid)
	standby("")
	// A commit of its own returns once the standby requirement is gone from the server's
	// shared state, which is when the stopped backend's wait was marked complete.
	mustExec(t, pool, "SELECT pg_current_xact_id()")
	resumed = true
	require.NoError(t, syscall.Kill(int(pid), syscall.SIGCONT))
	require.NoError(t, awaitRun(t, done))
	j.check(t) // every row once: the batch was not written again
	assert.LessOrEqual(t, retried(g.rep), int64(1), "at most the next batch, whose first statement met the backend's FATAL")
}
