"""The second half of scripts/fetch-sample-repos.sh: the JavaScript sample projects and the packages
the sample projects' tests need, for tests that install dependencies without the internet.

    python3 scripts/fetch-sample-packages.py REPOS_DIR REGISTRY_DIR

1. Each library of scripts/samples/npm-pins.txt (``name version sha512-integrity``): its tarball
   from the npm registry, checked against the pinned integrity before anything of it is read, is
   unpacked into REPOS_DIR/<name>-<version>/ (npm's ``package/`` prefix stripped).
2. Every file of scripts/samples/<name>-<version>/ is copied over REPOS_DIR/<name>-<version>/
   (a Python sdist unpacked by fetch-sample-repos.sh, or an npm package of step 1): for qs its
   package.json with devDependencies reduced to those its tests load (checked here to differ from
   the published one in that alone) and its package-lock.json; for freezegun its
   requirements-test.txt.
3. REGISTRY_DIR, a mirror the tests' loopback registry serves (tests/package_registry.py):
   ``npm/<the path of the resolved URL>`` for every package every package-lock.json of
   scripts/samples/ names (checked against its lock file ``integrity``), and ``pypi/<file>`` for
   every file every requirements*.txt of scripts/samples/ pins by ``--hash=sha256:`` (found in
   PyPI's simple index, PEP 691 JSON).

Idempotent and offline when everything is there (files already present are checked again, by
hash). A download is written under a temporary name and kept only once its hash matches; nothing
downloaded is run (no install scripts, no build backends). Standard library only.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLES = HERE / "samples"
NPM_PINS = SAMPLES / "npm-pins.txt"
NPM_REGISTRY = "https://registry.npmjs.org/"
PYPI_SIMPLE = "https://pypi.org/simple/"
MARKER = ".npm-integrity"


class Refused(Exception):
    pass


def say(message: str) -> None:
    print(f"fetch-sample-packages: {message}", flush=True)


# --- hashes -------------------------------------------------------------------------------------

def digest(path: Path, algorithm: str) -> bytes:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.digest()


def integrity_matches(path: Path, integrity: str) -> bool:
    """An npm ``integrity`` (SRI: ``sha512-<base64>``, possibly several, space-separated)."""
    for item in integrity.split():
        algorithm, _, value = item.partition("-")
        if algorithm in ("sha512", "sha384", "sha256") and path.is_file():
            if base64.b64encode(digest(path, algorithm)).decode() == value:
                return True
    return False


def download(url: str, dest: Path, check) -> None:
    """``url`` into ``dest``, kept only when ``check(temporary_path)`` holds."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=120) as answer:
            shutil.copyfileobj(answer, out)
        if not check(Path(tmp)):
            raise Refused(f"{url}: the file's hash differs from the pin; refused.")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# --- 1. npm sample projects ---------------------------------------------------------------------

def npm_tarball_url(name: str, version: str) -> str:
    base = name.rsplit("/", 1)[-1]
    return f"{NPM_REGISTRY}{name}/-/{base}-{version}.tgz"


def unpack_npm(archive: Path, folder: Path) -> None:
    """The npm tarball's ``package/`` into ``folder``; links, devices and paths out of it refused."""
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            if top != "package" or not rest or not (member.isfile() or member.isdir()):
                raise Refused(f"{archive.name}: unexpected member {member.name!r}")
            member.name = rest
            members.append(member)
        tar.extractall(folder, members=members, filter="data")


def fetch_npm_samples(repos: Path) -> None:
    for line in NPM_PINS.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, version, integrity = line.split()
        folder = repos / f"{name.replace('/', '-')}-{version}"
        marker = folder / MARKER
        # the pin, and the committed package.json checked against the published one (below)
        ours = SAMPLES / folder.name / "package.json"
        stamp = integrity + (f" {digest(ours, 'sha256').hex()}" if ours.is_file() else "")
        if marker.is_file() and marker.read_text().strip() == stamp:
            print(f"{name} {version}: {folder}")
            continue
        with tempfile.TemporaryDirectory() as work:
            archive = Path(work) / "package.tgz"
            try:
                download(npm_tarball_url(name, version), archive, lambda p: integrity_matches(p, integrity))
            except OSError as e:
                raise Refused(f"could not fetch {name} {version} from the npm registry ({e}); "
                              "the registry must be reachable") from e
            published = Path(work) / "package"
            published.mkdir()
            unpack_npm(archive, published)
            check_overlay(name, version, published)
            if folder.exists():
                shutil.rmtree(folder)
            shutil.move(str(published), folder)
        marker.write_text(stamp + "\n")
        print(f"{name} {version}: fetched into {folder}")


def check_overlay(name: str, version: str, published: Path) -> None:
    """The committed package.json may differ from the published one only by fewer devDependencies,
    each with the published range."""
    ours_path = SAMPLES / f"{name.replace('/', '-')}-{version}" / "package.json"
    if not ours_path.is_file():
        return
    theirs = json.loads((published / "package.json").read_text())
    ours = json.loads(ours_path.read_text())
    kept, allowed = ours.pop("devDependencies", {}), theirs.pop("devDependencies", {})
    if ours != theirs or any(allowed.get(k) != v for k, v in kept.items()):
        raise Refused(f"{ours_path} differs from {name} {version}'s published package.json "
                      "in more than fewer devDependencies")


# --- 2. the committed files over each sample ----------------------------------------------------

def overlay(repos: Path) -> None:
    for source in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        folder = repos / source.name
        if not folder.is_dir():
            raise Refused(f"{folder} is missing: scripts/samples/{source.name}/ names no pinned sample")
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            target = folder / path.relative_to(source)
            if not target.is_file() or target.read_bytes() != path.read_bytes():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                print(f"{source.name}: {path.relative_to(source)} copied in")


# --- 3. the registry mirror ---------------------------------------------------------------------

def lock_packages(lock: Path):
    """(relative mirror path, resolved URL, integrity) of every package a lock file installs."""
    data = json.loads(lock.read_text())
    if data.get("lockfileVersion") != 3:
        raise Refused(f"{lock}: lockfileVersion 3 expected")
    for key, entry in data["packages"].items():
        if not key or entry.get("link"):
            continue
        resolved, integrity = entry.get("resolved", ""), entry.get("integrity", "")
        if not resolved.startswith(NPM_REGISTRY) or not integrity.startswith("sha512-"):
            raise Refused(f"{lock}: {key} has no registry.npmjs.org address and sha512 integrity")
        path = urllib.parse.unquote(urllib.parse.urlparse(resolved).path).lstrip("/")
        if any(part in ("", ".", "..") for part in path.split("/")) or "/-/" not in path:
            raise Refused(f"{lock}: {key}: unexpected address {resolved}")
        yield path, resolved, integrity


def fetch_npm_mirror(registry: Path) -> int:
    count = fetched = 0
    for lock in sorted(SAMPLES.glob("*/package-lock.json")):
        for path, url, integrity in lock_packages(lock):
            dest = registry / "npm" / path
            count += 1
            if integrity_matches(dest, integrity):
                continue
            try:
                download(url, dest, lambda p, i=integrity: integrity_matches(p, i))
            except OSError as e:
                raise Refused(f"could not fetch {url} ({e}); the npm registry must be reachable") from e
            fetched += 1
    say(f"npm: {count} tarballs in {registry / 'npm'} ({fetched} fetched)")
    return count


REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")


def pinned_requirements(path: Path):
    """(name, version, {sha256, ...}) of each line of a hash-pinned requirements file."""
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        match = REQUIREMENT.match(line)
        hashes = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
        if not match or not hashes:
            raise Refused(f"{path}: {line!r} is not `name==version --hash=sha256:...`")
        yield match.group(1), match.group(2), hashes


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def fetch_pypi_mirror(registry: Path) -> int:
    folder = registry / "pypi"
    folder.mkdir(parents=True, exist_ok=True)
    have = {digest(p, "sha256").hex() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}
    count = fetched = 0
    for requirements in sorted(SAMPLES.glob("*/requirements*.txt")):
        for name, version, hashes in pinned_requirements(requirements):
            count += len(hashes)
            missing = hashes - have
            if not missing:
                continue
            ask = urllib.request.Request(f"{PYPI_SIMPLE}{normalize(name)}/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            try:
                with urllib.request.urlopen(ask, timeout=60) as answer:
                    files = json.load(answer)["files"]
                for entry in files:
                    sha = entry.get("hashes", {}).get("sha256")
                    if sha in missing:
                        filename = entry["filename"]
                        if "/" in filename or filename.startswith("."):
                            raise Refused(f"PyPI: unexpected file name {filename!r}")
                        download(entry["url"], folder / filename,
                                 lambda p, s=sha: digest(p, "sha256").hex() == s)
                        missing.discard(sha)
                        have.add(sha)
                        fetched += 1
            except OSError as e:
                raise Refused(f"could not fetch {name} {version} from PyPI ({e}); the package index "
                              "must be reachable") from e
            if missing:
                raise Refused(f"PyPI lists no file of {name} {version} with sha256 {sorted(missing)}")
    say(f"pypi: {count} files in {folder} ({fetched} fetched)")
    return count


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    repos, registry = Path(argv[1]), Path(argv[2])
    try:
        fetch_npm_samples(repos)
        overlay(repos)
        fetch_npm_mirror(registry)
        fetch_pypi_mirror(registry)
    except Refused as e:
        print(f"fetch-sample-packages: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
