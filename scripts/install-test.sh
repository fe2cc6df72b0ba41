#!/usr/bin/env bash
# scripts/install-test.sh: installs every library module and runs every command module
# the way a new user would, from a release published on this machine through a module
# proxy of its own. Run by scripts/test.sh (so by .ci/run). Nothing of ours is fetched
# from beyond this machine: the release is served by a GOPROXY=file:// folder, and only
# the third-party modules come through the usual GOPROXY.
#
# It tests the commit at HEAD, not uncommitted work (a release can only be made of
# commits). In a temporary folder, it
#
#   1. clones the repository at HEAD, drops the clone's tags and runs
#      scripts/release.sh with a test version ($INSTALL_TEST_VERSION, by default
#      v0.0.0-installtest), which rewrites the nested modules' requirements of our
#      modules to that version, drops the command modules' replaces, commits and tags
#      every module;
#   2. makes a bare clone of that, the "remote", and publishes the release the way a
#      module proxy does: `go mod download` of every tagged module from the remote
#      (GOPRIVATE, a git url.<bare>.insteadOf for https://github.com/gopipeline/pipeline,
#      a module cache of its own), whose cache/download folder is a module proxy's layout;
#   3. creates fresh consumer modules and, with GOPROXY=file://<that folder>,<usual
#      GOPROXY>, GONOSUMDB=github.com/gopipeline/* (the checksum database does not know
#      the test version), no git configuration, GOFLAGS unset, GOWORK=off, no go env file
#      and a module cache of its own, runs `go get` of every package of every library
#      module at the test version, checks that each of our modules resolved to it with
#      no replacement, and builds and runs a main.go that imports every package;
#   4. from a folder outside any module, runs every command module as the README says,
#      `go run github.com/gopipeline/pipeline/examples/etl@<version>` (a short run of
#      it, its output in the temporary folder), and checks with `go version -m` that
#      its build used our modules at that version, none replaced.
#
# The module caches are temporary because the fake versions of github.com/gopipeline/*
# must not reach the shared one; third-party modules are downloaded into the consumers'
# cache again through GOPROXY (a few seconds). The build cache is shared (it is
# content-addressed). Every temporary file is removed on exit; any failure exits
# non-zero.
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

# 2. The remote, and the release published from it into a module proxy's folder.
git clone -q --bare "$tmp/repo" "$tmp/remote.git"

list=$(cd "$tmp/repo" && scripts/release.sh --list) || die "scripts/release.sh --list failed"
mapfile -t mods <<<"$list"
[[ -n $list ]] || die "scripts/release.sh --list found no module"
list=$(cd "$tmp/repo" && scripts/release.sh --commands) || die "scripts/release.sh --commands failed"
cmds=()
[[ -z $list ]] || mapfile -t cmds <<<"$list"
declare -A mod_path=()
for m in "${mods[@]}" "${cmds[@]}"; do
	mod_path[$m]=$(GOWORK=off go -C "$tmp/repo/$m" list -m)
done

proxy=$tmp/publish/cache/download
say "publishing ${#mod_path[@]} modules at $version into file://$proxy"
(
	cd "$tmp"
	for m in "${mods[@]}" "${cmds[@]}"; do
		env -u GONOPROXY -u GONOSUMDB -u GOINSECURE -u GOVCS -u GOEXPERIMENT \
			GOENV=off GOWORK=off GOFLAGS= GOPRIVATE='github.com/gopipeline/*' \
			GOTOOLCHAIN="$(go env GOTOOLCHAIN)" GOPATH="$tmp/publish-gopath" GOMODCACHE="$tmp/publish" \
			go mod download "${mod_path[$m]}@$version" >"$tmp/download.out" 2>&1 ||
			die "go mod download ${mod_path[$m]}@$version from the remote failed:$(printf '\n'; tail -20 "$tmp/download.out")"
		[[ -s $proxy/${mod_path[$m]}/@v/$version.zip ]] || die "no zip of ${mod_path[$m]}@$version in the proxy folder"
	done
)

# 3. What to install: every library module and every package in it that a user can
# import (not internal, not a command).
declare -A mod_pkgs=()
mod_paths=()
for m in "${mods[@]}"; do
	path=${mod_path[$m]}
	mod_paths+=("$path")
	mod_pkgs[$path]=$(
		GOWORK=off go -C "$tmp/repo/$m" list -f '{{if ne .Name "main"}}{{.ImportPath}}{{end}}' ./... |
			grep -Ev '(^|/)internal(/|$)' || true
	)
	[[ -n ${mod_pkgs[$path]} ]] || die "$path has no importable package"
done
say "modules: ${mod_paths[*]}"

# The consumer's environment: GOENV=off ignores the user's go env file, so that unset
# means the default; an empty git configuration, so that nothing of ours can come from
# git: only from the proxy folder.
: >"$tmp/consumer-gitconfig"
consumer_env=(
	env -u GONOPROXY -u GOPRIVATE -u GOINSECURE -u GOVCS -u GOEXPERIMENT
	GIT_CONFIG_GLOBAL="$tmp/consumer-gitconfig"
	GOENV=off GOWORK=off GOFLAGS=
	GOPROXY="file://$proxy,$goproxy" GONOSUMDB='github.com/gopipeline/*'
	GOSUMDB="$gosumdb" GOTOOLCHAIN="$gotoolchain"
	GOCACHE="$gocache" GOPATH="$tmp/gopath" GOMODCACHE="$tmp/modcache"
)

# check_ours NAME LIST: checks that every module of ours in LIST (lines of "path
# version[=>replacement]") is at the test version and not replaced.
check_ours() {
	local name=$1 p got
	while read -r p got; do
		[[ $got == "$version" ]] || die "$name: $p resolved to $got, want $version"
		say "$name:   $p $got"
	done < <(grep -E '^github\.com/gopipeline/' <<<"$2")
}

# consume NAME PATH...: in a fresh consumer module, go get the packages PATH... at the
# test version, check that every module of ours it ends up with is at that version and
# not replaced, and build (and run) a main.go that imports each package.
consume() {
	local name=$1 c list
	shift
	c=$(mktemp -d "$tmp/consumer-$name.XXXX")
	(
		cd "$c"
		"${consumer_env[@]}" go mod init example.com/installtest 2>/dev/null
		"${consumer_env[@]}" go get "${@/%/@$version}" ||
			die "$name: go get ${*/%/@$version} failed"
		list=$("${consumer_env[@]}" go list -m -f '{{.Path}} {{.Version}}{{with .Replace}}=>{{.Path}}@{{.Version}}{{end}}' all) ||
			die "$name: go list -m all failed"
		check_ours "$name" "$list"
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

# One consumer per module, which gets that module alone (as a user adding only the
# Prometheus exporter would), then one that gets them all together.
all=()
for p in "${mod_paths[@]}"; do
	mapfile -t pkgs <<<"${mod_pkgs[$p]}"
	all+=("${pkgs[@]}")
	consume "${p##*/}" "${pkgs[@]}"
done
consume all "${all[@]}"
say "ok: ${#all[@]} packages of ${#mod_paths[@]} modules installed with go get at $version and built"

# 4. The commands, run with go run …@version from a folder outside any module. Each
# gets the arguments of a short run; a new command module needs an entry here.
declare -A cmd_args=(
	[examples/etl]="-fresh -n 300 -web= -progress 1h -dir $tmp/etl-out"
	[examples/windows]="-fresh -n 2000"
)
# examples/windows writes into PostgreSQL: the server of $DATABASE_URL (test.sh's), or a
# throwaway one of the repository's script, stopped at exit.
if [[ -z ${DATABASE_URL:-} ]]; then
	root=$(git rev-parse --show-toplevel)
	DATABASE_URL=$("$root/scripts/postgres.sh" start) || die "no DATABASE_URL, and scripts/postgres.sh start failed"
	export DATABASE_URL
	trap '"$root/scripts/postgres.sh" stop >/dev/null; cleanup' EXIT
fi
elsewhere=$tmp/elsewhere
mkdir -p "$elsewhere"
for m in "${cmds[@]}"; do
	path=${mod_path[$m]}
	[[ -n ${cmd_args[$m]+set} ]] || die "$m: no arguments for a short run in install-test.sh's cmd_args"
	read -r -a args <<<"${cmd_args[$m]}"
	(
		cd "$elsewhere"
		"${consumer_env[@]}" go run "$path@$version" "${args[@]}" >"$tmp/run.out" 2>&1 ||
			die "go run $path@$version ${args[*]} failed:$(printf '\n'; tail -20 "$tmp/run.out")"
		"${consumer_env[@]}" GOBIN="$tmp/bin" go install "$path@$version" ||
			die "go install $path@$version failed"
		list=$(go version -m "$tmp/bin/${path##*/}" | awk '$1 == "dep" { print $2, $3 } $1 == "=>" { print "replaced", $2 }') ||
			die "go version -m of $path failed"
		! grep -q '^replaced' <<<"$list" || die "$path@$version was built with a replaced module:$(printf '\n%s' "$list")"
		check_ours "${path##*/}" "$list"
	)
	say "ok: go run $path@$version ${args[*]} (from a folder outside any module): $(grep -c . "$tmp/run.out") lines of output"
done
