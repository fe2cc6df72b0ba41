package dashboard

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gopipeline/pipeline"
)

// schemaVersion is data.json's "version": increment it on any change that is not an
// addition.
const schemaVersion = 1

// The JSON types, documented in the package doc. Field names are part of the schema.
type (
	dataJSON struct {
		Version   int            `json:"version"`
		Time      time.Time      `json:"time"`
		Interval  float64        `json:"interval_seconds"`
		Pipelines []pipelineJSON `json:"pipelines"`
	}
	pipelineJSON struct {
		Name       string         `json:"name"`
		Run        uint64         `json:"run"`
		Running    bool           `json:"running"`
		Started    time.Time      `json:"started,omitzero"`
		Elapsed    float64        `json:"elapsed_seconds"`
		Error      string         `json:"error,omitempty"`
		Checkpoint *int64         `json:"checkpoint,omitempty"`
		Progress   *progressJSON  `json:"progress,omitempty"`
		Bottleneck bottleneckJSON `json:"bottleneck"`
		Edges      []edgeJSON     `json:"edges"`
		Stages     []stageJSON    `json:"stages"`
		History    historyJSON    `json:"history"`
	}
	progressJSON struct {
		Read     int64    `json:"read"`
		Resumed  int64    `json:"resumed,omitempty"`
		Total    int64    `json:"total"`
		Fraction float64  `json:"fraction"`
		ETA      *float64 `json:"eta_seconds,omitempty"`
		// Committed is, for a checkpointed run, the position the checkpoint holds (at
		// most Total): what a crash would not redo. Read runs ahead of it by the items
		// in flight and those settled past a gap.
		Committed         *int64   `json:"committed,omitempty"`
		CommittedFraction *float64 `json:"committed_fraction,omitempty"`
	}
	historyJSON struct {
		Seconds []float64          `json:"seconds"`
		Stages  []stageHistoryJSON `json:"stages"`
	}
	stageHistoryJSON struct {
		Name    string    `json:"name"`
		Rate    []float64 `json:"rate_per_second"`
		Fill    []float64 `json:"queue_fill,omitempty"`
		P99     []float64 `json:"p99_seconds,omitempty"`
		Retried []float64 `json:"retried_per_second"`
		Dead    []float64 `json:"dead_lettered_per_second"`
		Limit   []float64 `json:"limit,omitempty"`
	}
	bottleneckJSON struct {
		Stage    string   `json:"stage"`
		Why      string   `json:"why"`
		Workers  int      `json:"workers"`
		Warnings []string `json:"warnings"`
	}
	edgeJSON struct {
		From     string `json:"from"`
		To       string `json:"to"`
		Inferred bool   `json:"inferred"`
	}
	stageJSON struct {
		Name         string           `json:"name"`
		Kind         pipeline.Kind    `json:"kind"`
		Workers      int              `json:"workers"`
		Busy         int              `json:"busy"`
		In           int64            `json:"in"`
		Succeeded    int64            `json:"succeeded"`
		Out          int64            `json:"out"`
		Retried      int64            `json:"retried"`
		DeadLettered int64            `json:"dead_lettered"`
		Failed       int64            `json:"failed"`
		NotStarted   int64            `json:"not_started"`
		Filtered     int64            `json:"filtered"`
		SetAside     int64            `json:"set_aside"`
		HandedBack   int64            `json:"handed_back"`
		Counters     map[string]int64 `json:"counters,omitempty"`
		Lag          *lagJSON         `json:"lag,omitempty"`
		InFlight     int64            `json:"in_flight"`
		Window       int64            `json:"window"`
		Queue        queueJSON        `json:"queue"`
		Rate         float64          `json:"rate_per_second"`
		Latency      latencyJSON      `json:"latency"`
		Recent       latencyJSON      `json:"recent_latency"`
		Timeout      float64          `json:"timeout_seconds"`
		Oldest       float64          `json:"oldest_attempt_seconds,omitempty"`
		Next         []string         `json:"next"`
		Bottleneck   bool             `json:"bottleneck"`
		Flushes      *flushesJSON     `json:"flushes,omitempty"`
		Windows      *windowsJSON     `json:"windows,omitempty"`
		Errors       []errorJSON      `json:"errors"`
		Causes       []causeJSON      `json:"causes"`
		Limit        int              `json:"limit"`
		LimitHistory []limitJSON      `json:"limit_history,omitempty"`
		Breaker      *breakerJSON     `json:"breaker,omitempty"`
		Throttled    float64          `json:"throttled_seconds"`
	}
	lagJSON struct { // a source with pipeline.WithLag
		Total      int64              `json:"total"`
		Partitions []partitionLagJSON `json:"partitions"`
	}
	partitionLagJSON struct {
		Partition string `json:"partition"`
		Lag       int64  `json:"lag"`
	}
	limitJSON struct {
		At     float64 `json:"at_seconds"`
		Limit  int     `json:"limit"`
		Reason string  `json:"reason"`
	}
	breakerJSON struct {
		State       string           `json:"state"`
		Opened      int64            `json:"opened"`
		Open        float64          `json:"open_seconds"`
		Held        int64            `json:"held"`
		Transitions []transitionJSON `json:"transitions"`
		// A breaker per key (WithBreakerPerKey) only: its items held now out of the
		// workers' hands, and its keys whose breaker is not closed.
		PerKey   bool  `json:"per_key,omitempty"`
		Holding  int64 `json:"holding,omitempty"`
		KeysOpen int   `json:"keys_open,omitempty"`
	}
	transitionJSON struct {
		To string  `json:"to"`
		At float64 `json:"at_seconds"`
	}
	queueJSON struct {
		Len  int     `json:"len"`
		Cap  int     `json:"cap"`
		Peak int     `json:"peak"`
		Fill float64 `json:"fill"`
	}
	latencyJSON struct {
		Count int64   `json:"count"`
		P50   float64 `json:"p50_seconds"`
		P90   float64 `json:"p90_seconds"`
		P99   float64 `json:"p99_seconds"`
		Max   float64 `json:"max_seconds"`
	}
	windowsJSON struct { // a window stage (pipeline.WindowReport)
		Open      int64   `json:"open"`
		Watermark string  `json:"watermark,omitempty"` // RFC 3339, empty before the first item
		Lag       float64 `json:"lag_seconds"`
		Late      int64   `json:"late"`
		Updates   int64   `json:"updates"`
		Forced    int64   `json:"forced"`
	}
	flushesJSON struct {
		Size       int64 `json:"size"`
		Bytes      int64 `json:"bytes"`
		Linger     int64 `json:"linger"`
		End        int64 `json:"end"`
		Checkpoint int64 `json:"checkpoint"`
	}
	errorJSON struct {
		Type         string `json:"type"`
		Name         string `json:"name"`
		Retried      int64  `json:"retried"`
		DeadLettered int64  `json:"dead_lettered"`
		Failed       int64  `json:"failed"`
	}
	causeJSON struct {
		Type    string `json:"type"`
		Name    string `json:"name"`
		Message string `json:"message"`
		Count   int64  `json:"count"`
	}
)

func encodeJSON(f *frame) []byte {
	d := dataJSON{Version: schemaVersion, Time: f.At.UTC(), Interval: f.interval.Seconds(), Pipelines: make([]pipelineJSON, len(f.Views))}
	for i, v := range f.Views {
		d.Pipelines[i] = v.Data
	}
	b, err := json.Marshal(d) // compact: the history's arrays are long
	if err != nil {
		panic("dashboard: " + err.Error()) // only plain values: cannot happen
	}
	return append(b, '\n')
}

// pipelineView is one pipeline of a frame: its data and its drawing.
type pipelineView struct {
	Data     pipelineJSON
	Graph    graph
	History  *historyView // nil before the run's first point
	Inferred bool         // some edge is inferred: the page explains the dashed line
}

// Node and edge sizes of the drawing, in SVG user units.
const (
	nodeW, nodeH = 200, 120
	gapX, gapY   = 56, 24
	margin       = 18
	maxLabel     = 18 // runes of a stage name drawn in a node (the rest is in its tooltip)
	maxControl   = 34 // runes of the controls' line of a node
)

type graph struct {
	W, H  int
	Nodes []node
	Edges []edge
}

type node struct {
	X, Y       int
	Stage      *stageJSON
	Label      string // the name, shortened to fit
	Lines      [4]string
	Control    bool // Lines[3] is about a control in an unusual state (an open breaker)
	HasQueue   bool
	QueueW     float64 // the filled part of the queue bar
	QueueClass string  // "ok", "high" or "full"
	Dead       bool    // the stage has dead letters or failures
	Stuck      bool    // Lines[1] is about an attempt past its timeout
	Bottleneck bool
}

type edge struct {
	Path     string // the line
	Arrow    string // its head
	Inferred bool
}

func newPipelineView(name string, rep pipeline.Report, hist historyJSON, counters map[string]map[string]int64) pipelineView {
	bn := rep.Bottleneck(0)
	d := pipelineJSON{
		Name: name, Run: rep.Run, Running: rep.Running, Started: rep.Started, Elapsed: rep.Elapsed.Seconds(),
		Bottleneck: bottleneckJSON{Stage: bn.Stage, Why: bn.Why, Workers: bn.Workers, Warnings: nonNil(bn.Warnings)},
		Edges:      []edgeJSON{},
		Stages:     make([]stageJSON, len(rep.Stages)),
		History:    hist,
	}
	if hist.Seconds == nil {
		d.History = historyJSON{Seconds: []float64{}, Stages: []stageHistoryJSON{}}
	}
	d.Progress = progressOf(rep)
	if rep.Err != nil {
		d.Error = rep.Err.Error()
	}
	if rep.Checkpoint >= 0 {
		d.Checkpoint = &rep.Checkpoint
	}
	index := make(map[string]int, len(rep.Stages))
	for i, s := range rep.Stages {
		index[s.Name] = i
		d.Stages[i] = newStageJSON(s, s.Name == bn.Stage)
		d.Stages[i].Counters = counters[s.Name]
	}
	// The edges: the rows each row feeds, where the report knows them; for a row that
	// can feed something but whose report names nothing, the row after it in the
	// report, if that one has an input (rows are wired upstream first).
	for i, s := range rep.Stages {
		next := nextOf(s)
		for _, n := range next {
			if j, ok := index[n]; ok && j != i {
				d.Edges = append(d.Edges, edgeJSON{From: s.Name, To: n})
			}
		}
		if len(next) == 0 && s.Kind != pipeline.KindSink && i+1 < len(rep.Stages) && rep.Stages[i+1].Kind != pipeline.KindSource {
			d.Edges = append(d.Edges, edgeJSON{From: s.Name, To: rep.Stages[i+1].Name, Inferred: true})
		}
	}
	v := pipelineView{Data: d, Graph: layout(d, index), History: newHistoryView(d)}
	v.Inferred = slices.ContainsFunc(d.Edges, func(e edgeJSON) bool { return e.Inferred })
	return v
}

// progressOf returns the run's progress when every source knows or declares its
// items, else nil: the items the sources read of their total (with the positions a
// resumed checkpointed run counts as done before its start), for a checkpointed run
// the position its checkpoint holds, and, while the run is in progress, the time left
// at their recent rate.
func progressOf(rep pipeline.Report) *progressJSON {
	var p progressJSON
	var rate float64
	for _, s := range rep.Stages {
		if s.Kind != pipeline.KindSource {
			continue
		}
		if s.Total <= 0 {
			return nil
		}
		p.Read += s.Resumed + s.Out
		p.Resumed += s.Resumed
		p.Total += s.Total
		rate += s.Rate
	}
	if p.Total == 0 {
		return nil
	}
	p.Fraction = round(min(float64(p.Read)/float64(p.Total), 1), 1e4)
	if rep.Checkpoint >= 0 {
		c := min(rep.Checkpoint, p.Total)
		f := round(float64(c)/float64(p.Total), 1e4)
		p.Committed, p.CommittedFraction = &c, &f
	}
	if left := p.Total - p.Read; rep.Running && rate > 0 {
		eta := round(max(float64(left), 0)/rate, 10)
		p.ETA = &eta
	}
	return &p
}

func newStageJSON(s pipeline.StageReport, bottleneck bool) stageJSON {
	j := stageJSON{
		Name: s.Name, Kind: s.Kind, Workers: s.Workers, Busy: s.Busy,
		In: s.In, Succeeded: s.Succeeded, Out: s.Out, Retried: s.Retried, DeadLettered: s.DeadLettered,
		Failed: s.Failed, NotStarted: s.NotStarted, Filtered: s.Filtered, SetAside: s.SetAside, HandedBack: s.HandedBack, InFlight: s.InFlight, Window: s.Window,
		Queue:   queueJSON{Len: s.QueueLen, Cap: s.QueueCap, Peak: s.PeakQueue},
		Rate:    s.Rate,
		Latency: latencyOf(s.Latency), Recent: latencyOf(s.Recent),
		Timeout: s.Timeout.Seconds(), Oldest: s.OldestAttempt.Seconds(), Next: nonNil(nextOf(s)), Bottleneck: bottleneck,
		Errors: make([]errorJSON, len(s.Errors)), Causes: make([]causeJSON, len(s.Causes)),
		Limit: s.Limit, Throttled: s.Throttled.Seconds(),
	}
	if s.Lag != nil {
		j.Lag = &lagJSON{Total: s.TotalLag(), Partitions: make([]partitionLagJSON, len(s.Lag))}
		for i, l := range s.Lag {
			j.Lag.Partitions[i] = partitionLagJSON{Partition: l.Partition, Lag: l.Lag}
		}
	}
	if s.LimitHistory != nil {
		j.LimitHistory = make([]limitJSON, len(s.LimitHistory))
		for i, c := range s.LimitHistory {
			j.LimitHistory[i] = limitJSON{At: c.At.Seconds(), Limit: c.Limit, Reason: c.Reason}
		}
	}
	if b := s.Breaker; b != nil {
		j.Breaker = &breakerJSON{
			State: b.State.String(), Opened: b.Opened, Open: b.TimeOpen.Seconds(), Held: b.Held,
			Transitions: make([]transitionJSON, len(b.Transitions)),
			PerKey:      b.PerKey, Holding: b.Holding, KeysOpen: b.KeysOpen,
		}
		for i, t := range b.Transitions {
			j.Breaker.Transitions[i] = transitionJSON{To: t.To.String(), At: t.At.Seconds()}
		}
	}
	if s.QueueCap > 0 {
		j.Queue.Fill = float64(s.QueueLen) / float64(s.QueueCap)
	}
	if s.Kind == pipeline.KindBatch {
		f := s.Flushes
		j.Flushes = &flushesJSON{Size: f.Size, Bytes: f.Bytes, Linger: f.Linger, End: f.End, Checkpoint: f.Checkpoint}
	}
	if w := s.Windows; w != nil {
		j.Windows = &windowsJSON{Open: w.Open, Lag: w.Lag.Seconds(), Late: w.Late, Updates: w.Updates, Forced: w.Forced}
		if !w.Watermark.IsZero() {
			j.Windows.Watermark = w.Watermark.Format(time.RFC3339Nano)
		}
	}
	for i, e := range s.Errors {
		j.Errors[i] = errorJSON{Type: e.Type, Name: errorName(e.Type), Retried: e.Retried, DeadLettered: e.DeadLettered, Failed: e.Failed}
	}
	for i, c := range s.Causes {
		j.Causes[i] = causeJSON{Type: c.Type, Name: errorName(c.Type), Message: c.Message, Count: c.Count}
	}
	return j
}

// nextOf returns the rows that s feeds, as far as the report knows. StageReport.Next
// is one name ("" when unknown) in v0.1, and becomes the list of every row a row feeds;
// this reads either, so that the package builds on both sides of that change.
func nextOf(s pipeline.StageReport) []string {
	switch next := any(s.Next).(type) {
	case string:
		if next != "" {
			return []string{next}
		}
	case []string:
		return next
	}
	return nil
}

func latencyOf(l pipeline.Latency) latencyJSON {
	return latencyJSON{Count: l.Count, P50: l.P50.Seconds(), P90: l.P90.Seconds(), P99: l.P99.Seconds(), Max: l.Max.Seconds()}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// layout places the stages in columns by their longest path from a row with no input,
// and in each column in the report's order. Rows in a cycle (which a report should
// never show) stay in the column they had reached.
func layout(d pipelineJSON, index map[string]int) graph {
	n := len(d.Stages)
	col := make([]int, n)
	out := make([][]int, n)
	indeg := make([]int, n)
	for _, e := range d.Edges {
		from, to := index[e.From], index[e.To]
		out[from] = append(out[from], to)
		indeg[to]++
	}
	var ready []int
	for i := range n {
		if indeg[i] == 0 {
			ready = append(ready, i)
		}
	}
	for len(ready) > 0 {
		i := ready[0]
		ready = ready[1:]
		for _, j := range out[i] {
			col[j] = max(col[j], col[i]+1)
			if indeg[j]--; indeg[j] == 0 {
				ready = append(ready, j)
			}
		}
	}
	rows := map[int]int{}
	var g graph
	g.Nodes = make([]node, n)
	for i := range d.Stages {
		s := &d.Stages[i]
		r := rows[col[i]]
		rows[col[i]]++
		nd := node{X: margin + col[i]*(nodeW+gapX), Y: margin + r*(nodeH+gapY), Stage: s, Bottleneck: s.Bottleneck}
		nd.Label = s.Name
		if rs := []rune(s.Name); len(rs) > maxLabel {
			nd.Label = string(rs[:maxLabel-1]) + "…"
		}
		nd.Dead = s.DeadLettered > 0 || s.Failed > 0 || s.SetAside > 0
		nd.Stuck = stuck(s)
		nd.Lines = nodeLines(s)
		nd.Control = s.Breaker != nil && s.Breaker.State != pipeline.BreakerClosed.String()
		if hasQueue(s.Kind, s.Queue.Cap) {
			nd.HasQueue = true
			fill := min(max(s.Queue.Fill, 0), 1)
			nd.QueueW = fill * (nodeW - 20)
			switch {
			case fill >= 0.9:
				nd.QueueClass = "full"
			case fill >= 0.5:
				nd.QueueClass = "high"
			default:
				nd.QueueClass = "ok"
			}
		}
		g.Nodes[i] = nd
		g.W = max(g.W, nd.X+nodeW+margin)
		g.H = max(g.H, nd.Y+nodeH+margin)
	}
	for _, e := range d.Edges {
		a, b := g.Nodes[index[e.From]], g.Nodes[index[e.To]]
		x1, y1 := a.X+nodeW, a.Y+nodeH/2
		x2, y2 := b.X-7, b.Y+nodeH/2 // short of the node: room for the arrowhead
		mx := (x1 + x2) / 2
		g.Edges = append(g.Edges, edge{
			Path:     fmt.Sprintf("M%d %d C%d %d %d %d %d %d", x1, y1, mx, y1, mx, y2, x2, y2),
			Arrow:    fmt.Sprintf("M%d %d L%d %d L%d %d Z", b.X-9, y2-5, b.X, y2, b.X-9, y2+5),
			Inferred: e.Inferred,
		})
	}
	return g
}

// nodeLines are the four lines of figures drawn in a stage's node: its rate, its
// latency, its outcomes and its controls.
func nodeLines(s *stageJSON) [4]string {
	var l [4]string
	switch s.Kind {
	case pipeline.KindSource:
		l[0] = fmt.Sprintf("out %s · %s", count(s.Out), rate(s.Rate))
		l[1] = countersLine(s.Counters) // a connector's (WithRowStats)
		l[2] = lagLine(s.Lag)
	case pipeline.KindFilter:
		l[0] = fmt.Sprintf("filtered %s", count(s.Filtered))
		if s.In > 0 { // v0.1 counts only what a filter dropped
			l[0] = fmt.Sprintf("out %s · filtered %s", count(s.Out), count(s.Filtered))
		}
	default:
		l[0] = fmt.Sprintf("busy %d/%d · %s", s.Busy, s.Workers, rate(s.Rate))
		switch {
		case s.Recent.Count > 0:
			l[1] = fmt.Sprintf("10s: p50 %s p99 %s", seconds(s.Recent.P50), seconds(s.Recent.P99))
		case s.Latency.Count > 0:
			l[1] = fmt.Sprintf("p50 %s · p99 %s", seconds(s.Latency.P50), seconds(s.Latency.P99))
		}
		var b strings.Builder
		fmt.Fprintf(&b, "ok %s", count(s.Succeeded))
		if s.DeadLettered > 0 {
			fmt.Fprintf(&b, " · dead %s", count(s.DeadLettered))
			if s.HandedBack > 0 { // given back to an acknowledged source, for a later delivery
				fmt.Fprintf(&b, " (%s handed back)", count(s.HandedBack))
			}
		}
		if s.Failed > 0 {
			fmt.Fprintf(&b, " · failed %s", count(s.Failed))
		}
		if s.SetAside > 0 { // parts of its items a sink set aside: a database's rejected rows
			fmt.Fprintf(&b, " · set aside %s", count(s.SetAside))
		}
		if s.Retried > 0 {
			fmt.Fprintf(&b, " · retried %s", count(s.Retried))
		}
		l[2] = b.String()
		if w := s.Windows; w != nil { // a window stage: its state, beside the latency
			l[1] = fmt.Sprintf("%s open · lag %s · late %s", count(w.Open), seconds(w.Lag), count(w.Late))
		}
		if f := s.Flushes; f != nil { // a batch: its rate and Out count batches
			l[0] = fmt.Sprintf("busy %d/%d · %s", s.Busy, s.Workers, batchRate(s.Rate))
			l[1] = fmt.Sprintf("%s items in %s batches", count(s.Succeeded), count(s.Out))
		}
		l[3] = controlLine(s)
		if stuck(s) { // a function that does not return after its context is done: before the latency
			l[1] = "stuck attempt " + seconds(s.Oldest)
		}
		if l[3] == "" {
			l[3] = countersLine(s.Counters)
		}
	}
	return l
}

// lagLine is a source's lag (pipeline.WithLag) in its node: "lag 1,234 · 12
// partitions"; "" without.
func lagLine(l *lagJSON) string {
	if l == nil {
		return ""
	}
	parts := "partitions"
	if len(l.Partitions) == 1 {
		parts = "partition"
	}
	return fmt.Sprintf("lag %s · %d %s", count(l.Total), len(l.Partitions), parts)
}

// lagTitle lists a source's lag by partition, for the tooltip of its lag cell:
// "orders/0 600 · orders/1 634".
func lagTitle(l *lagJSON) string {
	var b strings.Builder
	for _, p := range l.Partitions {
		if b.Len() > 0 {
			b.WriteString(" · ")
		}
		fmt.Fprintf(&b, "%s %s", p.Partition, count(p.Lag))
	}
	return b.String()
}

// stuck reports whether a stage's oldest running attempt has outlived its timeout.
func stuck(s *stageJSON) bool { return s.Timeout > 0 && s.Oldest > s.Timeout }

// countersLine is a row's connector counters (WithRowStats) in key order:
// "acked 1,200 · redelivered 3"; "" without.
func countersLine(c map[string]int64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(c)) {
		if b.Len() > 0 {
			b.WriteString(" · ")
		}
		fmt.Fprintf(&b, "%s %s", k, count(c[k]))
	}
	return b.String()
}

// controlLine says, in a node, the state of the stage's controls, most telling first
// and as many as fit: a breaker not closed, the adaptive limit, the time the workers
// waited for rate-limit tokens, a closed breaker (the controls table has them all).
func controlLine(s *stageJSON) string {
	var parts []string
	b := s.Breaker
	switch {
	case b != nil && b.PerKey && b.KeysOpen > 0:
		keys := "keys"
		if b.KeysOpen == 1 {
			keys = "key"
		}
		parts = append(parts, fmt.Sprintf("breaker %d %s %s, %s items held", b.KeysOpen, keys, b.State, count(b.Holding)))
	case b != nil && b.State != pipeline.BreakerClosed.String():
		parts = append(parts, fmt.Sprintf("breaker %s %s, %s held", b.State, seconds(b.Open), count(b.Held)))
	}
	if s.LimitHistory != nil {
		parts = append(parts, fmt.Sprintf("limit %d/%d", s.Limit, s.Workers))
	}
	if s.Throttled > 0 {
		parts = append(parts, "rate-limited "+seconds(s.Throttled))
	}
	if b != nil && b.State == pipeline.BreakerClosed.String() {
		parts = append(parts, "breaker closed")
	}
	line := ""
	for _, p := range parts {
		next := p
		if line != "" {
			next = line + " · " + p
		}
		if utf8.RuneCountInString(next) > maxControl && line != "" {
			break
		}
		line = next
	}
	return line
}

// errorName names an error type (a report's [pipeline.ErrorCount].Type or
// [pipeline.Cause].Type) in words: "timeout", "network error", "status error" for
// *main.statusError.
func errorName(typ string) string {
	switch typ {
	case "timeout", "error":
		return typ
	case "*pipeline.PanicError":
		return "panic"
	case "*pipeline.BreakerError":
		return "circuit breaker open"
	case "*pipeline.BudgetError":
		return "error budget exceeded"
	case "*pipeline.retryAfterError": // reports of v0.1 name RetryAfter's marker
		return "retry later (Retry-After)"
	case "*net.OpError":
		return "network error"
	case "*net.DNSError":
		return "DNS lookup failed"
	case "*url.Error":
		return "HTTP request failed"
	case "context.deadlineExceededError":
		return "deadline exceeded"
	case "*errors.errorString":
		return "error"
	case "*json.SyntaxError":
		return "malformed JSON"
	case "*json.UnmarshalTypeError":
		return "unexpected JSON"
	case "*pgconn.PgError":
		return "PostgreSQL error"
	}
	name := strings.TrimLeft(typ, "*[]")
	name = name[strings.LastIndexByte(name, '.')+1:]
	// The words of a Go name: statusError is "status error", HTTPError "HTTP error".
	var words []string
	rs := []rune(name)
	start := 0
	for i := 1; i <= len(rs); i++ {
		if i < len(rs) && !wordStart(rs, i) {
			continue
		}
		w := string(rs[start:i])
		if w != strings.ToUpper(w) || len(w) == 1 {
			w = strings.ToLower(w)
		}
		words = append(words, w)
		start = i
	}
	if len(words) == 0 {
		return typ
	}
	return strings.Join(words, " ")
}

// wordStart reports whether a word of a Go name starts at rs[i] (i > 0): an upper-case
// letter after a lower-case one (status|Error), or the last of a run of upper-case
// letters before a lower-case one (HTTP|Error).
func wordStart(rs []rune, i int) bool {
	if !unicode.IsUpper(rs[i]) {
		return false
	}
	return unicode.IsLower(rs[i-1]) || i+1 < len(rs) && unicode.IsLower(rs[i+1]) && unicode.IsUpper(rs[i-1])
}

// count formats n with thousands separators: 1,234,567.
func count(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// rate formats items per second, with a decimal below 10.
func rate(r float64) string {
	if r < 10 {
		return fmt.Sprintf("%.1f/s", r)
	}
	return count(int64(r+0.5)) + "/s"
}

// batchRate formats batches per second.
func batchRate(r float64) string {
	if r < 10 {
		return fmt.Sprintf("%.1f batches/s", r)
	}
	return count(int64(r+0.5)) + " batches/s"
}

// seconds formats a duration in seconds with three significant digits: 20.3ms, 850µs.
func seconds(s float64) string {
	d := time.Duration(s * 1e9)
	for _, unit := range []time.Duration{time.Hour, time.Minute, time.Second, time.Millisecond, time.Microsecond} {
		if d >= unit {
			if d >= 100*unit {
				return d.Round(unit).String()
			}
			return d.Round(unit / 100).String()
		}
	}
	return d.String()
}
