package dashboard

import (
	"embed"
	"html/template"
	"math"
	"slices"
	"strconv"
	"time"
)

//go:embed page.html
var assets embed.FS

var (
	templates = template.Must(template.New("").Funcs(template.FuncMap{
		"count":     count,
		"rate":      rate,
		"secs":      seconds,
		"clock":     func(t time.Time) string { return t.UTC().Format("15:04:05 UTC") },
		"rfc3339":   func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
		"deref":     func(p *int64) int64 { return *p },
		"causes":    hasCauses,
		"errors":    hasErrors,
		"controls":  hasControls,
		"counters":  hasCounters,
		"lags":      hasLag,
		"lagTitle":  lagTitle,
		"countLine": countersLine,
		"batchRate": batchRate,
		"pct":       func(f float64) string { return strconv.FormatFloat(math.Floor(f*1000)/10, 'f', -1, 64) },
		"last":      func(h []limitJSON) limitJSON { return h[len(h)-1] },
	}).ParseFS(assets, "page.html"))
	pageTemplate = templates.Lookup("page")
	viewTemplate = templates.Lookup("view")
)

// anyStage reports whether a stage of d has what has tells: the page shows a section
// only for a pipeline some of whose stages have something in it.
func anyStage(has func(stageJSON) bool) func(pipelineJSON) bool {
	return func(d pipelineJSON) bool { return slices.ContainsFunc(d.Stages, has) }
}

var (
	hasErrors   = anyStage(func(s stageJSON) bool { return len(s.Errors) > 0 })
	hasControls = anyStage(func(s stageJSON) bool { return s.Breaker != nil || s.LimitHistory != nil || s.Throttled > 0 })
	hasCounters = anyStage(func(s stageJSON) bool { return len(s.Counters) > 0 })
	hasLag      = anyStage(func(s stageJSON) bool { return s.Lag != nil })
	hasCauses   = anyStage(func(s stageJSON) bool { return len(s.Causes) > 0 })
)
