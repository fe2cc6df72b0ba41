module github.com/gopipeline/pipeline/examples/etl

go 1.26.0

require (
	github.com/gopipeline/pipeline v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)

replace github.com/gopipeline/pipeline => ../../
