#!/usr/bin/env bash
# scripts/install-test.sh: installs every user-facing module the way a new user would,
# from a release published on this machine. Run by scripts/test.sh (so by .ci/run).
#
# It tests the commit at HEAD, not uncommitted work (a release can only be made of
# commits). In a temporary folder, it
#
#   1. clones the repository at HEAD, drops the clone's tags and runs
#      scripts/release.sh with a test version ($INSTALL_TEST_VERSION, by default
#      v0.0.0-installtest), which rewrites the nested modules' requirement of the root
#      to that version, commits and tags every user-facing module;
#   2. makes a bare clone of that: the "remote";
#   3. creates a fresh consumer module and, with GOPRIVATE=github.com/gopipeline/*
#      (our modules come straight from git, every other one through the usual GOPROXY),
#      a git config whose url.<bare>.insteadOf stands for https://github.com/gopipeline/pipeline,
#      GOFLAGS unset, GOWORK=off, no go env file and a module cache of its own,
#      runs `go get` of every package of every user-facing module at the test version;
#   4. checks that each module resolved to that version with no replacement, writes a
#      main.go that imports every package, and builds it.
#
# The module cache is temporary because the fake versions of github.com/gopipeline/*
# must not reach the shared one; third-party modules are downloaded into it again
# through GOPROXY (a few seconds). The build cache is shared (it is content-addressed).
# Every temporary file is removed on exit; any failure exits non-zero.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=$PWD
version=${INSTALL_TEST_VERSION:-v0.0.0-installtest}
repo_url=https://github.com/gopipeline/pipeline

say() { printf 'install-test: %s\n' "$*"; }
die() {
	printf 'install-test: FAIL: %s\n' "$*" >&2
	exit 1
}

head=$(git rev-parse HEAD) || die "not a git checkout"
if [[ -n $(git status --porcelain) ]]; then
	say "note: uncommitted changes are not tested (only HEAD, $(git rev-parse --short HEAD), is)"
fi

# The Go settings of the consumer: the user's proxy, checksum database, toolchain and
# build cache, nothing else of theirs.
goproxy=$(go env GOPROXY)
gosumdb=$(go env GOSUMDB)
gotoolchain=$(go env GOTOOLCHAIN)
gocache=$(go env GOCACHE)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipeline-install-test.XXXXXX")
cleanup() {
	# The module cache is read-only.
	chmod -R u+w "$tmp" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

# git: a configuration of its own (no user or system file), with an identity for the
# release commit and tags, and the rewrite of the GitHub URL to the local remote.
export GIT_CONFIG_GLOBAL=$tmp/gitconfig GIT_CONFIG_NOSYSTEM=1
export GIT_AUTHOR_NAME="install test" GIT_AUTHOR_EMAIL=install-test@localhost
export GIT_COMMITTER_NAME="install test" GIT_COMMITTER_EMAIL=install-test@localhost
git config --global safe.directory '*'
git config --global protocol.file.allow always
git config --global init.defaultBranch main
git config --global advice.detachedHead false
git config --global url."file://$tmp/remote.git".insteadOf "$repo_url"

# 1. The release, made of HEAD.
say "releasing $(git rev-parse --short HEAD) as $version"
git clone -q --no-checkout "$src" "$tmp/repo"
git -C "$tmp/repo" fetch -q "$src" HEAD
git -C "$tmp/repo" checkout -q --detach FETCH_HEAD
[[ $(git -C "$tmp/repo" rev-parse HEAD) == "$head" ]] || die "the clone is not at HEAD ($head)"
mapfile -t old_tags < <(git -C "$tmp/repo" tag -l)
if ((${#old_tags[@]})); then
	git -C "$tmp/repo" tag -d "${old_tags[@]}" >/dev/null
fi
(cd "$tmp/repo" && scripts/release.sh "$version") || die "scripts/release.sh $version failed"

# 2. The remote.
git clone -q --bare "$tmp/repo" "$tmp/remote.git"

# 3. What to install: every user-facing module and every package in it that a user
# can import (not internal, not a command).
mapfile -t mods < <(cd "$tmp/repo" && scripts/release.sh --list)
((${#mods[@]})) || die "scripts/release.sh --list found no module"
declare -A mod_pkgs=()
mod_paths=()
for m in "${mods[@]}"; do
	path=$(GOWORK=off go -C "$tmp/repo/$m" list -m)
	mod_paths+=("$path")
	mod_pkgs[$path]=$(
		GOWORK=off go -C "$tmp/repo/$m" list -f '{{if ne .Name "main"}}{{.ImportPath}}{{end}}' ./... |
			grep -Ev '(^|/)internal(/|$)' || true
	)
	[[ -n ${mod_pkgs[$path]} ]] || die "$path has no importable package"
done
say "modules: ${mod_paths[*]}"

# The consumer's environment: GOENV=off ignores the user's go env file, so that unset
# means the default.
consumer_env=(
	env -u GONOPROXY -u GONOSUMDB -u GOINSECURE -u GOVCS -u GOEXPERIMENT
	GOENV=off GOWORK=off GOFLAGS=
	GOPRIVATE='github.com/gopipeline/*'
	GOPROXY="$goproxy" GOSUMDB="$gosumdb" GOTOOLCHAIN="$gotoolchain"
	GOCACHE="$gocache" GOPATH="$tmp/gopath" GOMODCACHE="$tmp/modcache"
)

# consume NAME PATH...: in a fresh consumer module, go get the packages PATH... at the
# test version, check that every module of ours it ends up with is at that version and
# not replaced, and build (and run) a main.go that imports each package.
consume() {
	local name=$1 c p got list
	shift
	c=$(mktemp -d "$tmp/consumer-$name.XXXX")
	(
		cd "$c"
		"${consumer_env[@]}" go mod init example.com/installtest 2>/dev/null
		"${consumer_env[@]}" go get "${@/%/@$version}" ||
			die "$name: go get ${*/%/@$version} failed"
		list=$("${consumer_env[@]}" go list -m -f '{{.Path}} {{.Version}}{{with .Replace}}=>{{.Path}}@{{.Version}}{{end}}' all) ||
			die "$name: go list -m all failed"
		while read -r p got; do
			[[ $got == "$version" ]] || die "$name: $p resolved to $got, want $version"
			say "$name:   $p $got"
		done < <(grep -E '^github\.com/gopipeline/' <<<"$list")
		{
			echo '// Command installtest imports every package of the released modules.'
			echo 'package main'
			echo
			echo 'import ('
			printf '\t_ "%s"\n' "$@"
			echo ')'
			echo
			echo 'func main() {}'
		} >main.go
		"${consumer_env[@]}" go build -o installtest . || die "$name: the consumer does not build"
		./installtest || die "$name: the consumer does not run"
	)
}

# 4. One consumer per module, which gets that module alone (as a user adding only the
# Prometheus exporter would), then one that gets them all together.
all=()
for p in "${mod_paths[@]}"; do
	mapfile -t pkgs <<<"${mod_pkgs[$p]}"
	all+=("${pkgs[@]}")
	consume "${p##*/}" "${pkgs[@]}"
done
consume all "${all[@]}"
say "ok: ${#all[@]} packages of ${#mod_paths[@]} modules installed with go get at $version and built"
