// Package bench holds the end-to-end benchmarks of github.com/gopipeline/pipeline: the
// scenarios S1 to S8 (each described at its benchmark), written through the library's
// public API exactly as a user would write them, beside hand-written baselines (goroutines, bounded
// channels and errgroup) and the peer library github.com/sourcegraph/conc. It is a
// nested module, so that the core module never depends on conc; the go.work at the
// repository root ties the two together, and the replace directive in go.mod makes the
// module work with GOWORK=off too. The package has no code of its own: everything is in
// its _test.go files.
//
// # Running
//
// A smoke run (one iteration of everything, as CI does; counts are asserted, so it
// fails when the library drops, double-counts or misfiles an item):
//
//	cd bench
//	go test -run='^$' -bench=. -benchtime=1x
//	go test -run='^$' -bench=. -benchtime=1x -race
//
// A comparison between two versions of the library (check out the old one, then the
// new one; benchstat prints the medians and whether the change is significant):
//
//	go test -run='^$' -bench=. -count=10 | tee old.txt
//	go test -run='^$' -bench=. -count=10 | tee new.txt
//	benchstat old.txt new.txt
//
// The scenarios S1 to S4 last seconds per iteration (their stages sleep); run them with
// -benchtime=1x and a -count of 3 to 10. S5 measures the library's own cost per item
// and wants the default -benchtime. Slice the output with benchstat's options, for
// example the S5 overhead of each implementation side by side:
//
//	go test -run='^$' -bench=S5 -count=10 | tee s5.txt
//	benchstat -col /impl s5.txt
//
// On a shared machine whose speed changes for tens of seconds at a time, run the whole
// benchmark several times with -count=1 instead, so that every column's samples fall
// in the same moments (bench/results/s5-runs.txt was made so):
//
//	for i in $(seq 10); do go test -run='^$' -bench=S5Overhead -count=1; done | tee s5.txt
//
// Vary the number of CPUs with -cpu=1,2,4; the benchmarks never set GOMAXPROCS.
//
// S6 writes into PostgreSQL through the postgres/ connector and needs DATABASE_URL:
//
//	export DATABASE_URL=$(../scripts/postgres.sh start)
//	go test -run='^$' -bench=S6 -count=5 | tee s6.txt
//	benchstat -filter .unit:rows/s s6.txt
//
// Without DATABASE_URL it skips (with CI=true it fails).
//
// # Figures
//
// Each scenario reports its figures with b.ReportMetric, in fixed units (processed,
// deadlettered, lost, wall-s, items/s,
// peak-heap-KiB, ns/item, allocs/item, ...); when an iteration runs more than once,
// a figure is the mean over the iterations. Counts are checked on every iteration with
// b.Fatalf, wall times never are. "lost" is the number of items given to a pipeline
// that no part of its Report accounts for; it must be 0.
//
// The failing items come from testdata/items.json (the project's fixture of failing
// items), generated with SplitMix64; TestFixtures checks the file against a Go port of the
// generator.
//
// Peak heap figures are live memory: during a second, untimed run of the same pipeline,
// a sampler collects garbage every 5 ms and reads the runtime/metrics value
// /gc/heap/live:bytes, and the figure is the largest value less the live heap before
// the run. Without the collections a small heap holds up to Go's 4 MiB minimum heap goal
// of garbage whatever the queues hold; the seeds measured Python's traced memory, which
// is freed at once. Throughput and wall times come from the first run, which nothing
// watches.
package bench
