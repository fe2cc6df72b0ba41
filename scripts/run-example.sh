#!/usr/bin/env bash
# scripts/run-example.sh: the project's main job, the etl example (examples/etl): 10,000
# records read from a checkpointed source, enriched by an HTTP service that the example
# starts on loopback (slow, flaky: 429/503 with Retry-After, 404, malformed bodies,
# calls that hang), batched and written to a JSON Lines file, with live progress, a live
# web view and the final report. Its output, dead letters, checkpoint and job.json (the
# job's -n) go to -dir, by default $TMPDIR/pipeline-etl. Run it again to resume where it
# stopped, with the same -n; a job already done says so. Flags are passed on (-h lists
# them; -fresh starts over, -n sets the records, -dir the folder, -db writes into
# PostgreSQL instead). It needs no set-up: nothing to install, no network.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../examples/etl"
# The example is a module of its own: build it without go.work, as users do.
export GOWORK=off
exec go run . "$@"
