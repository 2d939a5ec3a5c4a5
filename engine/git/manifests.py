"""What a worktree holds, file by file (the manifest and its digest), its nested repositories and
outward links, a restore to a commit's files, and the patch of a change.

Part of engine/git/ (its module docstring says what holds for all of it); no Django."""
from __future__ import annotations

import bisect
import collections
import contextlib
import os
import re
import shutil
import tempfile
import threading
from typing import Sequence

from .core import DEFAULT_EXCLUDES, WorkspaceError, _HEX40, _NULL_OID, _TEMP_INDEX_CONFIG, _fs, _out, _split_z, git
from .repos import _common_dir, resolve_commit


# One record of ``git ls-tree -r -z``: ``<mode> <type> <object>\t<path>\0``.
_LS_TREE_ROW = re.compile(rb"([^ \0]+) [^ \0]+ ([^\t\0]+)\t([^\0]*)\0")


# One record of ``git ls-files --stage -z``: ``<mode> <object> <stage>\t<path>\0``.
_LS_FILES_ROW = re.compile(rb"([^ \0]+) ([^ \0]+) ([0-3])\t([^\0]*)\0")


def _rows(pattern: re.Pattern, out: bytes, what: str) -> list[tuple[bytes, ...]]:
    """Parse NUL-terminated git output in one pass; every record must match ``pattern``."""
    rows = pattern.findall(out)
    if len(rows) != out.count(b"\0"):
        raise WorkspaceError("git_failed", f"git {what} printed output that could not be parsed.")
    return rows


class _TreeFiles:
    """The files of a tree as ``git ls-tree -r`` lists them, sorted by path bytes.

    ``keys[i]`` is the path of ``rows[i]`` as bytes (the sort key); ``rows[i]`` is
    ``(path, mode, object)`` as str.
    """

    __slots__ = ("keys", "rows")

    def __init__(self, cwd: str, tree: str) -> None:
        out = git(["ls-tree", "-r", "-z", "--full-tree", tree], cwd).stdout
        records = _rows(_LS_TREE_ROW, out, "ls-tree")
        # ``ls-tree -r`` walks the trees in their stored order, which for a well-formed tree
        # is the byte order of the full paths (a directory sorts as its name plus "/", and
        # every path below it starts with exactly that); only a malformed tree is re-sorted.
        if any(records[i][2] >= records[i + 1][2] for i in range(len(records) - 1)):
            records.sort(key=lambda record: record[2])
        modes: dict[bytes, str] = {}  # a handful of distinct values: one str each
        self.keys = [path for _mode, _oid, path in records]
        self.rows = [(_fs(path), modes.get(mode) or modes.setdefault(mode, mode.decode()),
                      oid.decode()) for mode, oid, path in records]

    def entries(self, changes: Sequence[dict] = ()) -> list[dict]:
        """``[{"path", "mode", "blob"}]`` of this tree with ``changes`` (sorted by path bytes,
        as :func:`_parse_raw_diff` returns them) applied: a changed path takes its new mode
        and blob, or is left out when deleted; an added path is inserted in order. The dicts
        are new on every call."""
        keys, rows = self.keys, self.rows
        entries: list[dict] = []
        start = 0
        for change in changes:
            key = os.fsencode(change["path"])
            stop = bisect.bisect_left(keys, key, start)
            entries += [{"path": p, "mode": m, "blob": b} for p, m, b in rows[start:stop]]
            if stop < len(keys) and keys[stop] == key:
                stop += 1  # the base entry is replaced or deleted
            if change["new_mode"] is not None:
                entries.append({"path": change["path"], "mode": change["new_mode"],
                                "blob": change["new_blob"]})
            start = stop
        entries += [{"path": p, "mode": m, "blob": b} for p, m, b in rows[start:]]
        return entries


def _tree_entries(cwd: str, tree: str) -> list[dict]:
    """``[{"path", "mode", "blob"}]`` of every file of ``tree`` (any tree-ish), sorted by path
    bytes; gitlinks are listed with mode 160000."""
    return _TreeFiles(cwd, tree).entries()


# The files of recently used base commits, keyed by commit id. A commit id names its content,
# so an entry never goes stale; the few kept bound the memory (about 7 MB per 20,000 files).
_BASE_FILES: collections.OrderedDict[str, _TreeFiles] = collections.OrderedDict()


_BASE_FILES_LOCK = threading.Lock()


_BASE_FILES_KEPT = 4


def _base_files(cwd: str, commit: str) -> _TreeFiles:
    """:class:`_TreeFiles` of a commit (a full id), read once and then kept in memory."""
    with _BASE_FILES_LOCK:
        files = _BASE_FILES.get(commit)
        if files is not None:
            _BASE_FILES.move_to_end(commit)
            return files
    files = _TreeFiles(cwd, commit)
    with _BASE_FILES_LOCK:
        _BASE_FILES[commit] = files
        while len(_BASE_FILES) > _BASE_FILES_KEPT:
            _BASE_FILES.popitem(last=False)
    return files


def _files_of(cwd: str, commit: str, keep: bool) -> _TreeFiles:
    """:func:`_base_files` when ``keep``; otherwise the kept list if there is one, else a list read
    for this call only. A commit that is no stage's base (a run's final checkpoint, read once by the
    final verification) must not push the bases out: each run's would stay kept in the worker,
    about 7 MB per 20,000 files, up to ``_BASE_FILES_KEPT`` of them (bench/worker_memory.py)."""
    if keep:
        return _base_files(cwd, commit)
    with _BASE_FILES_LOCK:
        files = _BASE_FILES.get(commit)
    return files if files is not None else _TreeFiles(cwd, commit)


_DIFF_STATUS = {"A": "added", "D": "deleted", "T": "type_changed"}


def _parse_raw_diff(out: bytes) -> list[dict]:
    """Changes from ``git diff-tree``/``diff-index`` ``-z`` raw output, sorted by path bytes."""
    items = _split_z(out)
    changes = []
    for i in range(0, len(items) - 1, 2):
        old_mode, new_mode, old_blob, new_blob, status = items[i].lstrip(b":").decode().split()
        letter = status[0]
        if letter == "M":
            word = "mode_changed" if old_blob == new_blob else "modified"
        else:
            word = _DIFF_STATUS.get(letter, "modified")
        changes.append({
            "path": _fs(items[i + 1]),
            "status": word,
            "old_mode": None if old_mode == "000000" else old_mode,
            "new_mode": None if new_mode == "000000" else new_mode,
            "old_blob": None if old_blob == _NULL_OID else old_blob,
            "new_blob": None if new_blob == _NULL_OID else new_blob,
        })
    changes.sort(key=lambda c: os.fsencode(c["path"]))
    return changes


def _index_changes(cwd: str, base: str, env: dict) -> list[dict]:
    """Changes from ``base`` to the index named in ``env``: ``git diff-index --cached``, which
    prints what ``git diff-tree -r`` prints between ``base`` and the tree that index writes
    (without writing it, and without reading the unchanged subtrees twice)."""
    out = git([*_TEMP_INDEX_CONFIG, "diff-index", "--cached", "-z", "--no-renames",
               "--no-ext-diff", "--ignore-submodules=none", base], cwd, env=env).stdout
    return _parse_raw_diff(out)


def _index_info(mode: str, oid: str, path: str, stage: int | None = None) -> bytes:
    """One ``git update-index -z --index-info`` record."""
    meta = f"{mode} {oid}" if stage is None else f"{mode} {oid} {stage}"
    return meta.encode() + b"\t" + os.fsencode(path) + b"\0"


def _to_restore(cwd: str, changes: list[dict], exclude_file: str,
                tmp: str) -> tuple[list[bytes], list[str]]:
    """Which changed paths the exclude patterns send back to their base state.

    The patterns are asked of git's own matcher, ``git ls-files --cached --ignored
    --exclude-from``, as the first version of :func:`manifest` asked it about every entry of
    the index before and after ``add -A``. Whether it takes an entry depends on the entry's
    path, its mode and, for a directory-only pattern such as ``build/``, on what is at that
    path in the working tree (git 2.39 looks there with ``lstat``), never on its blob, its
    stage or the other entries. So an entry the worktree left as it was at base matches now
    exactly as it did then, and would be restored to itself: only the changed paths need
    asking. Each is asked about both of its sides at once, in a small scratch index holding
    its base entry as stage 1 and its current entry as stage 2.

    Returns ``(records, changed_tracked)``: ``git update-index --index-info`` records putting
    back the base entry of a path that matched at base (its path is also in
    ``changed_tracked``) and removing a path that matches only now (an untracked file let in
    by a repository ``!`` rule, for example); empty lists when nothing is to be restored.
    """
    if not changes:
        return [], []
    records = []
    for change in changes:
        path = change["path"]
        if change["old_mode"] is not None:
            records.append(_index_info(change["old_mode"], change["old_blob"], path, 1))
        if change["new_mode"] is not None:
            records.append(_index_info(change["new_mode"], change["new_blob"], path, 2))
    env = {"GIT_INDEX_FILE": os.path.join(tmp, "check-index"), "GIT_OPTIONAL_LOCKS": "0"}
    git([*_TEMP_INDEX_CONFIG, "update-index", "-z", "--index-info"], cwd, env=env,
        input=b"".join(records))
    out = git([*_TEMP_INDEX_CONFIG, "ls-files", "--stage", "-z", "--cached", "--ignored",
               f"--exclude-from={exclude_file}"], cwd, env=env).stdout
    matched = {(_fs(path), stage)
               for _mode, _oid, stage, path in _rows(_LS_FILES_ROW, out, "ls-files")}
    restore: list[bytes] = []
    changed_tracked: list[str] = []
    for change in changes:  # sorted by path bytes
        path = change["path"]
        if (path, b"1") in matched:
            changed_tracked.append(path)
            restore.append(_index_info(change["old_mode"], change["old_blob"], path))
        elif (path, b"2") in matched:
            restore.append(_index_info("0", _NULL_OID, path))
    return restore, changed_tracked


def _ls_files_paths(cwd: str, args: list[str], env: dict, config: list[str]) -> list[str]:
    """The paths ``git ls-files -z <args>`` prints (``config``: extra ``-c`` settings)."""
    out = git([*_TEMP_INDEX_CONFIG, *config, "ls-files", "-z", *args], cwd, env=env).stdout
    return [_fs(p) for p in _split_z(out)]


def _drop_listed_parents(paths: list[str]) -> list[str]:
    """``paths`` without the directories (``dir/``) that have a listed path below them."""
    listed = set(paths)
    parents = set()
    for path in paths:
        parts = path.rstrip("/").split("/")
        parents.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    return [p for p in listed if p not in parents]


def _covered(path: str, prefixes: set[str]) -> bool:
    """Whether ``path`` or one of its parent directories (``dir/``) is in ``prefixes``."""
    if path in prefixes:
        return True
    parts = path.rstrip("/").split("/")
    return any("/".join(parts[:i]) + "/" in prefixes for i in range(1, len(parts)))


def _untracked_excluded(cwd: str, env: dict, exclude_file: str, empty_file: str) -> set[str]:
    """Untracked paths kept out by the patterns and not ignored by the repository itself.

    Two walks of the working files, both against the final temporary index: the untracked
    paths the patterns match, then (only when there are some) the untracked paths the
    repository's own rules ignore, limited by literal pathspecs to the top-level entries the
    first walk named (a walk with pathspecs lists, below each of them, what the full walk
    would). With ``--directory`` git lists an untracked directory whose content is all
    ignored as ``dir/`` and, below it, the entries that matched by themselves; the latter are
    kept (e.g. ``config/.env.local`` rather than ``config/``).
    """
    matching = _drop_listed_parents(_ls_files_paths(
        cwd, ["--others", "--ignored", "--directory", f"--exclude-from={exclude_file}"], env,
        []))
    if not matching:
        return set()
    tops = sorted({path.split("/", 1)[0] for path in matching}, key=os.fsencode)
    repo_ignored = set(_ls_files_paths(
        cwd, ["--others", "--ignored", "--directory", "--exclude-standard", "--", *tops],
        {**env, "GIT_LITERAL_PATHSPECS": "1"}, ["-c", f"core.excludesFile={empty_file}"]))
    return {path for path in matching if not _covered(path, repo_ignored)}


def _gitdir_of(dotgit: str) -> str | None:
    """The real path a ``.git`` file's ``gitdir:`` line names, or None when it is no such file."""
    try:
        with open(dotgit, "rb") as fh:
            text = fh.read(4097)
    except OSError:
        return None
    if len(text) > 4096 or not text.startswith(b"gitdir:"):
        return None
    target = os.fsdecode(text[len(b"gitdir:"):].strip())
    return os.path.realpath(os.path.join(os.path.dirname(dotgit), target))


def find_nested_repositories(worktree: str, base_commit: str) -> list[str]:
    """The ``.git`` entries of :func:`_nested_dotgits`, relative to ``worktree`` and as text (a byte
    that is not UTF-8 as ``\\xNN``), sorted."""
    top = os.path.realpath(worktree)
    # shown and stored as text: bytes that are not UTF-8 as \xNN escapes
    return sorted(os.fsencode(os.path.relpath(dotgit, top)).decode("utf-8", "backslashreplace")
                  for dotgit in _nested_dotgits(top, base_commit))


def _nested_dotgits(worktree: str, base_commit: str, keep: bool = True) -> list[str]:
    """Absolute paths of every ``.git`` below the top of ``worktree`` that an agent may have made.

    Read with the os module only, before any git looks at the files: git entering a repository
    an agent made would read that repository's configuration (``core.fsmonitor``,
    ``core.sshCommand`` with a promisor remote and a missing HEAD, filters...) and run what it
    names, as the worker's user, outside the sandbox. A ``.git`` of any kind (folder, file,
    symlink) counts, except the worktree's own ``.git`` and, at a gitlink of ``base_commit`` (a
    submodule of the repository a person gave) or below one, a regular ``.git`` file whose
    ``gitdir:`` lies in the repository's own git folder (which agents cannot write): how
    ``git submodule update`` leaves a populated submodule. Symlinked folders are not followed.

    ``keep`` False reads a commit seen once (a run's final checkpoint) without keeping its file
    list among the base commits' (:func:`_files_of`).

    Raises:
        WorkspaceError: the revision errors of :func:`resolve_commit`; ``git_failed``.
    """
    top = os.path.realpath(worktree)
    common = os.path.realpath(_common_dir(top))
    base = base_commit if _HEX40.fullmatch(base_commit) else resolve_commit(top, base_commit)
    links = [os.path.join(top, path) for path, mode, _oid in _files_of(top, base, keep).rows if mode == "160000"]
    found = []
    for folder, dirs, files in os.walk(top, followlinks=False):
        if ".git" in dirs or ".git" in files:
            dotgit = os.path.join(folder, ".git")
            if folder != top:
                target = None if os.path.islink(dotgit) or not os.path.isfile(dotgit) else _gitdir_of(dotgit)
                submodule = any(folder == link or folder.startswith(link + os.sep) for link in links)
                if not (submodule and target and (target == common or target.startswith(common + os.sep))):
                    found.append(dotgit)
            if ".git" in dirs:
                dirs.remove(".git")
    return found


def outward_symlinks(worktree: str, changes: list[dict]) -> list[dict]:
    """The symlinks among a manifest's ``changes`` (added or changed to mode 120000) that point
    out of ``worktree``: ``[{"path", "target", "resolves_to"}]``, sorted by path.

    Outward means: an absolute target (even one naming a file inside: the worktree is moved
    and checked out elsewhere), a target that leaves the worktree once ``..`` segments are
    resolved by name, one that leaves it once the links on its way are followed (``os.path
    .realpath``), or one that reaches the worktree's ``.git``. Read with the os module; what
    the link names is never opened.
    """
    top = os.path.realpath(worktree)
    git_dir = os.path.join(top, ".git")
    found = []
    for change in changes:
        if change.get("new_mode") != "120000":
            continue
        full = os.path.join(top, change["path"])
        try:
            target = os.readlink(full)
        except OSError:
            continue
        lexical = os.path.normpath(os.path.join(os.path.dirname(full), target))
        real = os.path.realpath(full)
        inside = [p == top or p.startswith(top + os.sep) for p in (lexical, real)]
        into_git = any(p == git_dir or p.startswith(git_dir + os.sep) for p in (lexical, real))
        if os.path.isabs(target) or not all(inside) or into_git:
            show = lambda text: os.fsencode(text).decode("utf-8", "backslashreplace")  # noqa: E731
            found.append({"path": change["path"], "target": show(target), "resolves_to": show(real)})
    return sorted(found, key=lambda item: os.fsencode(item["path"]))


def refuse_nested_repositories(worktree: str, base_commit: str) -> None:
    """Raise WorkspaceError ``nested_repository`` naming what :func:`find_nested_repositories` found."""
    found = find_nested_repositories(worktree, base_commit)
    if found:
        shown = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
        raise WorkspaceError(
            "nested_repository",
            f"The worktree {worktree} holds a git repository the run did not start with ({shown}). The "
            f"engine runs no git on it (git would read that repository's configuration and could run what "
            f"it names) and never checkpoints a gitlink an agent made.",
            detail="\n".join(found),
        )


def _top_and_index(worktree: str) -> tuple[str, str]:
    """The worktree's top-level directory and the absolute path of its own index file."""
    out = _out(["rev-parse", "--show-toplevel", "--path-format=absolute", "--git-path", "index"],
               worktree).split("\n")
    if len(out) == 2:
        return out[0], out[1]
    top = _out(["rev-parse", "--show-toplevel"], worktree)  # a path with a newline in it
    return top, _out(["rev-parse", "--path-format=absolute", "--git-path", "index"], top)


def _build_manifest(worktree: str, base_commit: str, excludes: list[str] | None,
                    details: bool) -> dict:
    """The work of :func:`manifest`; with ``details`` False only ``tree``, ``digest`` and
    ``base`` are computed (the same values)."""
    patterns = DEFAULT_EXCLUDES if excludes is None else list(excludes)
    base = resolve_commit(worktree, base_commit)
    refuse_nested_repositories(worktree, base)  # before git reads a file an agent wrote
    top, own_index = _top_and_index(worktree)
    with tempfile.TemporaryDirectory(prefix="cp-manifest-") as tmp:
        index = os.path.join(tmp, "index")
        exclude_file = os.path.join(tmp, "exclude")
        with open(exclude_file, "w", encoding="utf-8") as fh:
            fh.write("".join(p + "\n" for p in patterns))
        if os.path.exists(own_index):
            shutil.copy2(own_index, index)
        env = {"GIT_INDEX_FILE": index, "GIT_OPTIONAL_LOCKS": "0"}

        proc = git([*_TEMP_INDEX_CONFIG, "read-tree", "-m", base], top, env=env, check=False)
        if proc.returncode != 0:  # e.g. unmerged entries in the copied index
            with contextlib.suppress(FileNotFoundError):
                os.remove(index)
            git([*_TEMP_INDEX_CONFIG, "read-tree", base], top, env=env)

        # Untracked files matching the patterns are skipped by add through core.excludesFile
        # (this also replaces the user's global excludes file).
        git([*_TEMP_INDEX_CONFIG, "-c", f"core.excludesFile={exclude_file}", "add", "-A"],
            top, env=env)
        # The patterns are authoritative: whatever matches them now (a tracked file changed,
        # deleted, or an untracked one let in by a repository "!" rule) goes back to base.
        changes = _index_changes(top, base, env)
        restore, changed_tracked = _to_restore(top, changes, exclude_file, tmp)
        if restore:
            git([*_TEMP_INDEX_CONFIG, "update-index", "-z", "--index-info"], top, env=env,
                input=b"".join(restore))
            changes = _index_changes(top, base, env)
        tree = _out([*_TEMP_INDEX_CONFIG, "write-tree"], top, env=env)
        if not details:
            return {"tree": tree, "digest": tree, "base": base}

        empty_file = os.path.join(tmp, "empty")
        open(empty_file, "wb").close()
        excluded = _untracked_excluded(top, env, exclude_file, empty_file)
        excluded.update(changed_tracked)

    return {
        "tree": tree,
        "digest": tree,
        "base": base,
        "entries": _base_files(top, base).entries(changes),
        "changes": changes,
        "excluded": sorted(excluded, key=os.fsencode),
    }


def manifest(worktree: str, base_commit: str, excludes: list[str] | None = None) -> dict:
    """Content manifest of the deliverable files in ``worktree``, compared with ``base_commit``.

    Computed with git's machinery in a temporary index (``GIT_INDEX_FILE`` in a temporary
    directory): a copy of the worktree's own index, ``git read-tree -m base_commit`` (the
    index becomes the base tree, keeping stat data of unchanged files so they are not
    re-hashed), ``git add -A`` of the working files, ``git diff-index --cached`` against the
    base (the changes), then ``git write-tree``. The worktree's own index, HEAD and branch
    are not read for content and not changed, so the manifest is the same whatever the agent
    did with commits or branches (docs/field-cases.md C31). The copy keeps the index file's modification time:
    git compares the entries' times with it to tell a file edited in the second the index was
    written ("racily clean", its stat data unchanged at git's one-second resolution) from an
    unchanged one, so a copy dated later would let such an edit be missed.

    Deliverables are the working files except: files ignored by the repository's own rules
    (``.gitignore`` files and ``.git/info/exclude``; the engine user's global excludes file
    is not used, so the result does not depend on the host), and paths matching ``excludes``
    (gitignore syntax). An excluded path, tracked or not, keeps its state at ``base_commit``.
    A populated submodule at its pinned commit is unchanged; an initialised submodule at
    another commit shows as ``modified`` (mode 160000).

    Only the changed paths are matched against ``excludes`` (an unchanged path matches as it
    did at base, and then its state is the base state anyway). ``entries`` are the base
    commit's files (read with ``git ls-tree -r`` once per base commit and kept in memory)
    with the changes applied. Callers that need only the tree id use
    :func:`manifest_digest`, which skips the entries and the two walks behind ``excluded``.

    Args:
        worktree: top-level directory of the run's worktree.
        base_commit: the run's recorded base commit (any revision naming a commit).
        excludes: gitignore-style patterns; None means :data:`DEFAULT_EXCLUDES`.

    Returns:
        ``{"tree": str, "digest": str (same tree id: the artifact reference), "base": str
        (40-hex commit), "entries": [{"path", "mode", "blob"}] (every file of the tree, as
        ``git ls-tree -r -z --full-tree`` lists them, gitlinks with mode 160000, sorted by path
        bytes), "changes": [{"path", "status", "old_mode", "new_mode", "old_blob",
        "new_blob"}] (what ``git diff-tree -r --no-renames`` reports between base and tree: a
        rename is a delete plus an add; status one of added/deleted/modified/type_changed/
        mode_changed; modes and blobs are None on the missing side; sorted by path bytes),
        "excluded": [str] (paths present in the worktree, untracked, not ignored by the
        repository, kept out by ``excludes``, plus tracked excluded paths whose working state
        differs from base; a directory kept out entirely is listed once with a trailing
        ``/``; sorted)}``.

    A git repository an agent made anywhere below the top (``find_nested_repositories``) is
    refused before git reads anything: ``nested_repository``.

    Raises:
        WorkspaceError: ``unknown_revision``/``ambiguous_revision``/``not_a_commit`` for
            ``base_commit``; ``nested_repository``; ``git_failed``.
    """
    return _build_manifest(worktree, base_commit, excludes, details=True)


def manifest_digest(worktree: str, base_commit: str, excludes: list[str] | None = None) -> str:
    """``manifest(worktree, base_commit, excludes)["digest"]``, computed without the rest.

    The same steps up to ``git write-tree`` (so the same tree id, for the same files, in every
    case), without listing the entries or walking the working files for the ``excluded``
    list. For callers that only compare or record the digest.

    Args:
        worktree: top-level directory of the run's worktree.
        base_commit: the run's recorded base commit (any revision naming a commit).
        excludes: gitignore-style patterns; None means :data:`DEFAULT_EXCLUDES`.

    Returns:
        The tree id (hex) of the deliverable files.

    Raises:
        WorkspaceError: as :func:`manifest`.
    """
    return _build_manifest(worktree, base_commit, excludes, details=False)["digest"]
