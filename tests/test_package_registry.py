"""The loopback package registry (tests/package_registry.py), and the two sample projects whose
tests need their dependencies installed, installed from it with the real npm and pip, offline.

- qs 6.16.0 (npm): ``npm ci`` of its committed lock file (137 packages: its runtime dependencies
  and the devDependencies its tests load, tape among them), then its own tests,
  ``tape 'test/**/*.js'``;
- freezegun 1.5.5 (PyPI sdist): a fresh venv, ``pip install -r requirements-test.txt``
  (python-dateutil, six, pytest and its dependencies, hash-pinned), then its own tests.

``make samples`` fetches both and the registry mirror tools/registry/ (scripts/fetch-sample-packages.py).
Nothing may reach the internet: npm and pip get a home, a cache and a configuration of their own,
and a proxy that refuses every connection for any host but 127.0.0.1, so a package asked of a real
registry fails the install instead of passing unseen. What they fetched is read from the
registry's own record of requests.
"""
import base64
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from .package_registry import PackageRegistry

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "tools" / "registry"
QS = ROOT / "tools" / "repos" / "qs-6.16.0"
FREEZEGUN = ROOT / "tools" / "repos" / "freezegun-1.5.5"
SAMPLES = ROOT / "scripts" / "samples"


def need_samples(*folders: Path) -> None:
    for folder in (REGISTRY / "npm", REGISTRY / "pypi", *folders):
        if not folder.is_dir():
            pytest.skip(f"{folder.relative_to(ROOT)} is missing: run `make samples` "
                        "(scripts/fetch-sample-repos.sh) to fetch the samples and the registry mirror")


def refused_port() -> int:
    """A loopback port nothing listens on: the proxy every request to another host is sent to."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline_env(home: Path) -> dict:
    """The environment without the machine's npm and pip settings (nor the outer pytest's PYTEST_ADDOPTS: CI
    gives a --basetemp the inner pytest refuses), with a home of its own and a
    proxy that refuses everything but the loopback registry."""
    env = {k: v for k, v in os.environ.items()
           if not k.lower().startswith(("npm_", "pip_", "python", "virtual_env", "node_", "pytest_"))
           and k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")}
    home.mkdir(parents=True, exist_ok=True)
    proxy = f"http://127.0.0.1:{refused_port()}"
    for name in ("http_proxy", "https_proxy"):
        env[name] = env[name.upper()] = proxy
    env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1"
    env["HOME"] = str(home)
    return env


def copy_sample(sample: Path, dest: Path) -> Path:
    shutil.copytree(sample, dest, ignore=shutil.ignore_patterns(
        "__pycache__", ".sdist-sha256", ".npm-integrity", "node_modules", ".pytest_cache"))
    return dest


def run(command: list[str], cwd: Path, env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def shown(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n--- stdout:\n{result.stdout[-4000:]}\n--- stderr:\n{result.stderr[-4000:]}"


# --- the registry itself, on a folder made here -------------------------------------------------

def npm_tarball(name: str, version: str, **fields) -> bytes:
    manifest = json.dumps({"name": name, "version": version, **fields}).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for path, data in (("package/package.json", manifest), ("package/index.js", b"module.exports = 1;\n")):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def wheel(name: str, version: str, requires_python: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{name}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Python: {requires_python}\n")
    return out.getvalue()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_registry_serves_packuments_tarballs_and_a_simple_index_and_records_each_request(tmp_path):
    files = {
        "npm/@scope/pkg/-/pkg-1.0.0.tgz": npm_tarball("@scope/pkg", "1.0.0", dependencies={"plain": "^1.2.0"}),
        "npm/plain/-/plain-1.2.0.tgz": npm_tarball("plain", "1.2.0"),
        "npm/plain/-/plain-1.10.0.tgz": npm_tarball("plain", "1.10.0", bin={"plain": "index.js"}),
        "pypi/demo_pkg-0.1-py3-none-any.whl": wheel("demo_pkg", "0.1", ">=3.8"),
    }
    for path, data in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)

    with PackageRegistry(tmp_path) as registry:
        assert registry.npm_url.startswith("http://127.0.0.1:") and registry.npm_url.endswith("/")
        assert registry.pypi_url == registry.npm_url + "simple/"
        assert registry.npm_packages == {"@scope/pkg": ["1.0.0"], "plain": ["1.2.0", "1.10.0"]}

        status, body = get(registry.npm_url + "@scope%2fpkg")  # how npm asks for a scoped package
        assert status == 200
        packument = json.loads(body)
        entry = packument["versions"]["1.0.0"]
        assert packument["name"] == "@scope/pkg" and packument["dist-tags"] == {"latest": "1.0.0"}
        assert entry["dependencies"] == {"plain": "^1.2.0"}
        data = files["npm/@scope/pkg/-/pkg-1.0.0.tgz"]
        assert entry["dist"] == {
            "tarball": registry.npm_url + "@scope/pkg/-/pkg-1.0.0.tgz",
            "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
            "shasum": hashlib.sha1(data).hexdigest()}
        assert get(entry["dist"]["tarball"]) == (200, data)

        plain = json.loads(get(registry.npm_url + "plain")[1])
        assert plain["dist-tags"] == {"latest": "1.10.0"}  # semver order, not text order
        assert plain["versions"]["1.10.0"]["bin"] == {"plain": "index.js"}

        status, page = get(registry.pypi_url + "demo-pkg/")
        sha = hashlib.sha256(files["pypi/demo_pkg-0.1-py3-none-any.whl"]).hexdigest()
        assert status == 200
        assert (f'<a href="/files/demo_pkg-0.1-py3-none-any.whl#sha256={sha}" '
                'data-requires-python="&gt;=3.8">demo_pkg-0.1-py3-none-any.whl</a>') in page.decode()
        assert get(registry.pypi_url + "Demo_Pkg/")[0] == 200  # redirected to the normalized name
        assert get(registry.npm_url + "files/demo_pkg-0.1-py3-none-any.whl")[1] == files["pypi/demo_pkg-0.1-py3-none-any.whl"]
        assert b"demo-pkg" in get(registry.pypi_url)[1]

        assert get(registry.npm_url + "left-pad")[0] == 404
        assert get(registry.npm_url + "plain/-/plain-9.9.9.tgz")[0] == 404
        assert get(registry.pypi_url + "requests/")[0] == 404

        assert ("GET", "/@scope%2fpkg", 200) in registry.requests
        assert ("GET", "/simple/Demo_Pkg/", 301) in registry.requests
        assert registry.requested("/-/") == [] and registry.requested(status=404) == [
            "/left-pad", "/plain/-/plain-9.9.9.tgz", "/simple/requests/"]
    with pytest.raises(OSError):  # stopped: nothing listens any more
        urllib.request.urlopen(registry.npm_url, timeout=5)


# --- the samples, installed with the real npm and pip -------------------------------------------

def test_npm_ci_installs_the_qs_lock_file_from_the_loopback_registry_and_its_own_tests_pass(tmp_path):
    need_samples(QS)
    project = copy_sample(QS, tmp_path / "qs")
    lock = json.loads((project / "package-lock.json").read_text())
    packages = {key: entry for key, entry in lock["packages"].items() if key}
    assert lock["lockfileVersion"] == 3 and len(packages) == 137
    assert all(e["resolved"].startswith("https://registry.npmjs.org/") and e["integrity"].startswith("sha512-")
               for e in packages.values())
    env = offline_env(tmp_path / "home")

    # the library cannot even load before its dependencies are installed
    bare = run(["node", "-e", "require('./')"], project, env)
    assert bare.returncode != 0 and "Cannot find module 'side-channel'" in bare.stderr, shown(bare)

    with PackageRegistry(REGISTRY) as registry:
        env.update(npm_config_registry=registry.npm_url, npm_config_cache=str(tmp_path / "npm-cache"),
                   npm_config_update_notifier="false")
        install = run(["npm", "ci", "--no-audit", "--no-fund"], project, env)
        assert install.returncode == 0, shown(install)
        assert "added 137 packages" in install.stdout, shown(install)
        # every package came from the loopback registry: the lock file's registry.npmjs.org
        # addresses were rewritten to it (npm's replace-registry-host=npmjs, its default)
        wanted = sorted("/" + e["resolved"].removeprefix("https://registry.npmjs.org/") for e in packages.values())
        assert sorted(registry.requested("/", status=200)) == wanted
        assert registry.requested(status=404) == [], registry.requests

    tests = run(["node_modules/.bin/tape", "test/**/*.js"], project, env)
    assert tests.returncode == 0, shown(tests)
    counts = dict(re.findall(r"^# (tests|pass|fail) +(\d+)$", tests.stdout, flags=re.M))
    assert "fail" not in counts and int(counts["tests"]) == int(counts["pass"]) >= 1000, counts


def test_pip_installs_freezegun_test_requirements_from_the_loopback_registry_and_its_own_tests_pass(tmp_path):
    need_samples(FREEZEGUN)
    project = copy_sample(FREEZEGUN, tmp_path / "freezegun")
    requirements = project / "requirements-test.txt"
    assert requirements.read_text() == (SAMPLES / "freezegun-1.5.5" / "requirements-test.txt").read_text()
    env = offline_env(tmp_path / "home")
    env["PIP_CONFIG_FILE"] = os.devnull  # none of the machine's pip.conf (its find-links, indexes, constraints)
    venv = tmp_path / "env"
    made = run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    assert made.returncode == 0, shown(made)
    python = venv / "bin" / "python"

    # the library cannot even load before its dependencies are installed
    bare = run([str(python), "-c", "import freezegun"], project, env)
    assert bare.returncode != 0 and "No module named 'dateutil'" in bare.stderr, shown(bare)

    with PackageRegistry(REGISTRY) as registry:
        install = run([str(python), "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
                       "--index-url", registry.pypi_url, "-r", "requirements-test.txt"], project, env)
        assert install.returncode == 0, shown(install)
        names = ["python-dateutil", "six", "pytest", "iniconfig", "packaging", "pluggy", "pygments"]
        assert registry.requested("/simple/", status=200) == [f"/simple/{n}/" for n in names]
        assert sorted(registry.requested("/files/", status=200)) == sorted(f"/files/{f}" for f in registry.pypi_files)
        assert registry.requested(status=404) == [], registry.requests

    tests = run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], project, env)
    assert tests.returncode == 0, shown(tests)
    summary = re.search(r"^(\d+) passed(?:, (\d+) skipped)? in ", tests.stdout, flags=re.M)
    assert summary and int(summary.group(1)) >= 140, shown(tests)


def test_npm_install_without_the_lock_file_resolves_the_same_tree_from_the_registry_packuments(tmp_path):
    """The packuments: ``npm install`` with no lock file asks the registry for each package's
    document (scoped ones as ``/@scope%2fname``) and resolves, from what the mirror has, the
    tree the committed lock file pins, every tarball from the loopback registry."""
    need_samples(QS)
    project = copy_sample(QS, tmp_path / "qs")
    pinned = json.loads((project / "package-lock.json").read_text())["packages"]
    (project / "package-lock.json").unlink()
    env = offline_env(tmp_path / "home")
    with PackageRegistry(REGISTRY) as registry:
        env.update(npm_config_registry=registry.npm_url, npm_config_cache=str(tmp_path / "npm-cache"),
                   npm_config_update_notifier="false")
        install = run(["npm", "install", "--no-audit", "--no-fund"], project, env)
        assert install.returncode == 0, shown(install)
        documents = [p for p in registry.requested(status=200) if "/-/" not in p]
        assert "/@ljharb%2fthrough" in documents and "/tape" in documents and "/side-channel" in documents
        assert registry.requested(status=404) == [], registry.requests
    resolved = json.loads((project / "package-lock.json").read_text())["packages"]
    assert {k: (e.get("version"), e.get("integrity")) for k, e in resolved.items()} == \
        {k: (e.get("version"), e.get("integrity")) for k, e in pinned.items()}
    assert resolved["node_modules/tape"]["resolved"] == registry.npm_url + "tape/-/tape-5.10.2.tgz"
