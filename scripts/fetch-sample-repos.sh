#!/usr/bin/env bash
# Fetch the pinned source distributions of real public libraries (scripts/samples/pins.txt) from
# PyPI into tools/repos/<name>-<version>/, for the slow end-to-end tests that run a saved pipeline
# on a real repository (tests/test_real_repository.py; pipelines/inflection.yaml). Then
# scripts/fetch-sample-packages.py fetches the pinned npm packages (scripts/samples/npm-pins.txt)
# the same way, copies scripts/samples/<name>-<version>/ over each sample (a lock file, a
# requirements file), and fills tools/registry/ with every package those name, for the loopback
# package registry of the tests (tests/package_registry.py, tests/test_package_registry.py).
#
#   scripts/fetch-sample-repos.sh                 # fetch what is missing, check every sha256
#   SAMPLE_REPOS_DIR=/some/dir scripts/...        # somewhere else (default: <repo>/tools/repos)
#   SAMPLE_REGISTRY_DIR=/some/dir scripts/...     # the mirror elsewhere (default: <repo>/tools/registry)
#
# Idempotent and offline when everything is there. The sdist's address comes from PyPI's simple
# index (https://pypi.org/simple/<name>/, its JSON form, PEP 691); the file is checked against its pinned sha256
# before it is unpacked (a mismatch is refused), and nothing of it is run. Needs python3.
set -euo pipefail

SELF="${BASH_SOURCE[0]}"
[[ "$SELF" == */* ]] || SELF="./$SELF"
HERE="$(cd "${SELF%/*}" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PINS="$HERE/samples/pins.txt"
DEST="${SAMPLE_REPOS_DIR:-$ROOT/tools/repos}"
REGISTRY="${SAMPLE_REGISTRY_DIR:-$ROOT/tools/registry}"
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
    # the sdist's address from PyPI's simple index, then the file itself; nothing of it runs, and it is
    # unpacked only once its sha256 matches the pin
    "$PY" - "$name" "$version" "$work/sdist.tar.gz" <<'PYEOF' || die "could not fetch the sdist of $name $version from PyPI (the package index must be reachable)."
import json, sys, urllib.request
name, version, dest = sys.argv[1:]
wanted = f"{name}-{version}.tar.gz"
ask = urllib.request.Request(f"https://pypi.org/simple/{name}/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})  # PEP 691
with urllib.request.urlopen(ask, timeout=60) as answer:
    files = [f for f in json.load(answer)["files"] if f["filename"].lower() == wanted.lower()]
if not files:
    sys.exit(f"PyPI lists no {wanted}")
with urllib.request.urlopen(files[0]["url"], timeout=120) as answer, open(dest, "wb") as out:
    out.write(answer.read())
PYEOF
    archive="$work/sdist.tar.gz"
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
# the npm samples, the files committed for each sample, and the registry mirror (hash-checked too)
"$PY" "$HERE/fetch-sample-packages.py" "$DEST" "$REGISTRY" || die "the sample packages could not be fetched (above)."
