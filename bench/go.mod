module github.com/gopipeline/pipeline/bench

go 1.26.0

replace github.com/gopipeline/pipeline => ../

replace github.com/gopipeline/pipeline/postgres => ../postgres

require (
	github.com/gopipeline/pipeline v0.1.0
	github.com/gopipeline/pipeline/postgres v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.12.0
	github.com/sourcegraph/conc v0.3.0
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.25.0
	golang.org/x/time v0.16.0
)

require (
	github.com/jackc/pgerrcode v0.0.0-20250907135507-afb5586c32a6 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.7.0 // indirect
	go.uber.org/multierr v1.9.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
