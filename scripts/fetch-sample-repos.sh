#!/usr/bin/env bash
# Fetch the pinned source distributions of real public libraries (scripts/samples/pins.txt) from
# PyPI into tools/repos/<name>-<version>/, for the slow end-to-end tests that run a saved pipeline
# on a real repository (tests/test_real_repository.py; pipelines/inflection.yaml).
#
#   scripts/fetch-sample-repos.sh                 # fetch what is missing, check every sha256
#   SAMPLE_REPOS_DIR=/some/dir scripts/...        # somewhere else (default: <repo>/tools/repos)
#
# Idempotent and offline when everything is there. A download is checked against its pinned
# sha256 before it is unpacked; a mismatch is refused. Needs python3 with pip (the project's .venv
# when present): `pip download --no-deps --no-binary :all:` takes the sdist from the package index.
set -euo pipefail

SELF="${BASH_SOURCE[0]}"
[[ "$SELF" == */* ]] || SELF="./$SELF"
HERE="$(cd "${SELF%/*}" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PINS="$HERE/samples/pins.txt"
DEST="${SAMPLE_REPOS_DIR:-$ROOT/tools/repos}"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY="$(command -v python3)"

die() { echo "fetch-sample-repos: $*" >&2; exit 1; }

mkdir -p "$DEST"
# One fetcher at a time (.ci/run's two suites each run make test, which runs this).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DEST/.fetch.lock"
    flock 9
fi
while read -r name version sha; do
    [ -z "${name:-}" ] || [[ "$name" == \#* ]] && continue
    folder="$DEST/$name-$version"
    if [ -f "$folder/.sdist-sha256" ] && [ "$(cat "$folder/.sdist-sha256")" = "$sha" ]; then
        echo "$name $version: $folder"
        continue
    fi
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    "$PY" -m pip download -q --no-deps --no-binary :all: --dest "$work" "$name==$version" 2>&1 \
        | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
    archive="$(ls "$work"/*.tar.gz 2>/dev/null | head -1)"
    [ -n "$archive" ] || die "pip download of $name==$version gave no sdist (the package index must be reachable)."
    got="$(sha256sum "$archive" | cut -d' ' -f1)"
    [ "$got" = "$sha" ] || die "$name $version: sha256 $got differs from the pin $sha; refused."
    rm -rf "$folder"
    mkdir -p "$folder"
    tar -xzf "$archive" -C "$folder" --strip-components=1
    echo "$sha" > "$folder/.sdist-sha256"
    rm -rf "$work"
    trap - EXIT
    echo "$name $version: fetched into $folder"
done < "$PINS"
