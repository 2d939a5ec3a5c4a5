#!/usr/bin/env python3
"""Run a command on this machine as a fresh machine of the project's kind would have it.

A package someone installed by hand (``apt-get install bubblewrap``, ``npm install -g ...``, ``pip
install ...`` into the machine's Python, a binary copied into ``/usr/local/bin``) stays on a
developer's machine and on the machine CI runs on, and can make a test pass that fails on a new
user's machine. CI (.ci/run) therefore installs the project and runs the suites through this
script, which hides from them, in a private mount namespace, what is neither on a fresh machine
nor installed by the project's own files:

- the files of every Debian package installed now but not in the snapshot of a fresh machine
  (.ci/fresh-machine.txt, ``[debian]``) and not one the project's scripts install
  (scripts/debian-packages.txt) nor a dependency apt chose for one (of alternatives, the first);
- every global npm package not in the snapshot (``[npm-global]``);
- every entry not in the snapshot (``[files]``) of the watched folders (``watched``): the PATH
  folders (the snapshot's and this environment's), ``/usr/local`` and ``/opt`` whole, the
  ``site-packages``, ``bin`` and standard-library folders of the machine's Python installs
  (pyenv's), the user's ``~/.local`` site folder and bin, and the dynamic loader's folders
  (``/usr/lib/x86_64-linux-gnu``...): a program or library copied there, a hand-installed Python
  package or console script, a ``sitecustomize.py``, a link made by hand. An entry a kept Debian
  package owns (a file, or a folder it installs files into), or an alternatives link
  (update-alternatives) to one, stays.

"Hide" means gone, not emptied: each of those paths is a whiteout in a read-only overlay mounted
over ``/usr``, ``/opt`` or the watched folder, so ``which``, ``os.path.exists``, ``execve``, the
dynamic loader and ``import`` all find nothing there, and nothing writes to those folders (an
install inside fails loudly instead of vanishing). Nothing on the machine changes; the overlays
live as long as the command. The project's own installs (the venv, tools/agents, tools/repos) are
inside the repository and never touched.

Unset: the variables that make a program load code from elsewhere (``PYTHONPATH``, ``LD_PRELOAD``,
``NODE_OPTIONS``..., ``LOADER_VARIABLES``): a fresh machine's environment has none.

Not hidden (no package manager puts a program there, and an overlay over ``/etc`` would hide the
container's own ``/etc/hosts``): configuration in ``/etc`` (``/etc/ld.so.preload`` too) and in the
user's HOME (but ``~/.local``'s site folder and bin are watched), new entries at the root of the
file system, and a file changed or added inside a folder that is already there (a site-packages
package upgraded or patched by hand in place, a file added to a Debian package's folder: the
watched folders but ``/usr/local`` and ``/opt`` are checked one level deep; the project's venv
does not see the machine's site-packages).

    python3 .ci/fresh_machine.py show             # what would be hidden, and why
    python3 .ci/fresh_machine.py run -- CMD ...   # CMD with those paths hidden (needs root)
    python3 .ci/fresh_machine.py snapshot         # print a snapshot of this machine (only on a new one)

Why not a chroot built with debootstrap: the suites need the machine's PostgreSQL and Redis and
the kernel features the sandbox uses, and a debootstrap of Debian 12 with Node.js, Python and
their headers costs CI many minutes; hiding what a fresh machine lacks proves the same thing.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SNAPSHOT = HERE / "fresh-machine.txt"
PROJECT_PACKAGES = ROOT / "scripts" / "debian-packages.txt"
DPKG_INFO = Path("/var/lib/dpkg/info")
ALTERNATIVES = Path("/var/lib/dpkg/alternatives")
#: Folders an overlay is mounted over whole (a hidden path under one of them is a whiteout there).
OVERLAY_ROOTS = ("/usr", "/opt")
#: Folders watched whole (every entry at any depth is in the snapshot or hidden).
DEEP = ("/usr/local", "/opt")
#: The folders of the machine's Python installs whose entries are watched (one level): their
#: site-packages and bin, their standard-library folders (a ``sitecustomize.py`` put there runs in
#: every Python, the project's venv too), and the user's site folder and bin (``pip install --user``);
#: and the dynamic loader's folders.
PYTHON_FOLDERS = ("/root/.pyenv/versions/*/lib/python*/site-packages", "/root/.pyenv/versions/*/bin",
                  "/root/.pyenv/versions/*/lib/python[0-9].*[0-9]",
                  "/usr/local/lib/python3*/dist-packages", "/usr/lib/python3/dist-packages",
                  "~/.local/lib/python*/site-packages", "~/.local/bin",
                  # and the dynamic loader's own folders: a library copied there is loaded by any program
                  "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64")
#: Variables that make a program load code from elsewhere: a fresh machine's environment sets none, so
#: ``run`` unsets them (one a developer exported by hand would otherwise reach the suites).
LOADER_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "LD_PRELOAD", "LD_LIBRARY_PATH",
                    "LD_AUDIT", "NODE_PATH", "NODE_OPTIONS", "PERL5LIB", "PERLLIB", "RUBYLIB", "RUBYOPT")
#: The PATH folders every machine has, watched whatever PATH the caller has.
STANDARD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def sections(path: Path) -> dict[str, set[str]]:
    """The snapshot file: ``[name]`` headers, one entry a line, ``#`` comments."""
    found: dict[str, set[str]] = {}
    current = None
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = found.setdefault(line[1:-1], set())
        elif current is None:
            raise SystemExit(f"{path}: an entry before any [section]: {line!r}")
        else:
            current.add(line)
    return found


def listed_packages(path: Path) -> list[str]:
    """scripts/debian-packages.txt: package names, ``#`` comments."""
    return [word for line in path.read_text(encoding="utf-8").splitlines()
            for word in line.split("#", 1)[0].split()]


# ------------------------------------------------------------------------------------ Debian packages

def installed_debian() -> dict[str, dict]:
    """Every installed Debian package: its dependencies (groups of alternatives) and what it provides."""
    if shutil.which("dpkg-query") is None:
        return {}
    out = subprocess.run(["dpkg-query", "-W", "-f",
                          "${Package}\t${db:Status-Abbrev}\t${Depends}, ${Pre-Depends}\t${Provides}\n"],
                         capture_output=True, text=True, check=True).stdout
    packages = {}
    for line in out.splitlines():
        name, status, depends, provides = (line.split("\t") + ["", "", ""])[:4]
        if status.startswith("ii"):
            packages[name] = {"depends": groups(depends), "provides": {g[0] for g in groups(provides)}}
    return packages


def groups(field: str) -> list[list[str]]:
    """A Depends field as groups of alternatives: ``a (>= 1) | b:any, c`` -> [[a, b], [c]]."""
    found = []
    for part in field.split(","):
        names = [alt.strip().split(" ", 1)[0].split(":", 1)[0] for alt in part.split("|")]
        if any(names):
            found.append([name for name in names if name])
    return found


def closure(roots: list[str], packages: dict[str, dict], present: frozenset[str] = frozenset()) -> set[str]:
    """``roots`` and the installed packages apt chose for their dependencies: of a group of
    alternatives, none when one is already kept (in the result or in ``present``, the fresh
    machine's), else the first that is installed (itself or a package providing it)."""
    providers: dict[str, list[str]] = {}
    for name in sorted(packages):
        for virtual in packages[name]["provides"]:
            providers.setdefault(virtual, []).append(name)

    def candidates(name: str) -> list[str]:
        return ([name] if name in packages else []) + providers.get(name, [])

    # the roots are asked for by name (apt-get install ROOT...): each is there before any dependency is chosen
    seen: set[str] = {chosen for name in roots for chosen in candidates(name)[:1]}
    todo = [group for name in reversed(sorted(seen)) for group in reversed(packages[name]["depends"])]
    while todo:
        group = todo.pop()
        options = [candidate for name in group for candidate in candidates(name)]
        if not options or any(option in seen or option in present for option in options):
            continue
        chosen = options[0]
        seen.add(chosen)
        todo.extend(reversed(packages[chosen]["depends"]))
    return seen


@functools.lru_cache(maxsize=1)
def _file_lists() -> dict[str, list[Path]]:
    """dpkg's file lists by package (``name.list``, ``name:arch.list``)."""
    lists: dict[str, list[Path]] = {}
    for entry in os.listdir(DPKG_INFO) if DPKG_INFO.is_dir() else ():
        if entry.endswith(".list"):
            lists.setdefault(entry[:-5].split(":", 1)[0], []).append(DPKG_INFO / entry)
    return lists


@functools.lru_cache(maxsize=None)
def _real_folder(folder: str) -> str:
    return os.path.realpath(folder)


def package_files(name: str) -> list[str]:
    """The paths a Debian package installed (directories left out), as they are on this machine
    (``/bin/x`` is ``/usr/bin/x`` on a merged-/usr system)."""
    files = []
    for listing in _file_lists().get(name, []):
        for line in listing.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.startswith("/") or line == "/.":
                continue
            real = os.path.join(_real_folder(os.path.dirname(line)), os.path.basename(line))
            if os.path.lexists(real) and not (os.path.isdir(real) and not os.path.islink(real)):
                files.append(real)
    return sorted(set(files))


def alternative_links() -> set[str]:
    """The links update-alternatives manages (``/usr/bin/awk``, ``/usr/bin/x-www-browser``, ...)."""
    links = set()
    for entry in ALTERNATIVES.iterdir() if ALTERNATIVES.is_dir() else ():
        try:
            lines = entry.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        # mode, the master link, then (slave name, slave link) pairs up to an empty line
        head = lines[1:lines.index("")] if "" in lines else lines[1:]
        links.update(line for index, line in enumerate(head) if index % 2 == 0 and line.startswith("/"))
    return {os.path.join(_real_folder(os.path.dirname(link)), os.path.basename(link)) for link in links}


# ------------------------------------------------------------------------------------ npm and the folders

def npm_global() -> tuple[str | None, set[str]]:
    """The global node_modules folder and the packages in it (scoped ones as ``@scope/name``)."""
    npm = shutil.which("npm")
    if npm is None:
        return None, set()
    prefix = subprocess.run([npm, "prefix", "-g"], capture_output=True, text=True).stdout.strip()
    folder = os.path.join(prefix, "lib", "node_modules") if prefix else ""
    if not folder or not os.path.isdir(folder):
        return None, set()
    names = set()
    for entry in os.listdir(folder):
        if entry.startswith("@") and os.path.isdir(os.path.join(folder, entry)):
            names.update(f"{entry}/{sub}" for sub in os.listdir(os.path.join(folder, entry)))
        elif not entry.startswith("."):
            names.add(entry)
    return folder, names


def path_folders(extra: set[str] = frozenset()) -> list[str]:
    """The PATH folders watched: the standard ones, this environment's and ``extra`` (the
    snapshot's), as real paths, the repository's own (the venv, tools/) left out."""
    folders = []
    for entry in [*STANDARD_PATH, *os.environ.get("PATH", "").split(os.pathsep), *sorted(extra)]:
        if entry and os.path.isabs(entry) and os.path.isdir(entry):
            real = os.path.realpath(entry)
            if not (real + os.sep).startswith(str(ROOT) + os.sep) and real not in folders:
                folders.append(real)
    return folders


def watched(extra_path: set[str] = frozenset()) -> list[tuple[str, bool]]:
    """``[(folder, deep)]``: the folders whose entries are in the snapshot or hidden; ``deep``:
    every level, else the folder's own entries."""
    shallow = path_folders(extra_path) + [os.path.realpath(f) for pattern in PYTHON_FOLDERS
                                           for f in sorted(glob.glob(os.path.expanduser(pattern))) if os.path.isdir(f)]
    found = [(folder, True) for folder in DEEP if os.path.isdir(folder)]
    found += [(folder, False) for folder in dict.fromkeys(shallow)
              if not any(folder == deep or folder.startswith(deep + os.sep) for deep in DEEP)]
    return found


def entries(folders: list[tuple[str, bool]], known: set[str] | None = None) -> list[str]:
    """Every entry of the watched folders; with ``known``, only the new ones, and of a new folder
    only the folder itself (hiding it hides what it holds)."""
    found = []
    for folder, deep in folders:
        if not deep:
            found += [os.path.join(folder, e) for e in sorted(os.listdir(folder))
                      if known is None or os.path.join(folder, e) not in known]
            continue
        for parent, dirs, files in os.walk(folder):
            for name in sorted(files):
                path = os.path.join(parent, name)
                if known is None or path not in known:
                    found.append(path)
            for name in sorted(dirs):
                path = os.path.join(parent, name)
                if known is None:
                    found.append(path)
                elif path not in known:
                    found.append(path)
                    dirs.remove(name)  # hidden whole
    return found


def snapshot() -> str:
    """This machine as the snapshot file records it."""
    folders = path_folders()
    lines = ["# A fresh machine of this project's kind, as it boots, before anything is installed on it.",
             "# Made by `python3 .ci/fresh_machine.py snapshot` on a new machine; .ci/fresh_machine.py reads it.",
             "[debian]", *sorted(installed_debian()), "[npm-global]", *sorted(npm_global()[1]),
             "[path-folders]", *folders, "[files]", *sorted(set(entries(watched())))]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ the plan

def plan() -> tuple[dict[str, list[str]], list[str]]:
    """``({reason: [paths to hide]}, [notes])``: what a fresh machine would not have."""
    fresh = sections(SNAPSHOT)
    packages = installed_debian()
    present = frozenset(fresh.get("debian", set()) & set(packages))
    kept = present | closure(listed_packages(PROJECT_PACKAGES), packages, present)
    notes = []
    missing = sorted(fresh.get("debian", set()) - set(packages))
    if missing:
        notes.append(f"{len(missing)} package(s) of the snapshot are not on this machine "
                     f"(another image of the kind?): {', '.join(missing[:10])}")
    hide: dict[str, list[str]] = {}
    folders = watched(fresh.get("path-folders", set()))
    for name in sorted(set(packages) - kept):
        files = [path for path in package_files(name) if _hideable(path, folders)]
        if files:
            hide[f"Debian package {name}"] = files
    npm_folder, names = npm_global()
    hidden_npm = sorted(names - fresh.get("npm-global", set()))
    for name in hidden_npm:
        hide[f"global npm package {name}"] = [os.path.join(npm_folder, name)]
    new = entries(folders, fresh.get("files", set()))
    if new:
        owned = {path for name in kept for path in package_files(name)}
        # a folder a kept package installs files into is that package's (dpkg's lists name folders too,
        # package_files leaves them out)
        owned |= {parent for path in owned for parent in _parents(path)}
        links = alternative_links()
        already = {path for paths in hide.values() for path in paths}
        npm_prefixes = tuple(os.path.join(npm_folder, name) + os.sep for name in hidden_npm) if npm_folder else ()
        for path in new:
            real = os.path.realpath(path)
            if path in owned or path in already or (path in links and real in owned):
                continue
            if npm_prefixes and real.startswith(npm_prefixes):
                reason = "a command of a hidden global npm package"
            else:
                reason = "not on a fresh machine and no package's"
            hide.setdefault(reason, []).append(path)
    return hide, notes


def _parents(path: str) -> list[str]:
    found = []
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        found.append(parent)
        parent = os.path.dirname(parent)
    return found


def _hideable(path: str, folders: list[tuple[str, bool]]) -> bool:
    return overlay_root(path, folders) is not None


def overlay_root(path: str, folders: list[tuple[str, bool]]) -> str | None:
    """The folder an overlay is mounted over to hide ``path``; None when none may be."""
    for root in OVERLAY_ROOTS:
        if path.startswith(root + "/"):
            return root
    for folder, _ in folders:
        if path.startswith(folder + "/"):
            return folder
    return None


def describe(hide: dict[str, list[str]], notes: list[str]) -> str:
    lines = [f"fresh machine: {note}" for note in notes]
    if not hide:
        lines.append("fresh machine: nothing to hide: every package and program here is on a fresh machine "
                     "or installed by the project's own files")
    programs_in = set(path_folders())
    for reason, paths in hide.items():
        programs = [os.path.basename(p) for p in paths if os.path.dirname(p) in programs_in]
        shown = f" (commands: {', '.join(programs[:8])})" if programs else ""
        sample = "" if reason.startswith(("Debian", "global")) else f": {', '.join(paths[:4])}"
        lines.append(f"fresh machine: hiding {reason}: {len(paths)} path(s){shown}{sample}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ the overlays

def build_overlays(hide: dict[str, list[str]], scratch: str) -> list[tuple[str, str]]:
    """A folder of whiteouts for every overlay root: ``[(root, whiteouts)]``, outermost first."""
    folders = watched(sections(SNAPSHOT).get("path-folders", set()))
    by_root: dict[str, list[str]] = {}
    for paths in hide.values():
        for path in paths:
            root = overlay_root(path, folders)
            if root is not None:
                by_root.setdefault(root, []).append(path)
    overlays = []
    for index, root in enumerate(sorted(by_root, key=lambda r: (r.count(os.sep), r))):
        layer = os.path.join(scratch, f"layer{index}")
        os.makedirs(layer)
        _copy_mode(root, layer)
        for path in by_root[root]:
            relative = os.path.relpath(path, root)
            parent = layer
            for part in Path(relative).parent.parts:
                lower = os.path.join(root, os.path.relpath(os.path.join(parent, part), layer))
                parent = os.path.join(parent, part)
                if not os.path.isdir(parent):
                    os.mkdir(parent)
                    _copy_mode(lower, parent)
            if not os.path.lexists(os.path.join(layer, relative)):
                os.mknod(os.path.join(layer, relative), stat.S_IFCHR | 0o000, os.makedev(0, 0))
        overlays.append((root, layer))
    return overlays


def _copy_mode(source: str, target: str) -> None:
    info = os.stat(source)
    os.chown(target, info.st_uid, info.st_gid)
    os.chmod(target, stat.S_IMODE(info.st_mode))


def run(command: list[str]) -> int:
    hide, notes = plan()
    print(describe(hide, notes), flush=True)
    for name in LOADER_VARIABLES:
        if name in os.environ:
            print(f"fresh machine: unsetting {name} (a fresh machine's environment sets none)", flush=True)
            del os.environ[name]
    if not hide:
        return subprocess.call(command)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("fresh machine: cannot hide them (needs root and util-linux's unshare); set "
              "CP_CI_MACHINE_AS_IS=1 to run on the machine as it is", file=sys.stderr)
        if os.environ.get("CP_CI_MACHINE_AS_IS") == "1":
            return subprocess.call(command)
        return 2
    scratch = tempfile.mkdtemp(prefix="cp-fresh-machine-")
    try:
        # read-only overlays: the whiteouts over the folder, no upper layer (nothing writes there)
        mounts = "".join(f'mount -t overlay cp-fresh -o "lowerdir={layer}:{root}" "{root}" '
                         f'|| {{ echo "fresh machine: could not mount the overlay over {root}" >&2; exit 2; }}\n'
                         for root, layer in build_overlays(hide, scratch))
        script = f"set -e\n{mounts}exec \"$@\"\n"
        return subprocess.call(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
                                "fresh-machine", *command])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["snapshot"]:
        sys.stdout.write(snapshot())
        return 0
    if argv[:1] == ["show"]:
        hide, notes = plan()
        print(describe(hide, notes))
        for reason, paths in hide.items():
            print(f"  {reason}:")
            print("".join(f"    {path}\n" for path in paths), end="")
        return 0
    if argv[:1] == ["run"] and len(argv) > 2 and argv[1] == "--":
        return run(argv[2:])
    print("usage: fresh_machine.py show | run -- COMMAND ... | snapshot (see the module's docstring)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
