package pipeline

import (
	"cmp"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gopipeline/pipeline/internal/hist"
)

// histogram is a worker's latency histogram (internal/hist: log-linear, percentiles
// within 12.5 %, from 1 ns up to 2^40 ns).
type histogram struct {
	b   [hist.Buckets]counter
	max counter
	sum counter // nanoseconds
}

// record adds one duration; only the owning worker calls it.
func (h *histogram) record(d time.Duration) {
	ns := int64(d)
	h.b[hist.BucketOf(ns)].inc()
	h.max.max(ns)
	h.sum.add(ns)
}

// Latency is the distribution of one stage's attempt durations (the stage function's
// calls, not the waits for room downstream), from a fixed-memory histogram: percentiles
// are within 12.5 %. Workers time one attempt in 64, and every attempt once one took
// more than 20 µs, so timing costs almost nothing on fast stages.
type Latency struct {
	Count              int64         // attempts timed
	Sum                time.Duration // their total duration
	P50, P90, P99, Max time.Duration
}

func latencyOf(ws []workerStats) Latency {
	sum, l := bucketsOf(ws)
	return quantiles(&sum, l)
}

// bucketsOf sums the workers' histograms: the counts per bucket, and a Latency with
// Count, Sum and Max set.
func bucketsOf(ws []workerStats) (sum [hist.Buckets]int64, l Latency) {
	for i := range ws {
		h := &ws[i].lat
		for j := range sum {
			n := h.b[j].load()
			sum[j] += n
			l.Count += n
		}
		l.Max = max(l.Max, time.Duration(h.max.load()))
		l.Sum += time.Duration(h.sum.load())
	}
	return sum, l
}

// quantiles sets l's percentiles from the bucket counts sum (whose total is l.Count),
// none above l.Max.
func quantiles(sum *[hist.Buckets]int64, l Latency) Latency {
	if l.Count == 0 {
		return l
	}
	l.P50 = hist.Quantile(sum, l.Count, l.Max, 0.50)
	l.P90 = hist.Quantile(sum, l.Count, l.Max, 0.90)
	l.P99 = hist.Quantile(sum, l.Count, l.Max, 0.99)
	return l
}

// recentWindow is how far back [StageReport].Recent looks: its baseline is the most
// recent earlier Snapshot at least this old.
const recentWindow = 10 * time.Second

// latencySample is one Snapshot's latency histograms, one per row (the nonzero buckets
// only), for the recent percentiles of later ones.
type latencySample struct {
	at   time.Time
	rows [][]bucketCount
	sums []time.Duration
}

type bucketCount struct {
	i int
	n int64
}

// recentLatency sets each row's Recent from the difference between its histogram now
// and the baseline of p.recent, and keeps a sample of now's for later Snapshots (one a
// second at most, as long as it may serve as a baseline). p.mu must be held.
func (p *Pipeline) recentLatency(r *run, rep *Report, now time.Time) {
	if p.recentRun != r {
		p.recent, p.recentRun = p.recent[:0], r
	}
	var base *latencySample
	first := 0
	for i := range p.recent {
		if now.Sub(p.recent[i].at) >= recentWindow {
			base, first = &p.recent[i], i // in time order: the last one old enough wins
		}
	}
	smp := latencySample{at: now, rows: make([][]bucketCount, len(r.rows)), sums: make([]time.Duration, len(r.rows))}
	for i, rw := range r.rows {
		if i >= len(rep.Stages) {
			break
		}
		sum, l := bucketsOf(rw.workers)
		for j, n := range sum {
			if n > 0 {
				smp.rows[i] = append(smp.rows[i], bucketCount{j, n})
			}
		}
		smp.sums[i] = l.Sum
		if base != nil && i < len(base.rows) {
			for _, b := range base.rows[i] {
				sum[b.i] -= b.n
			}
			l.Count, l.Sum = 0, l.Sum-base.sums[i]
			for _, n := range sum {
				l.Count += n
			}
		}
		// The window's largest value is in its highest bucket, not above the run's Max;
		// with no attempt in the window, there is none (not the run's).
		if l.Count == 0 {
			l.Max = 0
		}
		for j := len(sum) - 1; j >= 0; j-- {
			if sum[j] > 0 {
				l.Max = min(l.Max, time.Duration(hist.BucketUpper(j)))
				break
			}
		}
		rep.Stages[i].Recent = quantiles(&sum, l)
	}
	// Keep the baseline found and every later sample; add now's a second after the last.
	p.recent = append(p.recent[:0], p.recent[first:]...)
	if n := len(p.recent); n == 0 || now.Sub(p.recent[n-1].at) >= time.Second {
		p.recent = append(p.recent, smp)
	}
}

// ErrorCount counts a stage's errors of one type by what became of them.
type ErrorCount struct {
	Type         string
	Retried      int64 // attempts retried after an error of this type
	DeadLettered int64 // items set aside with this as their last error
	Failed       int64 // errors of this type that stopped the run
}

// addError counts one error of a type under an outcome (rare paths only).
func (rw *row) addError(typ string, f func(*ErrorCount)) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.errs == nil {
		rw.errs = make(map[string]*ErrorCount)
	}
	e := rw.errs[typ]
	if e == nil {
		e = &ErrorCount{Type: typ}
		rw.errs[typ] = e
	}
	f(e)
}

// inFlight returns, for a row with an input queue, the items its workers started and
// have not settled, and those they took in a run and have not started yet. A worker
// counts the items it takes when it takes its run, and its outcomes once per run: until
// the run ends, the difference holds the run's items not started yet (which the
// queue's count of started items, written per item anyway, tells apart) and those
// finished since the worker last published its counts. A stage's worker handles one
// item at a time, so it has one in flight at most; a batch, the items of its batch.
// Both are 0 once the run has ended.
//
// The received count is read before the started one: a worker may start its run and
// take the next between the two reads, and read the other way round the taken count
// would hold both runs, more than the queue's bound lets a worker hold. Read this way
// it is at most what the worker held when received was read.
func (rw *row) inFlight() (inFlight, taken int64) {
	for i := range rw.workers {
		w := &rw.workers[i]
		received := w.received.load()
		started := rw.q.startedBy(i)
		v := started - w.discarded.load() - w.succeeded.load() - w.deadLettered.load() - w.failed.load()
		if rw.kind != KindBatch {
			v = min(v, 1)
		}
		inFlight += max(v, 0)
		taken += max(received-started, 0) // an instant below 0 while a run is taken
	}
	return inFlight, taken
}

// Snapshot returns the state of the run in progress, as a [Report] whose Running is
// true: counts so far, queue lengths, busy workers, latency percentiles, and each stage's
// rate over the last second or so (measured between snapshots: from the most recent
// earlier Snapshot at least a second old, or from the start of the run). Between runs it
// returns the last run's report. It is safe to call from any goroutine at any time, and
// costs the stages nothing: the counters it reads are written anyway.
//
// A snapshot is not atomic across counters: an item moving between two stages may show
// in neither for an instant. During a run the cumulative counts (In, Succeeded, Out,
// Retried, DeadLettered, Failed, Filtered) only grow; NotStarted, the queue lengths,
// Busy, InFlight and Window are of the moment and go up and down.
func (p *Pipeline) Snapshot() Report {
	return p.snapshot(p.cur.Load())
}

// snapshot is Snapshot of run r, the run in progress when Snapshot began (nil if
// none).
func (p *Pipeline) snapshot(r *run) Report {
	if r == nil {
		return p.Report()
	}
	rep := r.report(nil, false)
	rep.Running = true
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur.Load() != r {
		// r ended, and a later run may have begun and sampled: its samples stay. The
		// rates are r's since its start, the latencies its whole run's.
		p.rates(&rep, rateSample{run: r, at: r.started}, now)
		for i := range rep.Stages {
			rep.Stages[i].Recent = rep.Stages[i].Latency
		}
		return rep
	}
	if len(p.samples) > 0 && p.samples[0].run != r {
		p.samples = p.samples[:0]
	}
	base := rateSample{run: r, at: r.started}
	for _, smp := range p.samples {
		if now.Sub(smp.at) >= time.Second {
			base = smp // samples are in time order: the last one old enough wins
		}
	}
	p.rates(&rep, base, now)
	out := make(map[string]int64, len(rep.Stages))
	for _, s := range rep.Stages {
		out[s.Name] = s.Out
	}
	// Keep the samples of the last few seconds (and at most 64).
	keep := p.samples[:0]
	for _, smp := range p.samples {
		if now.Sub(smp.at) < 5*time.Second {
			keep = append(keep, smp)
		}
	}
	p.samples = append(keep[max(0, len(keep)-63):], rateSample{run: r, at: now, out: out})
	p.recentLatency(r, &rep, now)
	return rep
}

// rates sets each stage's Rate in rep: its output since sample base, per second.
func (p *Pipeline) rates(rep *Report, base rateSample, now time.Time) {
	if dt := now.Sub(base.at).Seconds(); dt > 0 {
		for i := range rep.Stages {
			s := &rep.Stages[i]
			s.Rate = float64(s.Out-base.out[s.Name]) / dt
		}
	}
}

// rateSample is one Snapshot's output counts, for the rates of later ones.
type rateSample struct {
	run *run
	at  time.Time
	out map[string]int64
}

// Bottleneck names the stage that limits the run and says what to do about it.
type Bottleneck struct {
	Stage     string   // "" when no stage stands out
	Why       string   // the evidence
	Workers   int      // the stage's workers now
	Suggested int      // workers for the target rate, by Little's law (0 without a target)
	Warnings  []string // other findings: p99 latency near a stage's timeout, ...
}

// Bottleneck reads a report (a [Pipeline.Snapshot] of a running pipeline, or a final
// report) and names the bottleneck: the stage whose input queue is fullest while the
// queue after it is nearly empty and its workers are busy. With targetPerSecond > 0, it
// suggests the workers that stage needs for that rate from its median latency
// ([WorkersNeeded] with 25 % headroom). It also warns about every stage whose p99
// latency is above 80 % of its timeout: the timeout should sit well above p99.
func (r Report) Bottleneck(targetPerSecond float64) Bottleneck {
	var b Bottleneck
	best := -1.0
	for i, s := range r.Stages {
		if s.Timeout > 0 && s.Latency.Count > 0 && s.Latency.P99 > s.Timeout*8/10 {
			b.Warnings = append(b.Warnings, fmt.Sprintf("stage %q: p99 latency %v is close to its timeout %v",
				s.Name, s.Latency.P99.Round(time.Microsecond), s.Timeout))
		}
		if s.Kind == KindSource || s.Kind == KindFilter || s.QueueCap == 0 {
			continue
		}
		fill := float64(s.QueueLen) / float64(s.QueueCap)
		if r.Running && fill < 0.5 {
			continue
		}
		if !r.Running {
			fill = float64(s.PeakQueue) / float64(s.QueueCap)
		}
		out := 0.0 // how full the queue after this stage is
		if d := r.downstream(i); d != nil && d.QueueCap > 0 {
			out = float64(d.QueueLen) / float64(d.QueueCap)
			if !r.Running {
				out = float64(d.PeakQueue) / float64(d.QueueCap)
			}
		}
		if score := fill - out; score > best && fill >= 0.5 && out <= 0.5 {
			best = score
			workers := cmp.Or(s.Limit, s.Workers) // an adaptive stage: its limit (adaptive.go)
			b.Stage, b.Workers = s.Name, workers
			if r.Running {
				b.Why = fmt.Sprintf("input queue %d%% full, next queue %d%% full, %d/%d workers busy, p50 %v",
					int(fill*100), int(out*100), s.Busy, workers, s.Latency.P50.Round(time.Microsecond))
			} else {
				b.Why = fmt.Sprintf("input queue peaked at %d%%, next queue at %d%%, %d workers, p50 %v",
					int(fill*100), int(out*100), workers, s.Latency.P50.Round(time.Microsecond))
			}
			b.Suggested = 0
			if targetPerSecond > 0 && s.Latency.Count > 0 {
				b.Suggested = WorkersNeeded(targetPerSecond, s.Latency.P50, 1.25)
			}
		}
	}
	b.Warnings = append(b.Warnings, r.clientWarnings(b)...) // client.go
	return b
}

// downstream returns the stage fed by stage i, if the report knows it.
func (r Report) downstream(i int) *StageReport {
	if len(r.Stages[i].Next) == 0 {
		return nil
	}
	name := r.Stages[i].Next[0]
	for j := range r.Stages {
		if r.Stages[j].Name == name {
			return &r.Stages[j]
		}
	}
	return nil
}

// String formats the diagnosis on one line per finding.
func (b Bottleneck) String() string {
	var sb strings.Builder
	if b.Stage == "" {
		sb.WriteString("bottleneck: none stands out")
	} else {
		fmt.Fprintf(&sb, "bottleneck: stage %q (%s)", b.Stage, b.Why)
		if b.Suggested > 0 {
			fmt.Fprintf(&sb, "; for the target rate it needs %d workers (has %d)", b.Suggested, b.Workers)
		}
	}
	for _, w := range b.Warnings {
		sb.WriteString("\nwarning: " + w)
	}
	return sb.String()
}

// Line formats the report on one line, for progress output: first the lag of a source
// with [WithLag] (its total), then per stage, its recent rate,
// queue length and busy workers, the age of its oldest attempt when it is past the
// stage's timeout ([StageReport.OldestAttempt]), then the number of items set aside or failed so far,
// its breaker's state and adaptive limit when it has them, and its retries so far:
//
//	fetch 781/s q=100/100 busy=16/16 | write 781/s q=2/100 busy=1/4
//	orders lag=1200 | parse 781/s q=100/100 busy=4/4 | write 781/s q=2/100 busy=1/4
func (r Report) Line() string {
	var b strings.Builder
	for _, s := range r.Stages {
		if s.Kind == KindSource && s.Lag != nil {
			if b.Len() > 0 {
				b.WriteString(" | ")
			}
			fmt.Fprintf(&b, "%s lag=%d", s.Name, s.TotalLag())
		}
		if s.Kind == KindSource || s.Kind == KindFilter {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(" | ")
		}
		fmt.Fprintf(&b, "%s %.0f/s q=%d/%d busy=%d/%d", s.Name, s.Rate, s.QueueLen, s.QueueCap, s.Busy, s.Workers)
		if s.Timeout > 0 && s.OldestAttempt > s.Timeout { // a function that does not return after its context is done
			fmt.Fprintf(&b, " stuck=%v", s.OldestAttempt.Round(time.Millisecond))
		}
		if s.DeadLettered > 0 {
			fmt.Fprintf(&b, " dead=%d", s.DeadLettered)
		}
		if s.Failed > 0 {
			fmt.Fprintf(&b, " failed=%d", s.Failed)
		}
		b.WriteString(s.clientLine()) // client.go: breaker=open, limit=8/32
		if s.Retried > 0 {
			fmt.Fprintf(&b, " retried=%d", s.Retried)
		}
	}
	return b.String()
}

// WorkersNeeded returns how many workers a stage needs to sustain targetPerSecond items
// per second when one item takes latency, with headroom (1.25 means 25 % spare): by
// Little's law, the items in service at once are rate × latency. The result is at least
// 1. It panics if targetPerSecond or latency is negative, or headroom is less than 1.
//
//	WorkersNeeded(750, 20*time.Millisecond, 1.25) // 19
//
// For a stage with [WithAdaptiveWorkers], compare the result with the stage's
// [StageReport].Limit rather than its Workers: a limit held below the maximum means the
// service saturates there, and more workers would only queue at it ([Report.Bottleneck]
// says so).
func WorkersNeeded(targetPerSecond float64, latency time.Duration, headroom float64) int {
	if !(targetPerSecond >= 0) || latency < 0 || !(headroom >= 1) || math.IsInf(targetPerSecond, 0) || math.IsInf(headroom, 0) {
		panic(fmt.Sprintf("pipeline: WorkersNeeded(%v, %v, %v): need a finite rate >= 0, latency >= 0, headroom >= 1",
			targetPerSecond, latency, headroom))
	}
	n := math.Ceil(targetPerSecond * float64(latency) * headroom / 1e9) // 100/s × 70 ms is 7, not 7.000000000000001
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(1, int(n))
}
