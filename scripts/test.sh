#!/usr/bin/env bash
# scripts/test.sh: the test command of the project, run by CI (.ci/run) and by hand.
#
# For every Go module of the repository (the root, bench/, any nested connector module)
# it runs, in the module's folder:
#
#   go vet ./...                 go build ./...
#   go mod tidy -diff            go test -race -shuffle=on -count=2 -cpu=1,4 ./...
#   go fix -diff ./...           gofmt -l                golangci-lint run ./...
#
# then smoke-runs each benchmark of bench/ once, and runs scripts/install-test.sh: every
# module released from HEAD and served by a local module proxy, each library installed
# with go get into a fresh module and built, and examples/etl run with go run …@tag, as
# a new user would. It needs only Go, git and bash: it
# installs the pinned golangci-lint itself, and Debian's chromium package for the
# dashboard's browser test (dashboard/internal/browsertest) when chromium is missing.
# Before the tests it starts a throwaway PostgreSQL cluster (scripts/postgres.sh) for the
# postgres/ connector, the example and S6, exports its URL as DATABASE_URL and stops it
# at exit; with DATABASE_URL already set, it uses that server instead. Every step runs
# even after one fails, so that one run shows every problem; the script exits 1 if any
# step failed, and ends with the time each step took.
#
# Each module is tested on its own (GOWORK=off), against its own go.mod, as its users
# build it; go.work, when there is one, is only checked to load, to use every module and
# to come with a complete go.work.sum (so that go doc, go vet, go list -m all or
# go mod download in the workspace leave the committed file as it is).
set -euo pipefail

# The golangci-lint release to use (a v2 release that builds with Go 1.26).
GOLANGCI_LINT_VERSION=v2.15.0

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
export GOWORK=off

# --- steps and their timing ------------------------------------------------------------

summary=()
failed=()

now_us() {
	if [[ -n ${EPOCHREALTIME:-} ]]; then
		echo "${EPOCHREALTIME//[.,]/}"
	else
		echo $(($(date +%s%N) / 1000))
	fi
}

# step LABEL COMMAND...: runs COMMAND, prints how long it took and records the result.
# COMMAND runs in the condition of an `if`, where bash ignores set -e: a shell function
# given here must return non-zero itself when it fails (each one below does).
step() {
	local label=$1 t0 us status=ok
	shift
	printf '\n==> %s\n' "$label"
	t0=$(now_us)
	if ! "$@"; then
		status=FAIL
		failed+=("$label")
	fi
	us=$(($(now_us) - t0))
	summary+=("$(printf '%-44s %7d.%01ds  %s' "$label" $((us / 1000000)) $((us % 1000000 / 100000)) "$status")")
	printf '<== %s: %d.%01ds %s\n' "$label" $((us / 1000000)) $((us % 1000000 / 100000)) "$status"
}

print_summary() {
	local total_us=$(($(now_us) - start_us))
	printf '\n==> timing\n'
	printf '%s\n' "${summary[@]}"
	printf '%-44s %7ds\n' total $((total_us / 1000000))
}

# --- modules ---------------------------------------------------------------------------

# modules prints the folder of every Go module in the repository, the root first:
# tracked and untracked (but not ignored) go.mod files, or all of them outside git.
# Modules under testdata/ are test inputs, not modules of ours.
modules() {
	local list
	if ! list=$(git ls-files --cached --others --exclude-standard -- 'go.mod' '*/go.mod' 2>/dev/null) || [[ -z $list ]]; then
		list=$(find . \( -name .git -o -name vendor \) -prune -o -name go.mod -type f -print | sed 's|^\./||')
	fi
	printf '%s\n' "$list" |
		grep -Ev '(^|/)(testdata|vendor)/' |
		while read -r f; do if [[ -f $f ]]; then dirname "$f"; fi; done |
		sort -u |
		awk '$0 == "." { print; next } { rest[n++] = $0 } END { for (i = 0; i < n; i++) print rest[i] }'
}

# module_go_files prints the .go files of the module in the current folder: not those of
# nested modules, testdata/, vendor/ or folders the go tool ignores (_x, .x).
module_go_files() {
	find . \( -name testdata -o -name vendor -o -name '[._]?*' \) -prune \
		-o -type d ! -name . -exec test -e '{}/go.mod' \; -prune \
		-o -type f -name '*.go' -print
}

# --- checks ----------------------------------------------------------------------------

# check_fix fails when `go fix` (Go 1.26's modernizers) would change the code.
check_fix() {
	local out rc=0
	out=$(go fix -diff ./...) || rc=$? # the diff is on stdout; errors go to stderr
	if [[ -n $out ]]; then
		printf '%s\n' "$out"
		echo "go fix would change the code above: run 'go fix ./...' in the module's folder ($m)"
		return 1
	fi
	return "$rc"
}

# check_gofmt fails when some file of the module is not gofmt-ed.
check_gofmt() {
	local files=() out
	mapfile -t files < <(module_go_files)
	((${#files[@]})) || return 0
	out=$(gofmt -l -- "${files[@]}") || return 1
	if [[ -n $out ]]; then
		printf '%s\n' "$out"
		echo "these files (in $m) are not gofmt-ed: run 'gofmt -w' on them"
		return 1
	fi
}

# check_workspace fails when go.work does not load, or leaves out a module.
check_workspace() {
	local used missing=0 m
	used=$(GOWORK="$root/go.work" go list -m -f '{{.Dir}}' | while read -r d; do (cd "$d" && pwd -P); done) || return 1
	for m in "${mods[@]}"; do
		if ! grep -qxF "$(cd "$m" && pwd -P)" <<<"$used"; then
			echo "go.work does not use the module in $m: run 'go work use $m'"
			missing=1
		fi
	done
	return "$missing"
}

# check_work_sum fails when go.work.sum lacks checksums that the workspace needs, so
# that an ordinary command (go doc ., go vet, go list -m all, go mod download) in the
# repository would rewrite it and leave a clean checkout dirty. It restores the
# committed file either way and prints what was missing.
check_work_sum() {
	local saved had=0 rc=0
	saved=$(mktemp) || return 1
	if [[ -f go.work.sum ]]; then
		cp go.work.sum "$saved"
		had=1
	fi
	GOWORK="$root/go.work" go mod download all &&
		GOWORK="$root/go.work" go list -m all >/dev/null &&
		GOWORK="$root/go.work" go list -deps -test all >/dev/null || rc=1
	if [[ -f go.work.sum ]] && { ((!had)) || ! cmp -s "$saved" go.work.sum; }; then
		diff -u "$saved" go.work.sum || true
		echo "go.work.sum lacks the checksums above: run 'go mod download all' in $root and commit go.work.sum"
		rc=1
	fi
	if ((had)); then cp "$saved" go.work.sum; else rm -f go.work.sum; fi
	rm -f "$saved"
	return "$rc"
}

# --- golangci-lint ---------------------------------------------------------------------

gopath=$(go env GOPATH)
lint_bin=${GOLANGCI_LINT_BIN:-${gopath%%:*}/bin}
lint=$lint_bin/golangci-lint

# install_lint installs the pinned golangci-lint into $lint_bin, unless the one there is
# that version built with this Go release (a linter built with an older Go cannot load
# code that needs a newer one).
install_lint() {
	local info go_minor
	go_minor=$(go env GOVERSION | grep -Eo '^go[0-9]+\.[0-9]+')
	if [[ -x $lint ]] && info=$(go version -m "$lint" 2>/dev/null) &&
		grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/golangci/golangci-lint/v2[[:space:]]+${GOLANGCI_LINT_VERSION}([[:space:]]|$)" <<<"$info" &&
		grep -Eq "^[^[:space:]]+: ${go_minor}([.]|[[:space:]]|$)" <<<"$info"; then
		echo "golangci-lint $GOLANGCI_LINT_VERSION is already in $lint_bin"
		return 0
	fi
	echo "installing golangci-lint $GOLANGCI_LINT_VERSION into $lint_bin"
	GOBIN=$lint_bin go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
}

# --- Chromium, for the dashboard's browser test ----------------------------------------

# ensure_chromium installs Debian's chromium package when /usr/bin/chromium is missing.
# Without apt-get as root it only says so: the browser test then skips, or fails when
# CI=true. --no-install-recommends keeps out what a headless test never uses (a printer
# dialog, a notification daemon, ...); fonts-liberation gives the page its sans font.
ensure_chromium() {
	if [[ -x /usr/bin/chromium ]]; then
		echo "chromium is already in /usr/bin"
		return 0
	fi
	if ! command -v apt-get >/dev/null || ((EUID != 0)); then
		echo "no /usr/bin/chromium, and no apt-get as root to install it: the browser test will skip (or fail with CI=true)"
		return 0
	fi
	echo "installing Debian's chromium package"
	apt-get update -qq &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation
}

# --- main ------------------------------------------------------------------------------

start_us=$(now_us)
mapfile -t mods < <(modules)
if ((${#mods[@]} == 0)); then
	echo "no go.mod found under $root" >&2
	exit 1
fi
echo "modules: ${mods[*]}"

step "install golangci-lint $GOLANGCI_LINT_VERSION" install_lint
lint_ok=$((${#failed[@]} == 0))

if [[ -f dashboard/internal/browsertest/go.mod ]]; then
	step "chromium" ensure_chromium
fi

# start_postgres starts the cluster the connector's tests and S6 use (see the top).
start_postgres() {
	if [[ -n ${DATABASE_URL:-} ]]; then
		echo "using DATABASE_URL from the environment"
		return 0
	fi
	trap '"$root/scripts/postgres.sh" stop' EXIT
	DATABASE_URL=$("$root/scripts/postgres.sh" start) || return 1
	export DATABASE_URL PGPIPE_SERVER_SCRIPT="$root/scripts/postgres.sh"
	echo "DATABASE_URL=$DATABASE_URL"
}
step "postgres: start" start_postgres

if [[ -f go.work ]]; then
	step "go.work" check_workspace
	step "go.work.sum complete" check_work_sum
fi

for m in "${mods[@]}"; do
	cd "$root/$m"
	name=$m
	[[ $m != . ]] || name=root
	step "$name: go vet" go vet ./...
	step "$name: go mod tidy -diff" go mod tidy -diff
	step "$name: go build" go build ./...
	step "$name: go test -race" go test -race -shuffle=on -count=2 -cpu=1,4 -timeout=20m ./...
	step "$name: go fix -diff" check_fix
	step "$name: gofmt -l" check_gofmt
	if ((lint_ok)); then
		step "$name: golangci-lint" "$lint" run --allow-parallel-runners --config "$root/.golangci.yml" ./...
	fi
done
cd "$root"

# The benchmarks are too slow to measure here; run each once so that they stay working.
if [[ -f bench/go.mod ]]; then
	step "bench: benchmarks, once each" go -C bench test -run='^$' -bench=. -benchtime=1x ./...
elif [[ -d bench ]]; then
	step "bench: benchmarks, once each" go test -run='^$' -bench=. -benchtime=1x ./bench/...
fi

# A new user's install: every module released (on this machine) from HEAD, then fetched
# through a local module proxy with go get into a fresh module and built, and the main
# job run with go run …@tag. See scripts/install-test.sh.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	step "install test: go get and go run at a local tag" scripts/install-test.sh
else
	printf '\n==> install test: skipped (not a git checkout: no commit to release)\n'
fi

print_summary
if ((${#failed[@]})); then
	printf '\nFAILED:\n'
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
printf '\nall checks passed\n'
