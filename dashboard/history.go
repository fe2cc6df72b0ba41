package dashboard

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gopipeline/pipeline"
)

// history is the recent past of one pipeline's run: one point per frame the handler
// took while the run was in progress, at most limit points (the oldest go first).
//
// Its slices are append-only: a point is never changed once written and dropping the
// oldest re-slices, so that a frame keeps the slice headers it was given and reads
// them later (to encode data.json) without a lock and without a copy, while newer
// frames append.
type history struct {
	limit  int
	run    uint64
	names  []string // the stages, in the report's order: another list starts afresh
	times  []float64
	stages []series
	last   []totals // the cumulative counts at the latest point, per stage
	lastAt float64
}

// series are one stage's figures over time, one value per point of its history.
type series struct {
	Rate    []float64 // items (batches for a batch) sent on per second
	Fill    []float64 // the input queue's fill, 0 to 1 (nil for a row with no queue)
	P99     []float64 // the recent p99 latency, in seconds (nil for a row with no workers)
	Retried []float64 // retries per second since the previous point
	Dead    []float64 // dead letters per second since the previous point
	Limit   []float64 // the adaptive limit (nil without WithAdaptiveWorkers)
}

type totals struct{ retried, dead int64 }

func newHistory(limit int) *history { return &history{limit: limit} }

// add records rep as the history's newest point, if rep is a Snapshot of a run in
// progress taken later than the newest point; a new run, or a different list of
// stages, starts the history afresh.
func (h *history) add(rep pipeline.Report) {
	if !rep.Running || h.limit == 0 {
		return
	}
	at := rep.Elapsed.Seconds()
	if rep.Run != h.run || !sameStages(h.names, rep.Stages) {
		*h = history{
			limit: h.limit, run: rep.Run, names: make([]string, len(rep.Stages)),
			stages: make([]series, len(rep.Stages)), last: make([]totals, len(rep.Stages)),
		}
		for i, s := range rep.Stages {
			h.names[i] = s.Name
		}
	} else if len(h.times) > 0 && at <= h.lastAt {
		return
	}
	dt := at - h.lastAt
	h.times = push(h.times, round(at, 1e3), h.limit)
	for i, s := range rep.Stages {
		sr := &h.stages[i]
		sr.Rate = push(sr.Rate, round(s.Rate, 10), h.limit)
		if hasQueue(s.Kind, s.QueueCap) {
			sr.Fill = push(sr.Fill, round(float64(s.QueueLen)/float64(s.QueueCap), 1e3), h.limit)
		}
		if s.Workers > 0 {
			sr.P99 = push(sr.P99, round(s.Recent.P99.Seconds(), 1e6), h.limit)
		}
		if s.LimitHistory != nil {
			sr.Limit = push(sr.Limit, float64(s.Limit), h.limit)
		}
		var retried, dead float64
		if dt > 0 {
			retried = float64(s.Retried-h.last[i].retried) / dt
			dead = float64(s.DeadLettered-h.last[i].dead) / dt
		}
		sr.Retried = push(sr.Retried, round(max(retried, 0), 10), h.limit)
		sr.Dead = push(sr.Dead, round(max(dead, 0), 10), h.limit)
		h.last[i] = totals{s.Retried, s.DeadLettered}
	}
	h.lastAt = at
}

// view returns the history as it is now, for a frame of rep: slice headers that later
// points do not change. A history of another run, or of other stages, is not rep's
// (add keeps only reports of a run in progress: a run that started and ended between two
// refreshes, or failed before it began, has none), and the view is empty: its stages
// would not be rep's, which the page looks up by index.
func (h *history) view(rep pipeline.Report) historyJSON {
	if h.run != rep.Run || !sameStages(h.names, rep.Stages) {
		return historyJSON{Seconds: []float64{}, Stages: []stageHistoryJSON{}}
	}
	v := historyJSON{Seconds: h.times, Stages: make([]stageHistoryJSON, len(h.stages))}
	if v.Seconds == nil {
		v.Seconds = []float64{}
	}
	for i, s := range h.stages {
		v.Stages[i] = stageHistoryJSON{
			Name: h.names[i], Rate: nonNil(s.Rate), Fill: s.Fill, P99: s.P99,
			Retried: nonNil(s.Retried), Dead: nonNil(s.Dead), Limit: s.Limit,
		}
	}
	return v
}

func sameStages(names []string, stages []pipeline.StageReport) bool {
	return slices.EqualFunc(names, stages, func(n string, s pipeline.StageReport) bool { return n == s.Name })
}

// push appends v to s, dropping the oldest value when s holds limit values already.
func push(s []float64, v float64, limit int) []float64 {
	if len(s) >= limit {
		s = s[len(s)-limit+1:]
	}
	return append(s, v)
}

// round rounds v to 1/per: short numbers in data.json.
func round(v, per float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return math.Round(v*per) / per
}

func hasQueue(k pipeline.Kind, capacity int) bool {
	return capacity > 0 && k != pipeline.KindSource && k != pipeline.KindFilter
}

// The small charts of the page.
const (
	chartW, chartH = 150, 34
	chartPoints    = chartW // at most one point per unit of width
)

// chart is one small chart: a line over the history's span.
type chart struct {
	Points string // the polyline's points
	Area   string // the same, closed along the bottom (a filled area)
	Now    string // the latest value, formatted
	Peak   string // the highest value, formatted
	Class  string // "fill", "dead" or "": the line's colour
}

// newChart draws values (times in seconds) across the chart; the y axis goes from 0
// to top, or to the highest value when top is 0. format formats a value for the
// labels. With fewer than two points it draws nothing but the labels. Above
// chartPoints values, each point of the line is the mean (or, with peaks, the maximum)
// of the values of its slice of time. A series shorter than times (one that began
// after the history did) goes with the latest of them, on the history's time axis.
func newChart(times, values []float64, top float64, peaks bool, format func(float64) string) *chart {
	if len(values) == 0 || len(values) > len(times) {
		return nil
	}
	t0, t1, full := times[0], times[len(times)-1], len(times) // the history's span, the series' or longer
	times = times[len(times)-len(values):]
	c := &chart{Now: format(values[len(values)-1])}
	hi := slices.Max(values)
	c.Peak = format(hi)
	if top == 0 {
		top = hi
	}
	if len(values) < 2 {
		return c
	}
	span := t1 - t0
	if span <= 0 {
		return c
	}
	// Bucket the values by time into at most chartPoints slices.
	n := min(full, chartPoints)
	xs := make([]float64, 0, n)
	ys := make([]float64, 0, n)
	for i := 0; i < len(values); {
		slot := func(k int) int { return int(math.Round((times[k] - t0) / span * float64(n-1))) }
		b := slot(i)
		j, sum, peak := i, 0.0, 0.0
		for ; j < len(values) && slot(j) == b; j++ {
			sum += values[j]
			peak = max(peak, values[j])
		}
		y := sum / float64(j-i)
		if peaks {
			y = peak
		}
		xs = append(xs, float64(b)/float64(n-1)*chartW)
		ys = append(ys, y)
		i = j
	}
	var b strings.Builder
	for i := range xs {
		y := float64(chartH - 1)
		if top > 0 {
			y = 1 + (chartH-2)*(1-min(ys[i], top)/top)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", xs[i], y)
	}
	c.Points = b.String()
	c.Area = fmt.Sprintf("%.1f,%d %s %.1f,%d", xs[0], chartH, c.Points, xs[len(xs)-1], chartH)
	return c
}

// historyView is the history section of a pipeline on the page: a row of charts per
// stage.
type historyView struct {
	Span     string // how long the history covers: "2m30s"
	Points   int
	HasLimit bool
	Rows     []historyRow
}

type historyRow struct {
	Name                           string
	Rate, Fill, P99, Retried, Dead *chart
	Limit                          *chart
	RateUnit                       string
}

func newHistoryView(d pipelineJSON) *historyView {
	h := d.History
	if len(h.Seconds) == 0 {
		return nil
	}
	v := &historyView{Points: len(h.Seconds)}
	v.Span = seconds(h.Seconds[len(h.Seconds)-1] - h.Seconds[0])
	for i, s := range h.Stages {
		st := d.Stages[i]
		per := func(v float64) string { return rate(v) }
		if st.Kind == pipeline.KindBatch {
			per = func(v float64) string { return batchRate(v) }
		}
		r := historyRow{Name: s.Name}
		r.Rate = newChart(h.Seconds, s.Rate, 0, false, per)
		r.Fill = newChart(h.Seconds, s.Fill, 1, true, func(v float64) string { return fmt.Sprintf("%.0f%%", v*100) })
		if r.Fill != nil {
			r.Fill.Class = "fill"
		}
		if st.Kind != pipeline.KindSource && st.Kind != pipeline.KindFilter {
			r.P99 = newChart(h.Seconds, s.P99, 0, true, seconds)
			r.Retried = newChart(h.Seconds, s.Retried, 0, false, rate)
			r.Dead = newChart(h.Seconds, s.Dead, 0, false, rate)
			if r.Dead != nil {
				r.Dead.Class = "dead"
			}
		}
		if s.Limit != nil {
			v.HasLimit = true
			r.Limit = newChart(h.Seconds, s.Limit, float64(st.Workers), true, func(v float64) string { return fmt.Sprint(int(v)) })
		}
		v.Rows = append(v.Rows, r)
	}
	return v
}
