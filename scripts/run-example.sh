#!/usr/bin/env bash
# scripts/run-example.sh: the project's "main job", the enrich example: 10,000 generated
# records through parse → enrich (a simulated flaky service) → store. Flags are passed
# on (-n, -workers, -seed, -out, -deadletters). It needs no set-up: no network, no
# server; its output and dead letters go to temporary files unless given.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The example needs only the root module: build it without go.work, as users do.
export GOWORK=off
exec go run ./examples/enrich "$@"
