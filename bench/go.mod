module github.com/gopipeline/pipeline/bench

go 1.26.0

replace github.com/gopipeline/pipeline => ../

require (
	github.com/gopipeline/pipeline v0.0.0-00010101000000-000000000000
	github.com/sourcegraph/conc v0.3.0
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.25.0
	golang.org/x/time v0.16.0
)

require (
	go.uber.org/atomic v1.7.0 // indirect
	go.uber.org/multierr v1.9.0 // indirect
)
