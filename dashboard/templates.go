package dashboard

import (
	"embed"
	"html/template"
	"time"
)

//go:embed page.html
var assets embed.FS

var (
	templates = template.Must(template.New("").Funcs(template.FuncMap{
		"count":   count,
		"rate":    rate,
		"secs":    seconds,
		"clock":   func(t time.Time) string { return t.UTC().Format("15:04:05 UTC") },
		"rfc3339": func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
		"deref":   func(p *int64) int64 { return *p },
		"causes":  hasCauses,
	}).ParseFS(assets, "page.html"))
	pageTemplate = templates.Lookup("page")
	viewTemplate = templates.Lookup("view")
)

func hasCauses(d pipelineJSON) bool {
	for _, s := range d.Stages {
		if len(s.Causes) > 0 {
			return true
		}
	}
	return false
}
