#!/usr/bin/env bash
# scripts/release.sh VERSION: prepares and tags a release of every user-facing module.
#
#   scripts/release.sh v0.1.0      tag the release (VERSION is vMAJOR.MINOR.PATCH[-pre])
#   scripts/release.sh --list      print the folder of every user-facing module, root first
#
# The repository holds several Go modules: the root (github.com/gopipeline/pipeline) and
# nested ones (prometheus/, otel/, the connectors), which import the root. A user's build
# ignores our `replace github.com/gopipeline/pipeline => ../`, so each nested module must
# require a real release of the root: the one it ships with. For VERSION, this script
#
#   1. checks that the working tree is clean and that none of the tags exists yet;
#   2. sets, in every user-facing nested module, each requirement of an in-repository
#      module (the root, or another nested module) to VERSION, and commits that if it
#      changed anything;
#   3. creates an annotated tag per user-facing module on that commit: VERSION for the
#      root and <folder>/VERSION for each nested one (prometheus/v0.1.0, ...), the
#      names the go command looks for.
#
# It pushes nothing: it prints the push command. Run scripts/test.sh first (it also
# installs every module from a release made with this script; see install-test.sh).
#
# User-facing modules are found from the committed go.mod files: every one except those
# in bench/ (benchmarks, never installed; it keeps its placeholder requirement and the
# replace), in examples/ (demos, run from the repository), in testdata/, vendor/ or
# internal/, or in a folder the go command ignores (_x, .x). A new connector module needs
# no change here.
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

# module_path DIR prints the module path declared in DIR/go.mod.
module_path() {
	awk '$1 == "module" { gsub(/"/, "", $2); print $2; exit }' "$1/go.mod"
}

# requirements DIR prints the path of every module that DIR/go.mod requires.
requirements() {
	go mod edit -print "$1/go.mod" | awk '
		/^require[ \t]*\($/ { block = 1; next }
		block && /^\)/ { block = 0; next }
		block && NF >= 2 { gsub(/"/, "", $1); print $1; next }
		$1 == "require" && $2 != "(" { gsub(/"/, "", $2); print $2 }'
}

if [[ ${1:-} == --list ]]; then
	user_modules
	exit 0
fi

(($# == 1)) || die "usage: scripts/release.sh VERSION (e.g. v0.1.0), or --list"
version=$1
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$'
[[ $version =~ $semver ]] || die "$version is not a version like v0.1.0 or v0.2.0-rc.1"
major=${version#v}
major=${major%%.*}
((major < 2)) || die "$version: a major version from v2 on needs /v$major module paths first"

[[ -z $(git status --porcelain) ]] || die "the working tree is not clean: commit or stash first"

mapfile -t mods < <(user_modules)
if ((${#mods[@]} == 0)) || [[ ${mods[0]} != . ]]; then
	die "no go.mod at the repository root"
fi
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

# Nested modules require the in-repository modules at VERSION.
changed=()
for m in "${mods[@]}"; do
	[[ $m != . ]] || continue
	while read -r req; do
		if [[ -n ${in_repo[$req]:-} ]]; then
			go mod edit -require="$req@$version" "$m/go.mod"
		fi
	done < <(requirements "$m")
	if ! git diff --quiet -- "$m/go.mod"; then
		changed+=("$m/go.mod")
	fi
done
if ((${#changed[@]})); then
	git commit -q -m "Release $version: the nested modules require $root_path $version" -- "${changed[@]}"
	echo "committed: ${changed[*]} require $version"
fi

for tag in "${tags[@]}"; do
	git tag -a -m "$tag" "$tag"
	echo "tagged $tag at $(git rev-parse --short HEAD)"
done

printf '\nNothing is pushed. To publish the release:\n\n  git push --atomic origin HEAD %s\n' "${tags[*]}"
