package dashboard

import (
	"embed"
	"html/template"
	"math"
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

func hasErrors(d pipelineJSON) bool {
	for _, s := range d.Stages {
		if len(s.Errors) > 0 {
			return true
		}
	}
	return false
}

func hasControls(d pipelineJSON) bool {
	for _, s := range d.Stages {
		if s.Breaker != nil || s.LimitHistory != nil || s.Throttled > 0 {
			return true
		}
	}
	return false
}

func hasCounters(d pipelineJSON) bool {
	for _, s := range d.Stages {
		if len(s.Counters) > 0 {
			return true
		}
	}
	return false
}

func hasLag(d pipelineJSON) bool {
	for _, s := range d.Stages {
		if s.Lag != nil {
			return true
		}
	}
	return false
}

func hasCauses(d pipelineJSON) bool {
	for _, s := range d.Stages {
		if len(s.Causes) > 0 {
			return true
		}
	}
	return false
}
