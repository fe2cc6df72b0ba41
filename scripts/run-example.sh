#!/usr/bin/env bash
# scripts/run-example.sh: the project's main job, the etl example (examples/etl): 10,000
# records read from a checkpointed source, enriched by an HTTP service that the example
# starts on loopback (slow, flaky: 429/503 with Retry-After, 404, malformed bodies,
# calls that hang), batched and written to a JSON Lines file, with live progress, a live
# web view and the final report. Run it again to resume where it stopped; flags are
# passed on (-h lists them; -fresh starts over, -dir sets the output folder, by default
# $TMPDIR/pipeline-etl). It needs no set-up: nothing to install, no network.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../examples/etl"
# The example is a module of its own: build it without go.work, as users do.
export GOWORK=off
exec go run . "$@"
