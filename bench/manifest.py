"""Benchmark: the manifest of a 20,000-file repository against plain git.

Issue text: "manifest of a 20,000-file repository, as a ratio against ``git add -A`` plus
``git write-tree`` on a temporary index in the same run (target <= 1.3)."

Run from the repository root::

    .venv/bin/python bench/manifest.py
    .venv/bin/python bench/manifest.py --files 5000 --runs 3     # a quick try

The repository (built in a temporary directory under ``$TMPDIR``, never inside this one):
20,000 tracked files (small Python/text sources in nested directories; a few names with
spaces and non-ASCII characters; a ``.gitignore``), one base commit, and a linked worktree
on its own branch at that commit, as the engine's runs have (``git worktree add``).  Its
own index is refreshed a second after the checkout, so its stat data is current and not
"racily clean", as it is in a worktree where an agent has been working for a while.  Then,
in the worktree, an agent's edit: 300 tracked files modified, 100 deleted, 200 added (some
in new directories, some with spaces or non-ASCII names), plus a few paths the engine keeps
out (``.env``, ``__pycache__/*.pyc``) and one the repository ignores (``*.log``).

Measured, each the whole call:

* ``engine.workspace.manifest(worktree, base_commit, DEFAULT_EXCLUDES)``: the tree id, every
  entry, the changes against base and the excluded list;
* ``engine.workspace.manifest_digest(...)``: the same tree id only.

Two baselines, both ``git -c core.excludesFile=<DEFAULT_EXCLUDES> add -A`` then ``git
write-tree`` on a temporary index (the patterns given to ``add`` as the engine gives them, so
both sides add the same files and write the same tree, which is checked in every repetition):

(a) **The issue's baseline: a fresh temporary index.**  ``GIT_INDEX_FILE`` names a path in a
    new temporary directory where no file exists yet, so git starts from an empty index and
    hashes every one of the 20,000 files, as a manifest computed from scratch would.  (A
    zero-byte file there is refused by git as "index file smaller than expected".)  This is
    the ratio the target applies to: ``median(manifest) / median(baseline a) <= 1.3``, PASS or
    FAIL (exit status 0 or 1).  The engine does not hash everything: it seeds its temporary
    index from the worktree's own and re-hashes only what changed, so this ratio mostly
    says that the engine's bookkeeping costs less than the hashing it avoids.

(b) **The stricter comparison, for information: a warm temporary index.**  The same two
    commands on a copy of the worktree's own index (stat data current, so git re-hashes only
    the files that changed, as the engine's own ``add -A`` does; the copy is timed).  This is
    the engine's overhead over git's own minimum for the same answer: the ``read-tree -m``
    to the base commit, the diff against it, the check of the changed paths against the
    patterns, and for ``manifest()`` the entries and the two walks for the excluded list.
    Reported with its number, not judged.

Each call runs once untimed first (warm file cache; the engine's first ``manifest()`` for a
base commit also reads that commit's file list once, kept in memory for later calls: that
first call's time is printed too).  Then ``--runs`` repetitions (default 5); before every
repetition one more tracked file is edited (untimed), so every repetition sees a new tree and
no result of an earlier call can be reused; the four sides run in turn and must write the
same tree (else FAIL).  Medians are compared.

engine.workspace does not import Django, so no settings or database are needed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_RATIO = 1.3

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "Bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C",
}
_REDIRECTING = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                "GIT_COMMON_DIR", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _REDIRECTING}
    env.update(_GIT_ENV)
    env.update(extra or {})
    return env


def _git(args: list[str], cwd: str, extra: dict[str, str] | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env=_env(extra), capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode("utf-8", "surrogateescape").strip()


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _source(rng: random.Random, name: str) -> str:
    """A small, plausible Python module (about 0.5-3 KB)."""
    lines = [f'"""Module {name}."""', "", "import os", ""]
    for i in range(rng.randint(3, 18)):
        lines += [f"def func_{i}(value, limit={rng.randint(1, 999)}):",
                  f"    # step {rng.getrandbits(32):08x}",
                  "    return [v for v in range(limit) if v % (value or 1) == 0]", ""]
    return "\n".join(lines) + "\n"


def build_repository(root: str, n_files: int, seed: int) -> tuple[str, str, dict]:
    """Create the source repository and the worktree.

    Returns (worktree, base commit, facts): counts of the edit, and ``touch``, tracked files
    left unedited that the timed loop edits one by one between repetitions.
    """
    rng = random.Random(seed)
    src = os.path.join(root, "source")
    os.makedirs(src)
    _git(["init", "-q", "-b", "main", src], root)
    _write(os.path.join(src, ".gitignore"), "*.log\n/tmp/\n")
    _write(os.path.join(src, ".env.example"), "API_URL=https://example.invalid\n")
    special = ["docs/Read Me.md", "docs/release notes 2025.txt", "données/café.txt",
               "日本語/テスト.md", "src/naïve module.py", "assets/émoji 🚀.txt"]
    for path in special:
        _write(os.path.join(src, path), f"{path}\n")
    paths = []
    n_regular = n_files - len(special) - 2
    per_dir = 40
    for i in range(n_regular):
        d, f = divmod(i, per_dir)
        top, sub = divmod(d, 25)
        rel = f"pkg_{top:02d}/sub_{sub:02d}/mod_{f:03d}.py"
        paths.append(rel)
        _write(os.path.join(src, rel), _source(rng, rel))
    _git(["add", "-A"], src)
    _git(["commit", "-q", "-m", "base"], src)
    base = _git(["rev-parse", "HEAD"], src)
    tracked = _git(["ls-files", "-z"], src).count("\0")

    worktree = os.path.join(root, "worktrees", "run-1")
    _git(["worktree", "add", "-q", "-b", "agent/run-1", worktree, base], src)
    # A second later, refresh the worktree's index so no entry is "racily clean" (an entry
    # whose file is as new as the index itself is re-hashed by every git add).
    time.sleep(1.1)
    _git(["update-index", "-q", "--refresh"], worktree)
    time.sleep(1.1)

    # The agent's edit.
    sample = rng.sample(paths, 400)
    modified, deleted = sample[:300], sample[300:]
    for rel in modified:
        with open(os.path.join(worktree, rel), "a", encoding="utf-8") as fh:
            fh.write(f"\n# edited by the agent {rng.getrandbits(64):016x}\n")
    for rel in deleted:
        os.remove(os.path.join(worktree, rel))
    added = [f"pkg_new/feature_{i // 20}/part_{i:03d}.py" for i in range(180)]
    added += [f"src/new module {i}.py" for i in range(10)] + [f"données/fiche_{i}_é.txt" for i in range(10)]
    for rel in added:
        _write(os.path.join(worktree, rel), _source(rng, rel))
    # Kept out by DEFAULT_EXCLUDES, and ignored by the repository.
    _write(os.path.join(worktree, ".env"), "SECRET_TOKEN=abcdefgh12345678\n")
    for i in range(5):
        _write(os.path.join(worktree, "pkg_00", "sub_00", "__pycache__", f"mod_{i:03d}.cpython-311.pyc"), "x" * 200)
    _write(os.path.join(worktree, "debug.log"), "log\n" * 100)
    untouched = sorted(set(paths) - set(sample))
    return worktree, base, {"tracked": tracked, "modified": len(modified), "deleted": len(deleted),
                            "added": len(added), "touch": rng.sample(untouched, 10)}


def baseline_fresh(worktree: str, exclude_file: str, scratch: str) -> str:
    """(a) git add -A and git write-tree on a fresh temporary index (git hashes every file)."""
    tmp = tempfile.mkdtemp(prefix="baseline-a-", dir=scratch)
    try:
        extra = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}  # no file yet: an empty index
        _git(["-c", f"core.excludesFile={exclude_file}", "add", "-A"], worktree, extra)
        return _git(["write-tree"], worktree, extra)
    finally:
        shutil.rmtree(tmp)


def baseline_seeded(worktree: str, own_index: str, exclude_file: str, scratch: str) -> str:
    """(b) The same on a copy of the worktree's own index (git re-hashes only changed files).

    ``copy2`` keeps the index file's modification time, which git's racy-clean check compares
    entries against (the engine copies its seed the same way). The index's path is looked up
    once, untimed (the engine's call includes its own lookup).
    """
    tmp = tempfile.mkdtemp(prefix="baseline-b-", dir=scratch)
    try:
        index = os.path.join(tmp, "index")
        shutil.copy2(own_index, index)
        extra = {"GIT_INDEX_FILE": index}
        _git(["-c", f"core.excludesFile={exclude_file}", "add", "-A"], worktree, extra)
        return _git(["write-tree"], worktree, extra)
    finally:
        shutil.rmtree(tmp)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000, help="tracked files in the base commit (default 20000)")
    parser.add_argument("--runs", type=int, default=5, help="timed repetitions of each side (default 5)")
    parser.add_argument("--seed", type=int, default=20250601)
    parser.add_argument("--keep", action="store_true", help="keep the temporary repository (its path is printed)")
    args = parser.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from engine import workspace

    root = tempfile.mkdtemp(prefix="cp-bench-manifest-")
    try:
        t = time.monotonic()
        worktree, base, counts = build_repository(root, args.files, args.seed)
        print(f"manifest benchmark: {counts['tracked']:,} tracked files at base {base[:12]}; worktree edit: "
              f"{counts['modified']} modified, {counts['deleted']} deleted, {counts['added']} added, "
              f"plus .env, __pycache__/*.pyc, debug.log (built in {time.monotonic() - t:.1f} s under {root})")

        excludes = list(workspace.DEFAULT_EXCLUDES)
        exclude_file = os.path.join(root, "excludes")
        with open(exclude_file, "w", encoding="utf-8") as fh:
            fh.write("".join(p + "\n" for p in excludes))
        scratch = os.path.join(root, "scratch")
        os.makedirs(scratch)
        own_index = _git(["rev-parse", "--path-format=absolute", "--git-path", "index"], worktree)

        sides = {
            "a": ("baseline (a): fresh index, git add -A, git write-tree",
                  lambda: baseline_fresh(worktree, exclude_file, scratch)),
            "b": ("baseline (b): copy of own index, add -A, write-tree",
                  lambda: baseline_seeded(worktree, own_index, exclude_file, scratch)),
            "manifest": ("engine.workspace.manifest()",
                         lambda: workspace.manifest(worktree, base, excludes)["tree"]),
            "digest": ("engine.workspace.manifest_digest()",
                       lambda: workspace.manifest_digest(worktree, base, excludes)),
        }

        # Untimed first round (warm caches; the first add -A also writes the edit's objects),
        # and the correctness check: all sides write the same tree.
        result = workspace.manifest(worktree, base, excludes)
        changes = {}
        for change in result["changes"]:
            changes[change["status"]] = changes.get(change["status"], 0) + 1
        print(f"manifest: tree {result['tree'][:12]}, {len(result['entries']):,} entries, changes {changes}, "
              f"excluded {result['excluded']}")
        trees = {name: fn() for name, (_, fn) in sides.items()}
        if len(set(trees.values()) | {result["tree"]}) != 1:
            print(f"FAIL: the sides wrote different trees: {trees}, manifest {result['tree']}")
            return 1
        # The first manifest() for a base commit in a process also reads that commit's file
        # list (kept in memory for later calls): timed once here, with that cache emptied.
        workspace._BASE_FILES.clear()
        t = time.perf_counter()
        workspace.manifest(worktree, base, excludes)
        cold = time.perf_counter() - t
        print(f"manifest() with the base commit's file list not yet read (first call for a base "
              f"in a process): {cold:.3f} s")

        times: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(args.runs):
            # A new edit before every repetition (untimed), so each one sees a new tree and
            # nothing from an earlier call on the same state could flatter any side.
            with open(os.path.join(worktree, counts["touch"][i % len(counts["touch"])]), "a",
                      encoding="utf-8") as fh:
                fh.write(f"# repetition {i}\n")
            trees = {}
            for name, (_, fn) in sides.items():
                t = time.perf_counter()
                trees[name] = fn()
                times[name].append(time.perf_counter() - t)
            if len(set(trees.values())) != 1:
                print(f"FAIL: repetition {i}: the sides wrote different trees: {trees}")
                return 1

        med = {name: statistics.median(values) for name, values in times.items()}
        print()
        for name, (label, _) in sides.items():
            print(f"{label:<54} median {med[name]:.3f} s   "
                  f"(runs: {', '.join(f'{x:.3f}' for x in times[name])})")
        ratio = med["manifest"] / med["a"]
        print()
        print("(a) against the issue's baseline, a fresh temporary index (git hashes every file):")
        print(f"    manifest()        / baseline (a)   {ratio:.2f}   (target <= {TARGET_RATIO})")
        print(f"    manifest_digest() / baseline (a)   {med['digest'] / med['a']:.2f}")
        print("(b) for information, against a copy of the worktree's own index (only changed files "
              "hashed):")
        print(f"    manifest()        / baseline (b)   {med['manifest'] / med['b']:.2f}")
        print(f"    manifest_digest() / baseline (b)   {med['digest'] / med['b']:.2f}")
        print()
        if ratio <= TARGET_RATIO:
            print(f"PASS: manifest() / baseline (a) = {ratio:.2f} <= {TARGET_RATIO}")
            return 0
        print(f"FAIL: manifest() / baseline (a) = {ratio:.2f} > {TARGET_RATIO}")
        return 1
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
