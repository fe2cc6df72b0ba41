package pipeline

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopipeline/pipeline/internal/attempt"
)

// Kind is what a row of a [Report] is ([StageReport.Kind]): a source, a stage, a sink,
// a filter or a batch. It is a string type, so that a Kind prints, marshals to JSON and
// labels a metric as its name ("source", "stage", ...); compare it with the constants.
type Kind string

// The kinds of rows in a [Report].
const (
	// KindSource is a source (FromSlice, Generate, FromSeq, FromChan, FromAcked,
	// FromCheckpoint, ...): it has no input queue and no workers (Workers is 0); its In
	// is the items it holds when known, else the items it produced.
	KindSource Kind = "source"
	// KindStage is a stage attached by [Then] (made by [NewStage] or [NewFlatStage]):
	// workers taking items from an input queue.
	KindStage Kind = "stage"
	// KindSink is a sink: a stage attached by [To] or [ToBatches], the row through
	// which [Collect] and [All] read a stream, or a [ForEach] (one worker, no queue:
	// it runs inline). A sink stage's function may call [Commit] and [SetAside].
	KindSink Kind = "sink"
	// KindFilter is a [Filter]: it runs inline in the row before it, with no queue and no
	// workers; Filtered counts the items it dropped.
	KindFilter Kind = "filter"
	// KindBatch is a [Batch] (also the batching row of [ToBatches]): one worker filling
	// batches from an input queue; its Out counts batches and Flushes their reasons.
	KindBatch Kind = "batch"
	// KindWindow is a [Window] stage: one worker folding items into windows; its Out
	// counts results and Windows holds its state.
	KindWindow Kind = "window"
)

// workerStats are one worker's counters. Each worker writes only its own, so counting
// costs no lock and no contended atomic; the padding keeps two workers' counters off
// one cache line.
type workerStats struct {
	received     counter // items taken from the queue
	succeeded    counter // items whose attempt succeeded
	emitted      counter // outputs sent downstream
	retried      counter // retries (attempts after the first)
	deadLettered counter // items set aside
	handedBack   counter // of those, items given back to their acknowledged source (WithHandBack)
	failed       counter // items in flight when the run stopped, or whose error was fatal
	discarded    counter // items taken but not started (drained budget)
	peak         counter // largest queue length seen when taking an item
	busy         counter // 1 while the worker handles an item
	_            [64]byte
	lat          histogram // attempt durations
	_            [64]byte
}

type queueLen interface {
	length() int    // waiting, not yet taken: for the accounting
	occupancy() int // waiting or taken and not started: what the bound counts
	unsentCount() int64
	startedBy(worker int) int64 // items the worker took and then started or gave back
}

// row is one row of a run's report: a source, stage, sink, filter or batch (see [Kind]).
type row struct {
	name     string
	kind     Kind
	capacity int
	q        queueLen
	given    int64                 // items a source holds, -1 when unknown
	declared int64                 // items a source declared it holds (WithTotal), 0 when not
	resumed  *atomic.Int64         // the checkpointed source: positions before its start, and those it skipped as committed
	lag      func() []PartitionLag // a tracked source's WithLag (lag.go), nil without
	workers  []workerStats
	held     func() int64   // ordered stages: items finished but still in the window; windows: items in open windows
	flushes  *flushCounters // batches: flush reasons
	windows  windowRow      // window stages (window.go)
	timeout  time.Duration  // the stage's WithTimeout
	next     []string       // the rows this one feeds directly
	extra    int            // items held beyond queue and workers: a reorder window, a partial batch
	unit     int            // batches: the items one element downstream of it may hold
	ups      []*row         // every row upstream of this one (the rows its input was wired from)
	drain    atomic.Bool    // a drained budget tripped here or downstream: start no new item
	filtered *atomic.Int64  // filters: items dropped
	arrived  *atomic.Int64  // filters: items that reached it
	setAside atomic.Int64   // sinks: parts of their items their function set aside (SetAside)
	lost     atomic.Int64   // items a Tee offered this row's branch that a panic in an inline operator of the branch stopped
	liveIn   atomic.Int64   // the largest In a Snapshot reported, so that In only grows
	liveOut  atomic.Int64   // filters: the largest Out a Snapshot reported
	client   clientRow      // rate limits, breaker, adaptive workers (client.go); nil without
	watch    *attempt.Watch // WithTimeout: the stuck-attempt watcher (internal/attempt); nil without

	mu     sync.Mutex
	causes map[causeKey]int64
	errs   map[string]*ErrorCount
}

type causeKey struct{ typ, msg string }

// grow returns the largest of v and what seen holds, and keeps it there: a live count
// that never goes down between two Snapshots.
func grow(seen *atomic.Int64, v int64) int64 {
	for {
		old := seen.Load()
		if v <= old {
			return old
		}
		if seen.CompareAndSwap(old, v) {
			return v
		}
	}
}

func (r *run) newRow(name string, kind Kind, workers, capacity int, q queueLen) *row {
	return &row{name: name, kind: kind, capacity: capacity, q: q, given: -1, workers: make([]workerStats, workers)}
}

func (r *run) addRow(rw *row) { r.rows = append(r.rows, rw) }

// inflight is the most items the run's stages can hold at once: queues, workers,
// reorder windows and partial batches, counting an element downstream of a Batch as a
// whole batch of items.
func (r *run) inflight() int {
	n := 0
	for _, rw := range r.rows {
		unit := 1
		for _, up := range rw.ups {
			if up.unit > 0 {
				unit *= up.unit
			}
		}
		n += (rw.capacity+len(rw.workers))*unit + rw.extra
	}
	return n
}

// maxCauses bounds the cause groups of a row: a message that names its item with
// letters (a key, a hex id) makes a group per item, which every Snapshot copies and sorts.
const maxCauses = 100

// otherCauses is the Message of the group of a type that counts the dead letters whose
// cause came once a row held maxCauses groups.
const otherCauses = "(other messages)"

// addCause counts a dead letter by its type and cause message (see causeMessage).
func (rw *row) addCause(typ, msg string) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.causes == nil {
		rw.causes = make(map[causeKey]int64)
	}
	k := causeKey{typ, msg}
	if _, ok := rw.causes[k]; !ok && len(rw.causes) >= maxCauses {
		k.msg = otherCauses
	}
	rw.causes[k]++
}

// causeMessage names an error's cause for grouping: the message of the innermost error
// of its chain (fmt.Errorf("fetch %d: %w", id, errReset) groups as errReset's message),
// with every run of digits replaced by "#" (so that ids and counts in messages do not
// split a group) and cut at 80 bytes.
func causeMessage(err error) string {
	if t, ok := errors.AsType[*timeoutError](err); ok {
		err = t.err // what the function returned when its deadline passed
	}
	for {
		u := errors.Unwrap(err)
		if u == nil {
			if m, ok := err.(interface{ Unwrap() []error }); ok {
				if us := m.Unwrap(); len(us) > 0 && us[0] != nil {
					u = us[0]
				}
			}
		}
		if u == nil {
			break
		}
		err = u
	}
	var b strings.Builder
	digits := false
	for _, c := range err.Error() {
		if c >= '0' && c <= '9' {
			if !digits {
				b.WriteByte('#')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(c)
		if b.Len() >= 80 {
			break
		}
	}
	return b.String()
}

// errTypeName returns the Go type that best names err: the outermost error in its chain
// whose type says something, looking through the package's markers, fmt's and errors'
// wrappers and plain errors.New values; "timeout" for a timeout, "error" when nothing
// more is known.
func errTypeName(err error) string {
	if errors.Is(err, ErrTimeout) {
		return "timeout"
	}
	for err != nil {
		switch t := fmt.Sprintf("%T", err); t {
		case "*pipeline.classified", "*pipeline.retryAfterError", "*fmt.wrapError", "*fmt.wrapErrors", "*errors.errorString", "*errors.joinError":
		default:
			return t
		}
		u := errors.Unwrap(err)
		if u == nil {
			if m, ok := err.(interface{ Unwrap() []error }); ok {
				if us := m.Unwrap(); len(us) > 0 {
					u = us[0]
				}
			}
		}
		err = u
	}
	return "error"
}

// Report is the account of one run: where every item went, per stage. For every stage,
// In = Succeeded + DeadLettered + Failed + NotStarted; a stage's In is what the rows
// that feed it (its Next's inverse) sent, counted in its own items: after a [Flatten],
// a Batch's Out counts batches while the next row's In counts their items.
type Report struct {
	Stages     []StageReport // upstream first: a row after every row that feeds it, otherwise in wiring order
	Err        error         // the error Run returned, nil on success
	Checkpoint int64         // checkpointed runs: the position saved last (-1 otherwise)

	CheckpointSaved time.Time     // when Checkpoint was saved (zero if never in this run)
	Running         bool          // a Snapshot of a run in progress
	Run             uint64        // which run of the pipeline: 1, 2, ... (0 before the first)
	Started         time.Time     // when the run started
	Elapsed         time.Duration // since the run started
}

// StageReport is the account of one row of a run: a source, stage, sink, filter or
// batch, as its Kind says.
type StageReport struct {
	Name    string
	Kind    Kind // KindSource, KindStage, KindSink, KindFilter, KindBatch or KindWindow
	Workers int

	In           int64 // items that reached the stage (for a source: items it holds, when known, else items it produced)
	Succeeded    int64 // items the stage finished without error
	Out          int64 // items sent on (Succeeded for a one-to-one stage)
	Retried      int64 // extra attempts made
	DeadLettered int64 // items set aside by the stage's error policy
	Failed       int64 // items whose error stopped the run, or in flight when it stopped
	NotStarted   int64 // items that reached the stage but were never started
	Filtered     int64 // items a filter dropped
	// SetAside counts, for a sink, the parts of its items (rows of a batch) that its
	// function set aside itself, through [SetAside]: a database's rejected rows, kept
	// in the connector's dead-letter table. They are not in In or DeadLettered, which
	// count the sink's own items (the batches).
	SetAside int64
	// HandedBack counts, of DeadLettered, the items a stage with [WithHandBack] gave
	// back to their acknowledged source ([FromAcked]) for a later delivery, rather than
	// to a dead-letter destination.
	HandedBack int64

	QueueCap  int // the capacity of the stage's input queue
	PeakQueue int // the longest the queue was when a worker took an item (at most QueueCap)

	Flushes Flushes // batches: flushes by reason

	// Windows is, for a [Window] stage (KindWindow), its open windows, watermark, lag
	// and late items; nil for other rows.
	Windows *WindowReport

	// Live figures (see [Pipeline.Snapshot]). In a final report, QueueLen, Busy,
	// InFlight and Window describe the moment the run ended (all 0 after a success),
	// and Rate is Out over the whole run.
	QueueLen int           // items waiting in the input queue
	Busy     int           // workers handling an item
	InFlight int64         // items started and not yet settled
	Window   int64         // ordered stages: finished items held for earlier ones; windows: items in windows not yet closed
	Rate     float64       // items sent on per second, recently
	Latency  Latency       // the stage function's attempt durations
	Timeout  time.Duration // the stage's WithTimeout, 0 if none
	Next     []string      // the rows this one feeds directly (several after a Tee)

	// Recent is, in a Snapshot, Latency over the last 10 s or so: the attempts timed
	// since the most recent earlier Snapshot at least 10 s old (or since the start of
	// the run), so that a change of latency shows beside the whole run's figures. Its
	// Max is within the histogram's 12.5 %. It is zero in a final report.
	Recent Latency

	// Total is, for a source that knows it ([FromSlice]) or declares it ([WithTotal]),
	// how many items it holds; 0 when unknown. With the source's Resumed and Out it
	// gives a run's progress: (Resumed + Out) / Total.
	Total int64

	// Resumed is, for the source of a checkpointed run ([FromCheckpoint]), the
	// positions settled by earlier runs that this run does not read again: those before
	// the position it started from, and those committed beyond it ([Commit]) that it
	// skipped. They are not in In or Out; they count as done in the run's progress.
	Resumed int64

	// Lag is, for an acknowledged or checkpointed source with [WithLag], its backlog
	// per partition when the report was made, in the order the source gave: the items
	// a broker holds for it not consumed yet. nil for other rows, and when the source
	// knows nothing (yet, or any more); [StageReport.TotalLag] sums it.
	Lag []PartitionLag

	Errors []ErrorCount // errors by type and outcome

	Causes []Cause // dead letters grouped by cause, most common first; at most about 100 groups (see Cause)

	// Clients of a service (client.go).
	Breaker      *BreakerReport // the circuit breaker; nil without WithCircuitBreaker
	Limit        int            // workers allowed to take items: Workers, or the adaptive limit
	LimitHistory []LimitChange  // the adaptive limit's latest changes (at most 64); nil without WithAdaptiveWorkers
	Throttled    time.Duration  // time the workers spent waiting for rate-limit tokens, together

	// OldestAttempt is, for a stage with [WithTimeout], the age of its oldest attempt
	// that has run for at least a quarter of the timeout (1 ms at least), measured to
	// within that quarter (it may show less than the true age, never more); 0 when none,
	// and always 0 for a stage without WithTimeout and in a final report. An age past the
	// timeout is a function that does not return after its context is done
	// ([EventStuck]).
	OldestAttempt time.Duration
}

// Cause is a group of dead letters with the same error type and cause: the message of
// the innermost error of the chain, with digits replaced by "#". A stage keeps 100
// groups; the dead letters of a cause that comes after that are counted in their type's
// group whose Message is "(other messages)" (a message that names its item with letters,
// a key or a hex id, makes a group per item).
type Cause struct {
	Type    string
	Message string
	Count   int64
}

// Processed returns the items the stage started: Succeeded + DeadLettered + Failed.
func (s StageReport) Processed() int64 { return s.Succeeded + s.DeadLettered + s.Failed }

// Stage returns the report of the stage with the given name.
func (r Report) Stage(name string) (StageReport, bool) {
	for _, s := range r.Stages {
		if s.Name == name {
			return s, true
		}
	}
	return StageReport{}, false
}

// NotStarted returns the items that no stage started, over the whole run.
func (r Report) NotStarted() int64 {
	var n int64
	for _, s := range r.Stages {
		n += s.NotStarted
	}
	return n
}

// DeadLettered returns the items set aside, over the whole run: by the stages' error
// policies, and by sinks' functions themselves ([StageReport.SetAside]).
func (r Report) DeadLettered() int64 {
	var n int64
	for _, s := range r.Stages {
		n += s.DeadLettered + s.SetAside
	}
	return n
}

// Causes returns the dead letters of all stages grouped by cause, most common first.
func (r Report) Causes() []Cause {
	m := map[causeKey]int64{}
	for _, s := range r.Stages {
		for _, c := range s.Causes {
			m[causeKey{c.Type, c.Message}] += c.Count
		}
	}
	return sortCauses(m)
}

func sortCauses(m map[causeKey]int64) []Cause {
	out := make([]Cause, 0, len(m))
	for k, n := range m {
		out = append(out, Cause{Type: k.typ, Message: k.msg, Count: n})
	}
	slices.SortFunc(out, func(a, b Cause) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Type, b.Type), cmp.Compare(a.Message, b.Message))
	})
	return out
}

// String formats the report as a compact table, one line per row (in: items that
// reached it; ok: finished; out: sent on; dropped: filtered out; queue: peak/capacity),
// then each batch's flushes by reason, each window stage's state, each source's lag
// ([WithLag]: its total, and the partitions furthest behind), the run's error and the
// main causes of dead letters.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-16s %-6s %4s %9s %9s %9s %8s %8s %8s %8s %8s %11s\n",
		"stage", "kind", "wrk", "in", "ok", "out", "retried", "dead", "failed", "notstart", "dropped", "queue")
	for _, s := range r.Stages {
		q := "-"
		if s.Kind != KindSource && s.Kind != KindFilter {
			q = fmt.Sprintf("%d/%d", s.PeakQueue, s.QueueCap)
		}
		fmt.Fprintf(&b, "%-16s %-6s %4d %9d %9d %9d %8d %8d %8d %8d %8d %11s\n",
			s.Name, s.Kind, s.Workers, s.In, s.Succeeded, s.Out, s.Retried, s.DeadLettered, s.Failed, s.NotStarted, s.Filtered, q)
	}
	for _, s := range r.Stages {
		if f := s.Flushes; s.Kind == KindBatch {
			label := "batch " + s.Name
			if strings.HasPrefix(strings.ToLower(s.Name), "batch") { // not "batch batch: 48 batches"
				label = s.Name
			}
			fmt.Fprintf(&b, "%s: %d batches: %d full, %d by bytes, %d by linger, %d at the end, %d for a checkpoint\n",
				label, s.Out, f.Size, f.Bytes, f.Linger, f.End, f.Checkpoint)
		}
	}
	for _, s := range r.Stages {
		if w := s.Windows; w != nil {
			b.WriteString(w.line(s.Name, s.Out)) // window.go
		}
	}
	for _, s := range r.Stages {
		b.WriteString(s.lagLine()) // lag.go: a source's backlog (WithLag)
	}
	for _, s := range r.Stages {
		if s.SetAside > 0 {
			fmt.Fprintf(&b, "sink %s: %d parts of its items set aside by its own function\n", s.Name, s.SetAside)
		}
	}
	b.WriteString(r.clientLines()) // client.go: breakers, adaptive limits
	if r.Err != nil {
		fmt.Fprintf(&b, "error: %v\n", r.Err)
	}
	for i, c := range r.Causes() {
		if i == 5 {
			break
		}
		fmt.Fprintf(&b, "dead letters: %d × %s %q\n", c.Count, c.Type, c.Message)
	}
	return b.String()
}

// report sums the counters of the run. final applies the end-of-run rules (items still
// held in a reorder window, or in a source's hand, failed); a live report counts them
// as in flight, so that its counts only grow.
func (r *run) report(err error, final bool) Report {
	rep := Report{Err: err, Checkpoint: -1, Elapsed: time.Since(r.started), Run: r.number, Started: r.started}
	if _, ok := r.track.(*checkpointTracker); ok { // its checkpoint loaded
		rep.Checkpoint = r.saved.Load()
		if at := r.savedAt.Load(); at != 0 {
			rep.CheckpointSaved = time.Unix(0, at)
		}
	}
	for _, rw := range r.rows {
		s := StageReport{Name: rw.name, Kind: rw.kind, Workers: len(rw.workers), QueueCap: rw.capacity}
		var received, discarded int64
		for i := range rw.workers {
			w := &rw.workers[i]
			received += w.received.load()
			discarded += w.discarded.load()
			s.Succeeded += w.succeeded.load()
			s.Out += w.emitted.load()
			s.Retried += w.retried.load()
			s.DeadLettered += w.deadLettered.load()
			s.HandedBack += w.handedBack.load()
			s.Failed += w.failed.load()
			s.PeakQueue = max(s.PeakQueue, int(w.peak.load()))
			s.Busy += int(w.busy.load())
		}
		if rw.watch != nil && !final {
			s.OldestAttempt = rw.watch.Oldest(rep.Elapsed)
		}
		switch rw.kind {
		case KindSource:
			s.Workers = 0
			s.In = received
			s.NotStarted = discarded
			if rw.given >= 0 {
				s.In, s.Total = rw.given, rw.given
				s.NotStarted += rw.given - received
			} else {
				s.Total = rw.declared
			}
			if rw.resumed != nil {
				s.Resumed = rw.resumed.Load()
			}
			if rw.lag != nil {
				s.Lag = readLag(rw.lag) // lag.go
			}
			if final {
				s.Failed = received - discarded - s.Succeeded // an inline operator after it panicked
			}
		case KindFilter:
			s.Workers = 0
			s.Filtered = rw.filtered.Load()
			s.Failed = rw.lost.Load()
			s.In = rw.arrived.Load() + s.Failed
			s.Succeeded = max(0, s.In-s.Filtered-s.Failed)
			if !final {
				// The upstream counts an item as sent after the filter dropped it: for an
				// instant, what it sent misses an item the filter already counts.
				s.In = grow(&rw.liveIn, s.In)
				s.Succeeded = grow(&rw.liveOut, s.Succeeded)
			}
			s.Out = s.Succeeded
		default:
			if rw.held != nil {
				s.Window = rw.held()
				if final { // finished, but never sent on: in flight when the run stopped
					s.Succeeded -= s.Window
					s.Failed += s.Window
				}
			}
			left := int64(rw.q.length()) + rw.q.unsentCount()
			lost := rw.lost.Load()
			s.In = received + left + lost
			s.NotStarted = discarded + left
			s.Failed += lost
			if !final {
				// An item leaving the queue is briefly in neither the queue nor the
				// received count: report the largest In seen, so that In never drops.
				s.In = grow(&rw.liveIn, s.In)
			}
		}
		if rw.flushes != nil {
			s.Flushes = rw.flushes.load()
		}
		if rw.windows != nil {
			s.Windows = rw.windows.load()
		}
		s.SetAside = rw.setAside.Load()
		if rw.q != nil {
			s.QueueLen = rw.q.occupancy()
		}
		switch {
		case rw.kind == KindFilter:
		case rw.q != nil:
			var taken int64                   // taken by a worker, not started yet: not started, of the moment
			s.InFlight, taken = rw.inFlight() // stats.go
			s.NotStarted += taken
		default:
			s.InFlight = received - discarded - s.Succeeded - s.DeadLettered - (s.Failed - rw.lost.Load())
		}
		s.Latency = latencyOf(rw.workers)
		s.Timeout, s.Next = rw.timeout, slices.Clone(rw.next)
		s.Limit = s.Workers
		if rw.client != nil {
			rw.client.fill(&s) // client.go
		}
		if secs := rep.Elapsed.Seconds(); secs > 0 {
			s.Rate = float64(s.Out) / secs
		}
		rw.mu.Lock()
		s.Causes = sortCauses(rw.causes)
		for _, e := range rw.errs {
			s.Errors = append(s.Errors, *e)
		}
		rw.mu.Unlock()
		slices.SortFunc(s.Errors, func(a, b ErrorCount) int { return cmp.Compare(a.Type, b.Type) })
		rep.Stages = append(rep.Stages, s)
	}
	return rep
}
