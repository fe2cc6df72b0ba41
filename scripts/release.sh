#!/usr/bin/env bash
# scripts/release.sh VERSION: prepares and tags a release of every user-facing module.
#
#   scripts/release.sh v0.1.0        tag the release (VERSION is vMAJOR.MINOR.PATCH[-pre])
#   scripts/release.sh --list        print the folder of every library module, root first
#   scripts/release.sh --commands    print the folder of every command module (examples/)
#
# The repository holds several Go modules: the root (github.com/gopipeline/pipeline),
# nested libraries (prometheus/, otel/, the connectors), which import the root, and
# command modules under examples/ (examples/etl), which a user runs with
# `go run github.com/gopipeline/pipeline/examples/etl@VERSION` from any folder. A user's
# build ignores a library's `replace github.com/gopipeline/pipeline => ../`, so each
# nested module must require a real release of the modules of this repository it uses:
# the ones it ships with. And `go run …@VERSION` refuses a module whose go.mod has any
# replace directive, so a command module is tagged without its replaces. For VERSION,
# this script
#
#   1. checks that the working tree is clean and that none of the tags exists yet;
#   2. sets, in every nested module (libraries and commands), each requirement of an
#      in-repository module to VERSION; drops, in every command module, each replace of
#      an in-repository module (it refuses a command module with any other replace, or
#      one that requires an in-repository module that is not released); and commits
#      that, if it changed anything: the release commit;
#   3. creates an annotated tag per module on the release commit: VERSION for the root
#      and <folder>/VERSION for each nested one (prometheus/v0.1.0,
#      examples/etl/v0.1.0, ...), the names the go command looks for;
#   4. if it dropped replaces, commits them back on top (the requirements stay at
#      VERSION), so that the command modules build against this repository again, as
#      the libraries do with their replace.
#
# It pushes nothing: it prints the push command. Run scripts/test.sh first (it also
# installs every library and runs every command from a release made with this script,
# through a local module proxy; see install-test.sh).
#
# The modules are found from the committed go.mod files. Libraries: every one except
# those in bench/ (benchmarks, never installed; it keeps its placeholder requirement
# and the replace), in examples/, in testdata/, vendor/ or internal/, or in a folder the
# go command ignores (_x, .x). Commands: every one in examples/ but in such a folder. A
# new connector or example module needs no change here.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GOWORK=off

die() {
	echo "release: $*" >&2
	exit 1
}

# user_modules prints the folder of every user-facing module, the root (.) first.
user_modules() {
	local list
	list=$(git ls-files -- 'go.mod' '*/go.mod') || die "not a git checkout"
	printf '%s\n' "$list" |
		grep -Ev '(^|/)(bench|examples|testdata|vendor|internal|[._][^/]*)/' |
		while read -r f; do dirname "$f"; done |
		sort -u |
		awk '$0 == "." { print; next } { rest[n++] = $0 } END { for (i = 0; i < n; i++) print rest[i] }'
}

# command_modules prints the folder of every command module (under examples/).
command_modules() {
	local list
	list=$(git ls-files -- 'examples/*/go.mod') || die "not a git checkout"
	printf '%s\n' "$list" |
		grep -Ev '(^|/)(bench|testdata|vendor|internal|[._][^/]*)/' |
		grep -E '^examples/' |
		while read -r f; do dirname "$f"; done |
		sort -u
}

# module_path DIR prints the module path declared in DIR/go.mod.
module_path() {
	awk '$1 == "module" { gsub(/"/, "", $2); print $2; exit }' "$1/go.mod"
}

# requirements DIR prints the path of every module that DIR/go.mod requires.
requirements() { directive_paths "$1" require 2; }

# replaced DIR prints the path of every module that DIR/go.mod replaces.
replaced() { directive_paths "$1" replace 3; }

# directive_paths DIR WORD FIELDS prints the module path of every WORD directive in
# DIR/go.mod: on a line of its own, or in a WORD ( ... ) block, where a directive has at
# least FIELDS fields (a require: path version; a replace: path [version] => ...).
directive_paths() {
	go mod edit -print "$1/go.mod" | awk -v word="$2" -v fields="$3" '
		$0 ~ "^" word "[ \t]*[(]$" { block = 1; next }
		block && /^\)/ { block = 0; next }
		block && NF >= fields { gsub(/"/, "", $1); print $1; next }
		$1 == word && $2 != "(" { gsub(/"/, "", $2); print $2 }'
}

case ${1:-} in
--list)
	user_modules
	exit 0
	;;
--commands)
	command_modules
	exit 0
	;;
esac

(($# == 1)) || die "usage: scripts/release.sh VERSION (e.g. v0.1.0), --list or --commands"
version=$1
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$'
[[ $version =~ $semver ]] || die "$version is not a version like v0.1.0 or v0.2.0-rc.1"
major=${version#v}
major=${major%%.*}
((major < 2)) || die "$version: a major version from v2 on needs /v$major module paths first"

[[ -z $(git status --porcelain) ]] || die "the working tree is not clean: commit or stash first"

mapfile -t libs < <(user_modules)
if ((${#libs[@]} == 0)) || [[ ${libs[0]} != . ]]; then
	die "no go.mod at the repository root"
fi
mapfile -t cmds < <(command_modules)
mods=("${libs[@]}" "${cmds[@]}")
declare -A is_cmd=()
for m in "${cmds[@]}"; do
	is_cmd[$m]=1
done
root_path=$(module_path .)
[[ -n $root_path ]] || die "no module line in go.mod"

# Each nested module's path must be the root's plus its folder, or its tag would not
# be found; and every tag must be new.
declare -A in_repo=()
tags=()
for m in "${mods[@]}"; do
	if [[ $m == . ]]; then
		path=$root_path
		tag=$version
	else
		path=$(module_path "$m")
		[[ $path == "$root_path/$m" ]] || die "$m/go.mod declares module $path, want $root_path/$m"
		tag=$m/$version
	fi
	in_repo[$path]=1
	if git rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
		die "tag $tag exists already"
	fi
	tags+=("$tag")
done

# require_released DIR sets each requirement of an in-repository module in DIR/go.mod
# to VERSION; for a command module, it refuses one that is not released.
require_released() {
	local req
	while read -r req; do
		[[ $req == "$root_path" || $req == "$root_path"/* ]] || continue
		if [[ -n ${in_repo[$req]:-} ]]; then
			go mod edit -require="$req@$version" "$1/go.mod"
		elif [[ -n ${is_cmd[$1]:-} ]]; then
			die "$1 requires $req, which is not released: go run ${root_path}/$1@$version could not find it"
		fi
	done < <(requirements "$1")
}

# Nested modules require the in-repository modules at VERSION; command modules lose
# their replaces, which `go run …@VERSION` refuses.
base=$(git rev-parse HEAD)
changed=()
unreplaced=()
for m in "${mods[@]}"; do
	[[ $m != . ]] || continue
	require_released "$m"
	if [[ -n ${is_cmd[$m]:-} ]]; then
		dropped=0
		while read -r old; do
			[[ -n ${in_repo[$old]:-} ]] || die "$m/go.mod replaces $old, which is not a released module of this repository: go run ${root_path}/$m@$version would refuse it"
			go mod edit -dropreplace="$old" "$m/go.mod"
			dropped=1
		done < <(replaced "$m")
		((dropped == 0)) || unreplaced+=("$m")
	fi
	if ! git diff --quiet -- "$m/go.mod"; then
		changed+=("$m/go.mod")
	fi
done
if ((${#changed[@]})); then
	git commit -q -m "Release $version: the nested modules require the modules of $root_path at $version; the commands have no replace" -- "${changed[@]}"
	echo "committed: ${changed[*]} require $version"
fi
release=$(git rev-parse HEAD)

for tag in "${tags[@]}"; do
	git tag -a -m "$tag" "$tag" "$release"
	echo "tagged $tag at $(git rev-parse --short "$release")"
done

# The commands' replaces come back, with the requirements at VERSION: in this
# repository they build against its modules, not against the published release.
if ((${#unreplaced[@]})); then
	restored=()
	for m in "${unreplaced[@]}"; do
		git checkout -q "$base" -- "$m/go.mod"
		require_released "$m"
		restored+=("$m/go.mod")
	done
	git commit -q -m "After $version: the commands build against this repository's modules again (replace)" -- "${restored[@]}"
	echo "committed: ${restored[*]} replace the modules of this repository again"
fi

printf '\nNothing is pushed. To publish the release:\n\n  git push --atomic origin HEAD %s\n' "${tags[*]}"
