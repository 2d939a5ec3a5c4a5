"""A package registry on the loopback interface, for tests that install dependencies offline.

It serves a mirror folder (``make samples`` fills tools/registry/: scripts/fetch-sample-packages.py):

- ``npm/<name>/-/<file>.tgz`` and ``npm/@scope/<name>/-/<file>.tgz``: the npm registry protocol
  subset ``npm ci`` and ``npm install`` use: ``GET /<name>`` and ``GET /@scope%2f<name>``, the
  packument built from each tarball's own package.json (``dist.tarball`` pointing back at this
  server, ``dist.integrity`` its sha512, ``dist.shasum`` its sha1), and ``GET`` of the tarballs
  at the same paths as on registry.npmjs.org, so a lock file's ``resolved`` path is found here;
- ``pypi/<file>`` (wheels, sdists): a PEP 503 simple index, ``/simple/`` and
  ``/simple/<project>/`` (links to ``/files/<file>#sha256=<hex>``, with ``data-requires-python``
  from a wheel's metadata), and the files.

Every request is recorded, ``(method, path, status)`` in ``requests``, so a test can tell what was
fetched, and that nothing asked for was missing. Standard library only; bound to 127.0.0.1 on a
free port, one thread per request.

    with PackageRegistry(folder) as registry:
        registry.npm_url    # http://127.0.0.1:PORT/          (npm_config_registry)
        registry.pypi_url   # http://127.0.0.1:PORT/simple/   (pip install --index-url)

npm installs a lock file's packages from their ``resolved`` addresses; with its default
``replace-registry-host=npmjs`` it replaces the host of an address at registry.npmjs.org by the
configured registry's, so ``npm_config_registry=registry.npm_url`` is enough for a lock file
written against registry.npmjs.org (tests/test_package_registry.py).
"""
from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import re
import tarfile
import threading
import urllib.parse
import zipfile
from email.parser import HeaderParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _version_key(version: str):
    """Enough of semver's order to pick ``latest``: release numbers, then a release after its
    pre-releases."""
    release, _, pre = version.partition("-")
    numbers = tuple(int(p) if p.isdigit() else 0 for p in release.split("+")[0].split("."))
    return numbers, pre == ""


def _tarball_manifest(data: bytes) -> dict:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if len(parts) == 2 and parts[1] == "package.json" and member.isfile():
                return json.loads(tar.extractfile(member).read().decode("utf-8"))
    raise ValueError("no package.json in the tarball")


def _wheel_requires_python(path: Path) -> str | None:
    if path.suffix != ".whl":
        return None
    with zipfile.ZipFile(path) as wheel:
        for name in wheel.namelist():
            if name.count("/") == 1 and name.endswith(".dist-info/METADATA"):
                headers = HeaderParser().parsestr(wheel.read(name).decode("utf-8", "replace"))
                return headers.get("Requires-Python")
    return None


#: package.json fields a packument's version entry carries (what npm's resolver reads).
_MANIFEST_FIELDS = ("name", "version", "description", "main", "bin", "directories", "dependencies",
                    "optionalDependencies", "peerDependencies", "peerDependenciesMeta",
                    "bundleDependencies", "bundledDependencies", "engines", "os", "cpu", "license",
                    "deprecated", "funding", "type", "exports", "scripts")


class PackageRegistry:
    """The loopback registry serving ``folder`` (``npm/`` and ``pypi/``); a context manager."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.requests: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._host_port = ""
        self._npm_files: dict[str, Path] = {}       # "/qs/-/qs-6.16.0.tgz" -> file
        self._npm_versions: dict[str, dict[str, dict]] = {}  # name -> version -> manifest + dist
        self._pypi_files: dict[str, Path] = {}       # file name -> file
        self._pypi_projects: dict[str, list[tuple[str, str, str | None]]] = {}  # name -> (file, sha256, requires)
        self._index()

    # --- the mirror's contents ------------------------------------------------------------------

    def _index(self) -> None:
        npm = self.folder / "npm"
        for path in sorted(npm.rglob("*.tgz")) if npm.is_dir() else ():
            url_path = "/" + path.relative_to(npm).as_posix()
            name = url_path[1:].split("/-/", 1)[0]
            data = path.read_bytes()
            manifest = {k: v for k, v in _tarball_manifest(data).items() if k in _MANIFEST_FIELDS}
            if manifest.get("name") != name or "version" not in manifest:
                raise ValueError(f"{path}: its package.json names {manifest.get('name')!r}, not {name!r}")
            manifest["_path"] = url_path  # the tarball's address, made absolute per request
            manifest["dist"] = {
                "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
                "shasum": hashlib.sha1(data).hexdigest(),
            }
            self._npm_files[url_path] = path
            self._npm_versions.setdefault(name, {})[manifest["version"]] = manifest
        pypi = self.folder / "pypi"
        for path in sorted(pypi.iterdir()) if pypi.is_dir() else ():
            if not path.is_file() or path.name.startswith("."):
                continue
            if path.name.endswith(".whl"):
                project = path.name.split("-", 1)[0]
            elif path.name.endswith((".tar.gz", ".zip")):
                project = path.name.rsplit("-", 1)[0]
            else:
                continue
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            self._pypi_files[path.name] = path
            self._pypi_projects.setdefault(_normalize(project), []).append(
                (path.name, sha, _wheel_requires_python(path)))

    @property
    def npm_packages(self) -> dict[str, list[str]]:
        """Each npm package name served, with its versions."""
        return {name: sorted(versions, key=_version_key) for name, versions in self._npm_versions.items()}

    @property
    def pypi_files(self) -> list[str]:
        return sorted(self._pypi_files)

    # --- answers --------------------------------------------------------------------------------

    def packument(self, name: str, base: str) -> dict | None:
        versions = self._npm_versions.get(name)
        if not versions:
            return None
        entries = {}
        for version, manifest in versions.items():
            entry = {k: v for k, v in manifest.items() if k != "_path"}
            entry["dist"] = dict(manifest["dist"], tarball=base.rstrip("/") + manifest["_path"])
            entries[version] = entry
        latest = max(versions, key=_version_key)
        return {"name": name, "dist-tags": {"latest": latest}, "versions": entries}

    def simple_page(self, project: str) -> str | None:
        files = self._pypi_projects.get(project)
        if files is None:
            return None
        links = []
        for filename, sha, requires in files:
            extra = f' data-requires-python="{html.escape(requires)}"' if requires else ""
            links.append(f'<a href="/files/{urllib.parse.quote(filename)}#sha256={sha}"{extra}>'
                         f"{html.escape(filename)}</a><br/>")
        return ("<!DOCTYPE html>\n<html><head><meta name=\"pypi:repository-version\" content=\"1.0\">"
                f"<title>Links for {html.escape(project)}</title></head><body>\n"
                f"<h1>Links for {html.escape(project)}</h1>\n" + "\n".join(links) + "\n</body></html>\n")

    def simple_root(self) -> str:
        links = "\n".join(f'<a href="/simple/{p}/">{p}</a><br/>' for p in sorted(self._pypi_projects))
        return f"<!DOCTYPE html>\n<html><body>\n{links}\n</body></html>\n"

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def requested(self, prefix: str = "/", status: int | None = None) -> list[str]:
        """The paths asked for that start with ``prefix`` (and got ``status``), in order."""
        with self._lock:
            return [p for _m, p, s in self.requests if p.startswith(prefix) and (status is None or s == status)]

    # --- the server -----------------------------------------------------------------------------

    def start(self) -> "PackageRegistry":
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "package-registry-for-tests"

            def log_message(self, *args):  # recorded in registry.requests instead
                pass

            def _send(self, status: int, body: bytes, content_type: str, head: bool = False):
                # recorded before the answer goes out: a client that reads it and asks for the record at
                # once finds it there (recorded after, a loaded machine lost that race)
                registry._record(self.command, self.path, status)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _redirect(self, location: str):
                registry._record(self.command, self.path, 301)
                self.send_response(301)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self):
                self.do_GET(head=True)

            def do_GET(self, head: bool = False):
                path = urllib.parse.urlsplit(self.path).path
                base = f"http://{self.headers.get('Host') or registry.host_port}"
                if path == "/simple/":
                    return self._send(200, registry.simple_root().encode(), "text/html", head)
                if path.startswith("/simple/"):
                    project = path[len("/simple/"):].strip("/")
                    if _normalize(project) + "/" != path[len("/simple/"):]:
                        return self._redirect(f"/simple/{_normalize(project)}/")
                    page = registry.simple_page(project)
                    if page is None:
                        return self._send(404, b"not found\n", "text/plain", head)
                    return self._send(200, page.encode(), "text/html", head)
                if path.startswith("/files/"):
                    found = registry._pypi_files.get(urllib.parse.unquote(path[len("/files/"):]))
                    if found is None:
                        return self._send(404, b"not found\n", "text/plain", head)
                    return self._send(200, found.read_bytes(), "application/octet-stream", head)
                unquoted = urllib.parse.unquote(path)
                if "/-/" in unquoted:
                    found = registry._npm_files.get(unquoted)
                    if found is None:
                        return self._send(404, b"{}", "application/json", head)
                    return self._send(200, found.read_bytes(), "application/octet-stream", head)
                document = registry.packument(unquoted.lstrip("/"), base)
                if document is None:
                    return self._send(404, b'{"error":"not_found"}', "application/json", head)
                return self._send(200, json.dumps(document).encode(), "application/json", head)

            def do_POST(self):  # npm audit's bulk advisory request, and anything else: not here
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self._send(404, b'{"error":"not_found"}', "application/json")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self._host_port = f"{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="package-registry",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    @property
    def host_port(self) -> str:
        """``127.0.0.1:PORT`` (kept after ``stop``, for messages)."""
        return self._host_port

    @property
    def npm_url(self) -> str:
        return f"http://{self.host_port}/"

    @property
    def pypi_url(self) -> str:
        return f"http://{self.host_port}/simple/"

    def __enter__(self) -> "PackageRegistry":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
