module github.com/gopipeline/pipeline/dashboard/internal/browsertest

go 1.26.0

replace github.com/gopipeline/pipeline => ../../../

require (
	github.com/chromedp/chromedp v0.23.1
	github.com/gopipeline/pipeline v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/chromedp/cdproto v0.160.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260214004413-d219187c3433 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)
