"""Tests of engine.workspace against real git repositories in tmp_path (no mocks)."""
from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import os
import random
import secrets
import shutil
import stat
import string
import subprocess
import tempfile
import time

import pytest

from engine import workspace as ws
from engine.git import core as git_core, manifests as git_manifests, repos as git_repos
from engine.workspace import WorkspaceError

IDENTITY = {
    "GIT_AUTHOR_NAME": "Tester",
    "GIT_AUTHOR_EMAIL": "tester@example.com",
    "GIT_COMMITTER_NAME": "Tester",
    "GIT_COMMITTER_EMAIL": "tester@example.com",
}


@pytest.fixture(autouse=True)
def hermetic_git(tmp_path_factory, monkeypatch):
    """No user or system git configuration leaks into the tests (nor into the module)."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / "gitconfig"))
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)


def run(cwd, *args, input=None, check=True) -> str:
    env = {**os.environ, **IDENTITY, "LC_ALL": "C"}
    proc = subprocess.run(["git", "-c", "core.quotepath=false", *args], cwd=cwd, env=env,
                          input=input, capture_output=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {args} failed: {proc.stderr.decode()}")
    return proc.stdout.decode("utf-8", "surrogateescape")


def write(path, text: str | bytes, mode: int | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(text.encode() if isinstance(text, str) else text)
    if mode is not None:
        os.chmod(path, mode)


def make_repo(path, files: dict[str, str] | None = None) -> str:
    path = str(path)
    os.makedirs(path, exist_ok=True)
    run(path, "init", "-q", "-b", "main")
    for name, text in (files or {"README.md": "hello\n", "src/app.py": "print(1)\n"}).items():
        write(os.path.join(path, name), text)
    run(path, "add", "-A")
    run(path, "commit", "-q", "-m", "initial")
    return os.path.realpath(path)


def head(repo) -> str:
    return run(repo, "rev-parse", "HEAD").strip()


def worktree_list(repo) -> str:
    return run(repo, "worktree", "list", "--porcelain")


def admin_entries(repo) -> list[str]:
    base = os.path.join(repo, ".git", "worktrees")
    return sorted(os.listdir(base)) if os.path.isdir(base) else []


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo")


@pytest.fixture
def lock_dir(tmp_path):
    return str(tmp_path / "locks")


def new_worktree(repo, tmp_path, lock_dir, name="run-1"):
    path = str(tmp_path / "worktrees" / name)
    info = ws.ensure_worktree(repo, path, f"cp/{name}", "HEAD", branch_owned=False,
                              lock_dir=lock_dir)
    return path, info


def change_paths(m) -> dict[str, str]:
    return {c["path"]: c["status"] for c in m["changes"]}


# ---------------------------------------------------------------------------------------------
# repo_root, resolve_commit, branch_tip
# ---------------------------------------------------------------------------------------------


def test_repo_root(repo, tmp_path):
    assert ws.repo_root(os.path.join(repo, "src")) == repo
    assert ws.repo_root(os.path.join(repo, "src", "app.py")) == repo
    with pytest.raises(WorkspaceError) as err:
        ws.repo_root(str(tmp_path / "missing"))
    assert err.value.code == "path_not_found"
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(WorkspaceError) as err:
        ws.repo_root(str(plain))
    assert err.value.code == "not_a_repository"
    assert str(plain) in err.value.message
    run(str(tmp_path), "init", "-q", "--bare", "bare.git")
    with pytest.raises(WorkspaceError) as err:
        ws.repo_root(str(tmp_path / "bare.git"))
    assert err.value.code == "not_a_repository"
    with pytest.raises(WorkspaceError) as err:
        ws.repo_root(os.path.join(repo, ".git"))
    assert err.value.code == "not_a_repository"


def _ambiguous_commits(repo) -> str:
    """Write two commits whose ids share a 4-hex prefix; return the prefix."""
    tree = run(repo, "rev-parse", "HEAD^{tree}").strip()
    seen: dict[str, bytes] = {}
    for i in range(100000):
        body = (f"tree {tree}\nauthor A <a@b> 0 +0000\ncommitter A <a@b> 0 +0000\n\n"
                f"m{i}\n").encode()
        oid = hashlib.sha1(b"commit %d\0" % len(body) + body).hexdigest()
        if oid[:4] in seen:
            for data in (seen[oid[:4]], body):
                run(repo, "hash-object", "-t", "commit", "-w", "--stdin", input=data)
            return oid[:4]
        seen[oid[:4]] = body
    raise AssertionError("no collision found")


def test_resolve_commit_kinds(repo):
    commit = head(repo)
    assert ws.resolve_commit(repo, "HEAD") == commit
    assert ws.resolve_commit(repo, "main") == commit
    assert ws.resolve_commit(repo, commit[:10]) == commit
    run(repo, "tag", "light")
    assert ws.resolve_commit(repo, "light") == commit
    run(repo, "tag", "-a", "-m", "annotated", "v1")
    run(repo, "tag", "-a", "-m", "nested", "v1-nested", "v1")
    assert run(repo, "cat-file", "-t", "v1").strip() == "tag"
    assert ws.resolve_commit(repo, "v1") == commit
    assert ws.resolve_commit(repo, "v1-nested") == commit

    for rev in ("HEAD^{tree}", "HEAD:README.md", "HEAD:src"):
        with pytest.raises(WorkspaceError) as err:
            ws.resolve_commit(repo, rev)
        assert err.value.code == "not_a_commit", rev
        assert rev in err.value.message
    run(repo, "tag", "treetag", "HEAD^{tree}")
    with pytest.raises(WorkspaceError) as err:
        ws.resolve_commit(repo, "treetag")
    assert err.value.code == "not_a_commit"

    for rev in ("nope", "--help", "-h", "--output=/tmp/x", "", "HEAD..main", "main~5"):
        with pytest.raises(WorkspaceError) as err:
            ws.resolve_commit(repo, rev)
        assert err.value.code == "unknown_revision", rev


def test_resolve_commit_ambiguous(repo):
    prefix = _ambiguous_commits(repo)
    with pytest.raises(WorkspaceError) as err:
        ws.resolve_commit(repo, prefix)
    assert err.value.code == "ambiguous_revision"
    assert prefix in err.value.message

    # A tag and a branch with the same name pointing at different commits.
    first = head(repo)
    run(repo, "tag", "dup")
    run(repo, "commit", "-q", "--allow-empty", "-m", "second")
    run(repo, "branch", "dup")
    with pytest.raises(WorkspaceError) as err:
        ws.resolve_commit(repo, "dup")
    assert err.value.code == "ambiguous_revision"
    assert ws.resolve_commit(repo, "refs/tags/dup") == first
    assert ws.resolve_commit(repo, "refs/heads/dup") == head(repo)


def test_branch_tip(repo):
    assert ws.branch_tip(repo, "main") == head(repo)
    assert ws.branch_tip(repo, "absent") is None
    with pytest.raises(ValueError):
        ws.branch_tip(repo, "-bad")
    with pytest.raises(ValueError):
        ws.branch_tip(repo, "a..b")


# ---------------------------------------------------------------------------------------------
# uncommitted_changes
# ---------------------------------------------------------------------------------------------


def _snapshot(repo):
    index = os.path.join(repo, ".git", "index")
    with open(index, "rb") as fh:
        data = fh.read()
    return {
        "status": run(repo, "--no-optional-locks", "status", "--porcelain", "-z"),
        "head": head(repo),
        "index": data,
        "index_mtime": os.stat(index).st_mtime_ns,
    }


def test_uncommitted_changes_lists_and_touches_nothing(tmp_path):
    repo = make_repo(tmp_path / "repo", {
        "README.md": "hello\n", "src/app.py": "print(1)\n", "gone.txt": "x\n",
        "old name.txt": "rename me\n", ".gitignore": "*.log\n",
    })
    write(os.path.join(repo, "src/app.py"), "print(2)\n")
    os.remove(os.path.join(repo, "gone.txt"))
    write(os.path.join(repo, "new dir/ünïcode file.txt"), "new\n")
    write(os.path.join(repo, "debug.log"), "ignored\n")
    write(os.path.join(repo, "staged.py"), "x = 1\n")
    run(repo, "add", "staged.py")
    run(repo, "mv", "old name.txt", "new name.txt")
    # Make the index stat-stale: a plain `git status` would refresh and rewrite it.
    readme = os.path.join(repo, "README.md")
    os.utime(readme, ns=(os.stat(readme).st_atime_ns, os.stat(readme).st_mtime_ns + 5 * 10**9))

    before = _snapshot(repo), sorted(os.listdir(os.path.join(repo, ".git")))
    changes = ws.uncommitted_changes(repo)
    after = _snapshot(repo), sorted(os.listdir(os.path.join(repo, ".git")))
    assert before == after

    by_path = {c["path"]: c for c in changes}
    assert by_path["src/app.py"]["status"] == "modified"
    assert by_path["src/app.py"]["xy"] == " M"
    assert by_path["gone.txt"]["status"] == "deleted"
    assert by_path["new dir/ünïcode file.txt"]["status"] == "untracked"
    assert by_path["new dir/ünïcode file.txt"]["xy"] == "??"
    assert by_path["staged.py"]["status"] == "added"
    assert by_path["new name.txt"]["status"] == "renamed"
    assert by_path["new name.txt"]["orig_path"] == "old name.txt"
    assert "debug.log" not in by_path
    assert "README.md" not in by_path


# ---------------------------------------------------------------------------------------------
# ensure_worktree / remove_worktree
# ---------------------------------------------------------------------------------------------


def test_ensure_worktree_creates_and_reuses(repo, tmp_path, lock_dir):
    before = _snapshot(repo)
    path, info = new_worktree(repo, tmp_path, lock_dir)
    assert info["created"] is True and info["pruned_stale"] is False
    assert info["head"] == head(repo)
    assert info["submodules"] == []
    assert run(path, "symbolic-ref", "HEAD").strip() == "refs/heads/cp/run-1"
    assert os.path.isfile(os.path.join(path, "src", "app.py"))
    assert _snapshot(repo) == before  # the original checkout is untouched

    again = ws.ensure_worktree(repo, path, "cp/run-1", "HEAD", branch_owned=False,
                               lock_dir=lock_dir)
    assert again["created"] is False and again["head"] == info["head"]


def test_c01_branch_in_use_leaves_nothing_behind(repo, tmp_path, lock_dir):
    other = str(tmp_path / "elsewhere")
    run(repo, "worktree", "add", "-q", "-b", "agent/run-7", other)
    planned = str(tmp_path / "var" / "worktrees" / "7")
    listed, admins = worktree_list(repo), admin_entries(repo)

    with pytest.raises(WorkspaceError) as err:
        ws.ensure_worktree(repo, planned, "agent/run-7", "HEAD", branch_owned=True,
                           lock_dir=lock_dir)
    assert err.value.code == "workspace_branch_in_use"
    assert other in err.value.message
    assert not os.path.lexists(planned)
    assert not os.path.lexists(os.path.dirname(planned))
    assert worktree_list(repo) == listed
    assert admin_entries(repo) == admins

    # Once the other worktree is removed, a retry succeeds.
    ws.remove_worktree(repo, other, lock_dir=lock_dir)
    info = ws.ensure_worktree(repo, planned, "agent/run-7", "HEAD", branch_owned=True,
                              lock_dir=lock_dir)
    assert info["created"] is True
    assert run(planned, "symbolic-ref", "HEAD").strip() == "refs/heads/agent/run-7"


def test_c01_other_refusals_leave_nothing_behind(repo, tmp_path, lock_dir):
    listed, admins = worktree_list(repo), admin_entries(repo)
    # The main checkout's branch is in use too.
    target = str(tmp_path / "wt")
    with pytest.raises(WorkspaceError) as err:
        ws.ensure_worktree(repo, target, "main", "HEAD", branch_owned=True, lock_dir=lock_dir)
    assert err.value.code == "workspace_branch_in_use"
    # Someone else's branch is never taken over.
    run(repo, "branch", "someone/else")
    with pytest.raises(WorkspaceError) as err:
        ws.ensure_worktree(repo, target, "someone/else", "HEAD", branch_owned=False,
                           lock_dir=lock_dir)
    assert err.value.code == "workspace_branch_exists"
    # Unknown start commit.
    with pytest.raises(WorkspaceError) as err:
        ws.ensure_worktree(repo, target, "cp/new", "no-such-rev", branch_owned=False,
                           lock_dir=lock_dir)
    assert err.value.code == "unknown_revision"
    assert not os.path.lexists(target)
    assert ws.branch_tip(repo, "cp/new") is None
    # Something already at the path.
    os.makedirs(target)
    write(os.path.join(target, "keep.txt"), "mine\n")
    with pytest.raises(WorkspaceError) as err:
        ws.ensure_worktree(repo, target, "cp/new", "HEAD", branch_owned=False,
                           lock_dir=lock_dir)
    assert err.value.code == "workspace_path_exists"
    assert os.listdir(target) == ["keep.txt"]
    assert ws.branch_tip(repo, "cp/new") is None
    assert worktree_list(repo) == listed
    assert admin_entries(repo) == admins


def test_c02_deleted_worktree_is_recreated(repo, tmp_path, lock_dir):
    path8, _ = new_worktree(repo, tmp_path, lock_dir, "run-8")
    path9, _ = new_worktree(repo, tmp_path, lock_dir, "run-9")
    # Run 8 has a checkpoint on its branch.
    write(os.path.join(path8, "src/feature.py"), "feature = True\n")
    m = ws.manifest(path8, head(repo))
    tip = ws.commit_checkpoint(path8, "cp/run-8", m["tree"], head(repo), "Stage 1",
                               {"Checkpoint-Id": "j-1"})["commit"]
    main_before = _snapshot(repo)
    entries_before = [b for b in worktree_list(repo).split("\n\n") if path8 not in b]
    admin9 = git_repos._admin_dir_for(os.path.join(repo, ".git"), path9)
    with open(os.path.join(admin9, "gitdir"), "rb") as fh:
        gitdir9 = fh.read()

    subprocess.run(["rm", "-rf", path8], check=True)  # deleted outside git
    assert path8 in worktree_list(repo)

    info = ws.ensure_worktree(repo, path8, "cp/run-8", "HEAD", branch_owned=True,
                              lock_dir=lock_dir)
    assert info["created"] is True and info["pruned_stale"] is True
    assert info["head"] == tip  # the branch tip with its checkpoint
    assert os.path.isfile(os.path.join(path8, "src/feature.py"))
    listed = worktree_list(repo)
    assert listed.count(f"worktree {path8}\n") == 1
    assert [b for b in listed.split("\n\n") if path8 not in b] == entries_before
    with open(os.path.join(admin9, "gitdir"), "rb") as fh:
        assert fh.read() == gitdir9
    assert _snapshot(repo) == main_before


def test_remove_worktree(repo, tmp_path, lock_dir):
    path, _ = new_worktree(repo, tmp_path, lock_dir, "run-3")
    write(os.path.join(path, "dirty.txt"), "uncommitted\n")
    ws.remove_worktree(repo, path, lock_dir=lock_dir, delete_branch="cp/run-3")
    assert not os.path.exists(path)
    assert path not in worktree_list(repo)
    assert ws.branch_tip(repo, "cp/run-3") is None
    # Already gone: tolerated; a stale registration is cleaned up.
    ws.remove_worktree(repo, path, lock_dir=lock_dir, delete_branch="cp/run-3")
    path4, _ = new_worktree(repo, tmp_path, lock_dir, "run-4")
    subprocess.run(["rm", "-rf", path4], check=True)
    ws.remove_worktree(repo, path4, lock_dir=lock_dir)
    assert path4 not in worktree_list(repo)
    assert admin_entries(repo) == []
    # A directory that is not a worktree is never deleted.
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    with pytest.raises(WorkspaceError) as err:
        ws.remove_worktree(repo, str(stranger), lock_dir=lock_dir)
    assert err.value.code == "workspace_path_exists"
    assert stranger.exists()


def test_concurrent_worktrees_of_one_repo(repo, tmp_path, lock_dir):
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda n: new_worktree(repo, tmp_path, lock_dir, f"par-{n}"),
                                range(4)))
    assert all(info["created"] for _, info in results)
    listed = worktree_list(repo)
    assert all(listed.count(f"worktree {path}\n") == 1 for path, _ in results)


def test_repo_lock_is_exclusive(repo, lock_dir):
    with ws.repo_lock(lock_dir, repo) as lock_path:
        key = hashlib.sha256(os.fsencode(os.path.realpath(repo))).hexdigest()
        assert os.path.basename(lock_path) == f"{key}.lock"
        fd = os.open(lock_path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released after the block
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Submodules (docs/field-cases.md C04)
# ---------------------------------------------------------------------------------------------


def _repo_with_submodule(tmp_path, url: str | None = None):
    lib = make_repo(tmp_path / "lib", {"lib.py": "VALUE = 1\n"})
    pinned = head(lib)
    write(os.path.join(lib, "lib.py"), "VALUE = 2\n")
    run(lib, "commit", "-q", "-am", "newer")
    upstream = make_repo(tmp_path / "upstream")
    run(upstream, "-c", "protocol.file.allow=always", "submodule", "add", "-q", lib,
        "vendor/lib")
    run(os.path.join(upstream, "vendor/lib"), "checkout", "-q", pinned)
    run(upstream, "add", "vendor/lib")
    if url is not None:
        run(upstream, "config", "-f", ".gitmodules", "submodule.vendor/lib.url", url)
        run(upstream, "add", ".gitmodules")
    write(os.path.join(upstream, "tests/test_lib.py"),
          "from vendor.lib.lib import VALUE\n")
    run(upstream, "add", "-A")
    run(upstream, "commit", "-q", "-m", "vendor lib")
    # The original checkout: a clone whose submodule was never initialised.
    checkout = str(tmp_path / "checkout")
    run(str(tmp_path), "clone", "-q", upstream, checkout)
    return os.path.realpath(checkout), pinned


def test_c04_submodule_populated(tmp_path, lock_dir):
    checkout, pinned = _repo_with_submodule(tmp_path)
    with open(os.path.join(checkout, ".git", "config"), "rb") as fh:
        config_before = fh.read()
    checkout_before = _snapshot(checkout)
    path = str(tmp_path / "wt")
    info = ws.ensure_worktree(checkout, path, "cp/run-4", "HEAD", branch_owned=False,
                              lock_dir=lock_dir)
    assert info["submodules"] == [{"path": "vendor/lib", "commit": pinned, "pinned": pinned}]
    status = run(path, "submodule", "status")
    assert status.startswith(f" {pinned} vendor/lib")
    assert os.path.isfile(os.path.join(path, "vendor/lib/lib.py"))
    # The original checkout's files, index and (uninitialised) submodule are untouched; its
    # config only gained the submodule's registration, as `git submodule init` records it.
    assert _snapshot(checkout) == checkout_before
    assert os.listdir(os.path.join(checkout, "vendor/lib")) == []
    with open(os.path.join(checkout, ".git", "config"), "rb") as fh:
        config_after = fh.read()
    assert config_after.startswith(config_before)
    assert config_after[len(config_before):].startswith(b'[submodule "vendor/lib"]')

    m = ws.manifest(path, info["head"])
    assert m["changes"] == []
    assert {"path": "vendor/lib", "mode": "160000", "blob": pinned} in m["entries"]
    assert not any(e["path"].startswith("vendor/lib/") for e in m["entries"])

    # Reuse reports the submodule without touching it; removal works with submodules.
    again = ws.ensure_worktree(checkout, path, "cp/run-4", "HEAD", branch_owned=False,
                               lock_dir=lock_dir)
    assert again["created"] is False and again["submodules"] == info["submodules"]
    ws.remove_worktree(checkout, path, lock_dir=lock_dir)
    assert not os.path.exists(path)


def test_c04_unreachable_submodule_fails_explicitly(tmp_path, lock_dir):
    checkout, _ = _repo_with_submodule(tmp_path, url=str(tmp_path / "nowhere" / "lib.git"))
    path = str(tmp_path / "wt")
    with pytest.raises(WorkspaceError) as err:
        ws.ensure_worktree(checkout, path, "cp/run-5", "HEAD", branch_owned=False,
                           lock_dir=lock_dir)
    assert err.value.code == "submodule_init_failed"
    assert path in err.value.message
    assert os.path.isdir(path)  # left in place for inspection
    assert path in worktree_list(checkout)


# ---------------------------------------------------------------------------------------------
# Manifest and patch
# ---------------------------------------------------------------------------------------------


def test_c26_new_files_only(repo, tmp_path, lock_dir):
    path, info = new_worktree(repo, tmp_path, lock_dir, "run-26")
    write(os.path.join(path, "src/new_mod.py"), "def f():\n    return 1\n")
    write(os.path.join(path, "tests/test_new.py"), "def test_f():\n    pass\n")
    write(os.path.join(path, "build/out.bin"), b"\0\1\2")
    write(os.path.join(path, ".pytest_cache/x"), "cache\n")
    assert run(path, "status", "--porcelain", "--untracked-files=no") == ""  # "clean"

    m = ws.manifest(path, info["head"])
    changes = {c["path"]: c for c in m["changes"]}
    assert set(changes) == {"src/new_mod.py", "tests/test_new.py"}
    for name in changes:
        assert changes[name]["status"] == "added"
        assert changes[name]["new_blob"] == run(path, "hash-object", name).strip()
        assert changes[name]["old_blob"] is None
    paths = {e["path"] for e in m["entries"]}
    assert not any(p.startswith(("build/", ".pytest_cache/")) for p in paths)
    assert set(m["excluded"]) == {"build/", ".pytest_cache/"}
    assert m["tree"] == m["digest"] != run(path, "rev-parse", "HEAD^{tree}").strip()

    patch = tmp_path / "run.patch"
    result = ws.write_patch(path, info["head"], m["tree"], str(patch))
    text = patch.read_bytes()
    assert result["files"] == 2
    assert result["bytes"] == len(text)
    assert result["sha256"] == hashlib.sha256(text).hexdigest()
    assert b"b/src/new_mod.py" in text and b"b/tests/test_new.py" in text
    assert b"out.bin" not in text and b".pytest_cache" not in text

    cp = ws.commit_checkpoint(path, "cp/run-26", m["tree"], info["head"], "Stage 1", {})
    shown = run(path, "show", "--name-status", "--format=", cp["commit"])
    assert shown.split("\n")[:2] == ["A\tsrc/new_mod.py", "A\ttests/test_new.py"]


def test_c27_env_excluded(repo, tmp_path, lock_dir):
    path, info = new_worktree(repo, tmp_path, lock_dir, "run-27")
    body = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(48))
    write(os.path.join(path, ".env"), f"OPENAI_API_KEY=sk-{body}\n")
    write(os.path.join(path, "src/app.py"), "print('app')\n")

    m = ws.manifest(path, info["head"])
    assert ".env" not in {e["path"] for e in m["entries"]}
    assert ".env" in m["excluded"]
    assert change_paths(m) == {"src/app.py": "modified"}

    patch = tmp_path / "run.patch"
    ws.write_patch(path, info["head"], m["tree"], str(patch))
    assert body.encode() not in patch.read_bytes()
    assert b"src/app.py" in patch.read_bytes()

    cp = ws.commit_checkpoint(path, "cp/run-27", m["tree"], info["head"], "Stage 1",
                              {"Checkpoint-Id": "c27"})
    assert cp["created"] is True
    assert run(repo, "ls-tree", "-r", "--name-only", cp["commit"]).split() == [
        "README.md", "src/app.py"]
    log = run(repo, "log", "-p", "--all")
    assert "print('app')" in log
    assert body not in log
    assert os.path.isfile(os.path.join(path, ".env"))  # the working file is left alone


def test_default_excludes_semantics(tmp_path, lock_dir):
    repo = make_repo(tmp_path / "repo", {
        "README.md": "hello\n", "dist/app.js": "v1\n", "dist/old.js": "old\n",
        ".gitignore": "*.log\n",
    })
    path, info = new_worktree(repo, tmp_path, lock_dir, "run-x")
    kept = {".env.example": "A=\n", "src/main.py": "x\n", "docs/build.md": "doc\n"}
    dropped = {"config/.env.local": "S=1\n", "key.pem": "k\n", "home/id_rsa": "k\n",
               "home/id_ed25519.pub": "k\n", "pkg/__pycache__/m.cpython-311.pyc": "b\n",
               "pkg/m.pyc": "b\n", "node_modules/a/b.js": "n\n", "foo.egg-info/PKG-INFO": "p\n",
               ".coverage": "c\n", "htmlcov/index.html": "h\n", ".venv/bin/python": "v\n",
               ".DS_Store": "d\n", ".cp/scratch": "s\n", "sub/build/x.o": "o\n"}
    for name, text in {**kept, **dropped, "debug.log": "ignored by repo\n"}.items():
        write(os.path.join(path, name), text)
    # Tracked files under an excluded directory keep their base state.
    write(os.path.join(path, "dist/app.js"), "v2\n")
    os.remove(os.path.join(path, "dist/old.js"))

    m = ws.manifest(path, info["head"])
    assert change_paths(m) == {name: "added" for name in kept}
    entries = {e["path"] for e in m["entries"]}
    assert {"dist/app.js", "dist/old.js"} <= entries
    assert "debug.log" not in m["excluded"]  # gitignored: not a deliverable, not "excluded"
    for name in ("config/.env.local", "key.pem", "home/id_rsa", "home/id_ed25519.pub",
                 "pkg/m.pyc", "pkg/__pycache__/", "node_modules/", "foo.egg-info/",
                 ".coverage", "htmlcov/", ".venv/", ".DS_Store", ".cp/", "sub/build/",
                 "dist/app.js", "dist/old.js"):
        assert name in m["excluded"], name

    # Caller-supplied exclusions replace the defaults.
    m2 = ws.manifest(path, info["head"], excludes=["*.md"])
    assert "key.pem" in change_paths(m2)
    assert "docs/build.md" not in change_paths(m2)
    assert "docs/build.md" in m2["excluded"]


def test_c31_agent_committed(repo, tmp_path, lock_dir):
    path, info = new_worktree(repo, tmp_path, lock_dir, "run-31")
    base = info["head"]
    write(os.path.join(path, "src/app.py"), "print('change 1')\n")
    run(path, "commit", "-q", "-am", "agent commit")
    run(path, "branch", "-m", "cp/run-31", "agent/renamed")
    write(os.path.join(path, "README.md"), "change 2\n")
    assert run(path, "status", "--porcelain", "--untracked-files=no") == " M README.md\n"

    m = ws.manifest(path, base)
    assert m["base"] == base
    assert change_paths(m) == {"src/app.py": "modified", "README.md": "modified"}
    patch = tmp_path / "run.patch"
    result = ws.write_patch(path, base, m["tree"], str(patch))
    assert result["files"] == 2
    text = patch.read_text()
    assert "+print('change 1')" in text and "+change 2" in text


def test_manifest_awkward_paths(tmp_path, lock_dir):
    repo = make_repo(tmp_path / "repo", {
        "README.md": "hello\n", "run.sh": "echo hi\n", "doomed.txt": "bye\n",
        "moved.txt": "content that moves\n", "link-me.txt": "target\n",
    })
    path, info = new_worktree(repo, tmp_path, lock_dir, "run-9")
    odd = {"with space.txt": "s\n", "ünïcødé/名前.txt": "u\n", "new\nline.txt": "n\n"}
    for name, text in odd.items():
        write(os.path.join(path, name), text)
    os.symlink("link-me.txt", os.path.join(path, "the link"))
    os.chmod(os.path.join(path, "run.sh"), 0o755)
    os.remove(os.path.join(path, "doomed.txt"))
    os.rename(os.path.join(path, "moved.txt"), os.path.join(path, "renamed.txt"))
    write(os.path.join(path, "README.md"), "hello\n" * 3)
    write(os.path.join(path, "blob.bin"), bytes(range(256)) * 4)

    m = ws.manifest(path, info["head"])
    changes = {c["path"]: c for c in m["changes"]}
    assert {k: v["status"] for k, v in changes.items()} == {
        "with space.txt": "added", "ünïcødé/名前.txt": "added", "new\nline.txt": "added",
        "the link": "added", "run.sh": "mode_changed", "doomed.txt": "deleted",
        "moved.txt": "deleted", "renamed.txt": "added", "README.md": "modified",
        "blob.bin": "added",
    }
    assert changes["the link"]["new_mode"] == "120000"
    assert (changes["run.sh"]["old_mode"], changes["run.sh"]["new_mode"]) == (
        "100644", "100755")
    assert changes["run.sh"]["old_blob"] == changes["run.sh"]["new_blob"]
    assert changes["doomed.txt"]["new_blob"] is None and changes["doomed.txt"]["new_mode"] is None
    entries = {e["path"]: e for e in m["entries"]}
    assert entries["the link"]["mode"] == "120000"
    assert entries["run.sh"]["mode"] == "100755"
    assert "doomed.txt" not in entries
    assert [e["path"] for e in m["entries"]] == sorted(entries, key=os.fsencode)
    assert m["excluded"] == []

    # The patch reproduces the manifest's tree exactly when applied at the base commit.
    patch = tmp_path / "run.patch"
    result = ws.write_patch(path, info["head"], m["tree"], str(patch))
    assert result["files"] == len(m["changes"])
    check = str(tmp_path / "check")
    run(repo, "worktree", "add", "-q", "--detach", check, info["head"])
    run(check, "apply", "--index", "--binary", str(patch))
    assert run(check, "write-tree").strip() == m["tree"]
    # The worktree itself was not changed by computing the manifest.
    assert run(path, "diff", "--cached", "--name-only") == ""
    own_index = run(path, "rev-parse", "--path-format=absolute", "--git-path", "index").strip()
    with open(own_index, "rb") as fh:
        index_bytes = fh.read()
    assert ws.manifest(path, info["head"])["tree"] == m["tree"]
    with open(own_index, "rb") as fh:
        assert fh.read() == index_bytes
    assert os.stat(os.path.join(path, "run.sh")).st_mode & stat.S_IXUSR


def test_manifest_unchanged_and_empty_patch(repo, tmp_path, lock_dir):
    path, info = new_worktree(repo, tmp_path, lock_dir, "run-0")
    m = ws.manifest(path, "HEAD")
    assert m["changes"] == [] and m["excluded"] == []
    assert m["tree"] == run(path, "rev-parse", "HEAD^{tree}").strip()
    assert [e["path"] for e in m["entries"]] == ["README.md", "src/app.py"]
    result = ws.write_patch(path, info["head"], m["tree"], str(tmp_path / "empty.patch"))
    assert result == {"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest(), "files": 0}
    with pytest.raises(WorkspaceError) as err:
        ws.manifest(path, "HEAD^{tree}")
    assert err.value.code == "not_a_commit"


# The manifest as first written (before the faster one): a copy of the original algorithm,
# kept here as the reference the fast path must agree with byte for byte.


def _ref_ls_files_stage(cwd, args, env):
    out = ws.git([*git_core._TEMP_INDEX_CONFIG, "ls-files", "--stage", "-z", *args], cwd, env=env).stdout
    entries = {}
    for item in git_core._split_z(out):
        meta, _, path = item.partition(b"\t")
        mode, oid, _stage = meta.split(b" ")
        entries[os.fsdecode(path)] = (mode.decode(), oid.decode())
    return entries


def _ref_ls_files_paths(cwd, args, env, config):
    out = ws.git([*git_core._TEMP_INDEX_CONFIG, *config, "ls-files", "-z", *args], cwd, env=env).stdout
    return [os.fsdecode(p) for p in git_core._split_z(out)]


def _ref_drop_listed_parents(paths):
    parents = set()
    for path in paths:
        parts = path.rstrip("/").split("/")
        parents.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    return [p for p in set(paths) if p not in parents]


def _ref_covered(path, prefixes):
    parts = path.rstrip("/").split("/")
    return path in prefixes or any("/".join(parts[:i]) + "/" in prefixes
                                   for i in range(1, len(parts)))


def _ref_tree_entries(cwd, tree):
    out = ws.git(["ls-tree", "-r", "-z", "--full-tree", tree], cwd).stdout
    entries = []
    for item in git_core._split_z(out):
        meta, _, path = item.partition(b"\t")
        mode, _kind, oid = meta.split(b" ")
        entries.append({"path": os.fsdecode(path), "mode": mode.decode(), "blob": oid.decode()})
    entries.sort(key=lambda e: os.fsencode(e["path"]))
    return entries


def _ref_tree_changes(cwd, base, tree):
    out = ws.git(["diff-tree", "-r", "-z", "--no-renames", "--no-ext-diff",
                  "--ignore-submodules=none", base, tree], cwd).stdout
    items = git_core._split_z(out)
    changes = []
    for i in range(0, len(items) - 1, 2):
        old_mode, new_mode, old_blob, new_blob, status = items[i].lstrip(b":").decode().split()
        word = {"A": "added", "D": "deleted", "T": "type_changed"}.get(status[0], "modified")
        if status[0] == "M" and old_blob == new_blob:
            word = "mode_changed"
        changes.append({
            "path": os.fsdecode(items[i + 1]), "status": word,
            "old_mode": None if old_mode == "000000" else old_mode,
            "new_mode": None if new_mode == "000000" else new_mode,
            "old_blob": None if old_blob == "0" * 40 else old_blob,
            "new_blob": None if new_blob == "0" * 40 else new_blob,
        })
    changes.sort(key=lambda c: os.fsencode(c["path"]))
    return changes


def reference_manifest(worktree, base_commit, excludes=None):
    patterns = ws.DEFAULT_EXCLUDES if excludes is None else list(excludes)
    base = ws.resolve_commit(worktree, base_commit)
    top = git_core._out(["rev-parse", "--show-toplevel"], worktree)
    own_index = git_core._out(["rev-parse", "--path-format=absolute", "--git-path", "index"], top)
    config = git_core._TEMP_INDEX_CONFIG
    with tempfile.TemporaryDirectory(prefix="cp-manifest-ref-") as tmp:
        index, exclude_file, empty_file = (os.path.join(tmp, n) for n in ("index", "x", "e"))
        with open(exclude_file, "w", encoding="utf-8") as fh:
            fh.write("".join(p + "\n" for p in patterns))
        open(empty_file, "wb").close()
        if os.path.exists(own_index):
            shutil.copy2(own_index, index)
        env = {"GIT_INDEX_FILE": index, "GIT_OPTIONAL_LOCKS": "0"}
        if ws.git([*config, "read-tree", "-m", base], top, env=env, check=False).returncode:
            os.remove(index)
            ws.git([*config, "read-tree", base], top, env=env)
        exclude_from = [f"--exclude-from={exclude_file}"]
        base_excluded = _ref_ls_files_stage(top, ["--cached", "--ignored", *exclude_from], env)
        ws.git([*config, "-c", f"core.excludesFile={exclude_file}", "add", "-A"], top, env=env)
        now_excluded = _ref_ls_files_stage(top, ["--cached", "--ignored", *exclude_from], env)
        restore, changed_tracked = [], []
        for path in sorted(set(base_excluded) | set(now_excluded), key=os.fsencode):
            old, new = base_excluded.get(path), now_excluded.get(path)
            if old == new:
                continue
            if old is not None:
                changed_tracked.append(path)
                restore.append(f"{old[0]} {old[1]}\t".encode() + os.fsencode(path) + b"\0")
            else:
                restore.append(f"0 {'0' * 40}\t".encode() + os.fsencode(path) + b"\0")
        if restore:
            ws.git([*config, "update-index", "-z", "--index-info"], top, env=env,
                   input=b"".join(restore))
        tree = git_core._out([*config, "write-tree"], top, env=env)
        untracked_matching = _ref_drop_listed_parents(_ref_ls_files_paths(
            top, ["--others", "--ignored", "--directory", *exclude_from], env, []))
        repo_ignored = set(_ref_ls_files_paths(
            top, ["--others", "--ignored", "--directory", "--exclude-standard"], env,
            ["-c", f"core.excludesFile={empty_file}"]))
        excluded = {p for p in untracked_matching if not _ref_covered(p, repo_ignored)}
        excluded.update(changed_tracked)
    return {"tree": tree, "digest": tree, "base": base,
            "entries": _ref_tree_entries(top, tree), "changes": _ref_tree_changes(top, base, tree),
            "excluded": sorted(excluded, key=os.fsencode)}


_WORDS = ["mod", "read me", "naïve", "名前", "x-y", "données", "a.b", "Z"]
_EXTS = [".py", ".txt", ".md", ".pem", ".pyc", ".log", ".js", ""]
_DIRS = ["", "src", "src/pkg", "docs", "dir with space", "ünï/cødé", "deep/er/still", "dist",
         "node_modules/lib", "build", "config", "src/pkg/__pycache__", "keys", "mixed"]


def _random_path(rng, dirs=_DIRS) -> str:
    name = f"{rng.choice(_WORDS)}{rng.randrange(100)}{rng.choice(_EXTS)}"
    folder = rng.choice(dirs)
    return f"{folder}/{name}" if folder else name


def _random_repo(tmp_path, rng) -> str:
    files = {_random_path(rng): f"line {i}\n" * rng.randint(1, 5) for i in range(60)}
    files.update({
        ".gitignore": "*.log\n/ignored_dir/\n!keep.log\n!re-included.pem\n",
        "src/.gitignore": "local_*\n",
        ".env.example": "A=\n", "run.sh": "echo hi\n", "config/.env": "TOKEN=base\n",
        "dist/app.js": "v1\n", "node_modules/lib/x.js": "x\n", "keys/id_rsa": "key\n",
        "src/pkg/__pycache__/m.cpython-311.pyc": "pyc\n", "link-target.txt": "target\n",
    })
    repo = str(tmp_path / "repo")
    os.makedirs(repo)
    run(repo, "init", "-q", "-b", "main")
    for name, text in files.items():
        write(os.path.join(repo, name), text)
    os.chmod(os.path.join(repo, "run.sh"), 0o755)
    os.symlink("link-target.txt", os.path.join(repo, "the link"))
    os.symlink("../docs", os.path.join(repo, "src/docs link"))
    run(repo, "add", "-A", "--force")
    # an unpopulated submodule: a gitlink at a commit that is not in this repository
    run(repo, "update-index", "--add", "--cacheinfo", f"160000,{'ab' * 20},vendor/lib")
    run(repo, "commit", "-q", "-m", "base")
    return os.path.realpath(repo)


def _write_new(path, name, text) -> None:
    """Write a file unless an earlier edit left a directory there or a file above it."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        above = os.path.join(path, *parts[:i])
        if os.path.lexists(above) and not os.path.isdir(above):
            return
    full = os.path.join(path, name)
    if not os.path.isdir(full):
        write(full, text)


def _random_edit(path, rng, round_no) -> None:
    """An agent's edit: modified, deleted, re-moded, retyped files; new files, some excluded."""
    tracked = [p for p in run(path, "ls-files", "-z").split("\0") if p]
    files = [p for p in tracked if os.path.isfile(os.path.join(path, p))
             and not os.path.islink(os.path.join(path, p))]
    rng.shuffle(files)
    for name in files[:6]:
        write(os.path.join(path, name), f"edited in round {round_no}: {rng.random()}\n")
    for name in files[6:9]:
        os.remove(os.path.join(path, name))
    for name in files[9:12]:
        os.chmod(os.path.join(path, name), rng.choice([0o755, 0o644]))
    if len(files) > 13:  # a file becomes a symlink, another a directory
        os.remove(os.path.join(path, files[12]))
        os.symlink(rng.choice(["link-target.txt", "nowhere", "../up"]),
                   os.path.join(path, files[12]))
        os.remove(os.path.join(path, files[13]))
        _write_new(path, files[13] + "/inside.txt", "now a directory\n")
    links = [p for p in tracked if os.path.islink(os.path.join(path, p))]
    if links and rng.random() < 0.5:
        os.remove(os.path.join(path, links[0]))
        write(os.path.join(path, links[0]), "a file where a link was\n")
    new_dirs = [*_DIRS, "new dir", "ignored_dir", "mixed/sub", ".venv/lib", "src/.pytest_cache"]
    for i in range(12):
        _write_new(path, _random_path(rng, new_dirs), f"new {round_no} {i}\n")
    for name in rng.sample([
            ".env", "src/.env.local", "x/__pycache__/a.pyc", "build/out.o", "debug.log",
            "keep.log", "re-included.pem", "src/local_x.py", "node_modules/new/y.js",
            "mixed/.env", "mixed/a.log", "only-ignored/.env", "ignored_dir/.env",
            "new\nline.txt", "tab\there.txt", "deep/er/.DS_Store", "sub/build/x.o"], 9):
        _write_new(path, name, f"excluded? {round_no}\n")
    # tracked files the patterns exclude: changed, deleted or retyped
    for name, action in (("config/.env", "edit"), ("dist/app.js", rng.choice(["edit", "delete"])),
                         ("node_modules/lib/x.js", rng.choice(["delete", "keep"])),
                         ("keys/id_rsa", rng.choice(["link", "keep"]))):
        full = os.path.join(path, name)
        if action == "keep" or not (os.path.isfile(full) or os.path.islink(full)):
            continue
        os.remove(full)
        if action == "edit":
            write(full, f"changed {round_no}\n")
        elif action == "link":
            os.symlink("elsewhere", full)
    if rng.random() < 0.3 and os.path.isdir(os.path.join(path, "vendor/lib")):
        os.rmdir(os.path.join(path, "vendor/lib"))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_manifest_matches_reference_on_random_edits(tmp_path, lock_dir, seed):
    """The fast manifest and manifest_digest return exactly what the original algorithm did:
    random edits over three rounds (with an agent commit between two of them), default,
    custom and no exclude patterns."""
    rng = random.Random(seed)
    repo = _random_repo(tmp_path, rng)
    path, info = new_worktree(repo, tmp_path, lock_dir, f"run-r{seed}")
    base = info["head"]
    statuses, excluded = set(), set()
    for round_no in range(3):
        _random_edit(path, rng, round_no)
        if round_no == 1:  # the agent commits (its own index now differs from base)
            run(path, "add", "-A")
            run(path, "commit", "-q", "-m", "agent commit")
        for excludes in (None, ["*.md", "docs/", "!docs/keep.md", "mixed/"], []):
            expected = reference_manifest(path, base, excludes)
            assert ws.manifest(path, base, excludes) == expected, (round_no, excludes)
            assert ws.manifest_digest(path, base, excludes) == expected["digest"]
            statuses.update(c["status"] for c in expected["changes"])
            excluded.update(expected["excluded"])
    # what the rounds covered (so the comparison is not vacuous)
    assert statuses == {"added", "deleted", "modified", "mode_changed", "type_changed"}
    assert "config/.env" in excluded and any(p.endswith("/") for p in excluded)


def test_manifest_sees_a_same_size_edit_made_in_the_second_of_the_checkout(repo, tmp_path,
                                                                           lock_dir):
    """Racy git: an edit keeping the size, in the second the worktree's index was written,
    leaves the entry's stat data matching (at git's one-second resolution). Only the index
    file's own modification time tells git to compare the content, so the manifest's copy of
    the index must keep it (a plain copy made a second later missed the edit)."""
    for attempt in range(5):
        time.sleep(1.02 - time.time() % 1)  # start just after a second turns: checkout and edit share it
        path, info = new_worktree(repo, tmp_path, lock_dir, f"run-racy-{attempt}")
        target = os.path.join(path, "src/app.py")
        write(target, "print(2)\n")  # the same size as "print(1)\n"
        own_index = run(path, "rev-parse", "--path-format=absolute", "--git-path", "index").strip()
        if int(os.stat(target).st_mtime) == int(os.stat(own_index).st_mtime):
            break
    else:
        raise AssertionError("five times, the checkout and the edit fell in different seconds")
    time.sleep(1.1)
    m = ws.manifest(path, info["head"])
    assert change_paths(m) == {"src/app.py": "modified"}
    assert ws.manifest_digest(path, info["head"]) == m["digest"]


def test_manifest_restores_excluded_paths_like_reference(tmp_path, lock_dir):
    """Tracked excluded files changed, deleted and retyped; a pattern-matched file let in by a
    repository "!" rule; a tracked file whose kind changes so a directory pattern matches."""
    repo = make_repo(tmp_path / "repo", {
        "README.md": "hello\n", ".gitignore": "!secret.pem\n", "config/.env": "A=1\n",
        "dist/app.js": "v1\n", "build": "a file named build\n", "keys/a.pem": "k\n",
    })
    path, info = new_worktree(repo, tmp_path, lock_dir, "run-restore")
    write(os.path.join(path, "config/.env"), "A=2\n")
    os.remove(os.path.join(path, "dist/app.js"))
    os.remove(os.path.join(path, "keys/a.pem"))
    os.symlink("elsewhere", os.path.join(path, "keys/a.pem"))
    write(os.path.join(path, "secret.pem"), "let in by the repository, kept out by the patterns\n")
    os.remove(os.path.join(path, "build"))
    write(os.path.join(path, "build/out.o"), "now a directory\n")
    write(os.path.join(path, "README.md"), "changed\n")
    m = ws.manifest(path, info["head"])
    assert m == reference_manifest(path, info["head"])
    assert ws.manifest_digest(path, info["head"]) == m["digest"]
    # git matches a directory-only pattern ("build/") against what is at the path in the
    # working tree: the tracked file "build", now a directory, keeps its base state.
    assert change_paths(m) == {"README.md": "modified"}
    assert m["excluded"] == ["build", "config/.env", "dist/app.js", "keys/a.pem", "secret.pem"]


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def test_commit_checkpoint_reuse_trailer_and_head_moved(repo, tmp_path, lock_dir):
    path, info = new_worktree(repo, tmp_path, lock_dir, "run-5")
    base = info["head"]
    same = ws.manifest(path, base)
    assert ws.commit_checkpoint(path, "cp/run-5", same["tree"], base, "Nothing", {}) == {
        "commit": base, "created": False}

    write(os.path.join(path, "src/app.py"), "print('stage 1')\n")
    write(os.path.join(path, ".env"), "SECRET=1\n")
    m = ws.manifest(path, base)
    cp = ws.commit_checkpoint(path, "cp/run-5", m["tree"], base, "Stage 1: implement\n\nBody.",
                              {"Checkpoint-Id": "journal-42", "Run": "5"})
    assert cp["created"] is True
    new = cp["commit"]
    assert ws.branch_tip(repo, "cp/run-5") == new
    assert run(path, "rev-parse", "HEAD").strip() == new
    assert run(path, "rev-parse", f"{new}^").strip() == base
    assert run(path, "log", "-1", "--format=%an <%ae>|%cn <%ce>", new).strip() == (
        "Control Panel <engine@controlpanel.local>|Control Panel <engine@controlpanel.local>")
    message = run(path, "log", "-1", "--format=%B", new)
    assert message.startswith("Stage 1: implement\n\nBody.\n\nCheckpoint-Id: journal-42\nRun: 5")
    # Index agrees with the new commit; working files untouched.
    assert run(path, "status", "--porcelain") == "?? .env\n"

    assert ws.find_commit_with_trailer(repo, "cp/run-5", "Checkpoint-Id", "journal-42") == new
    assert ws.find_commit_with_trailer(repo, "cp/run-5", "checkpoint-id", "journal-42") == new
    assert ws.find_commit_with_trailer(repo, "cp/run-5", "Checkpoint-Id", "journal-4") is None
    assert ws.find_commit_with_trailer(repo, "cp/run-5", "Run", "journal-42") is None
    assert ws.find_commit_with_trailer(repo, "cp/absent", "Checkpoint-Id", "x") is None

    # Unchanged since the checkpoint: reuse.
    again = ws.manifest(path, base)
    assert again["tree"] == m["tree"]
    assert ws.commit_checkpoint(path, "cp/run-5", again["tree"], new, "Stage 2", {}) == {
        "commit": new, "created": False}

    # The branch moved away from the expected parent: refused, nothing changed.
    write(os.path.join(path, "src/app.py"), "print('stage 2')\n")
    m2 = ws.manifest(path, base)
    run(path, "commit", "-q", "--allow-empty", "-m", "agent moved the branch")
    moved = ws.branch_tip(repo, "cp/run-5")
    with pytest.raises(WorkspaceError) as err:
        ws.commit_checkpoint(path, "cp/run-5", m2["tree"], new, "Stage 2", {})
    assert err.value.code == "head_moved"
    assert ws.branch_tip(repo, "cp/run-5") == moved

    # A detached worktree HEAD is refused too.
    run(path, "checkout", "-q", "--detach")
    with pytest.raises(WorkspaceError) as err:
        ws.commit_checkpoint(path, "cp/run-5", m2["tree"], moved, "Stage 2", {})
    assert err.value.code == "head_moved"
    assert ws.branch_tip(repo, "cp/run-5") == moved

    with pytest.raises(ValueError):
        ws.commit_checkpoint(path, "cp/run-5", m2["tree"], moved, "x", {"Bad Key": "v"})
    with pytest.raises(ValueError):
        ws.commit_checkpoint(path, "cp/run-5", m2["tree"], moved, "x", {"Key": "a\nb"})


def test_git_failure_is_reported(repo):
    with pytest.raises(WorkspaceError) as err:
        ws.git(["cat-file", "-t", "0" * 40], repo)
    assert err.value.code == "git_failed"
    assert "cat-file" in err.value.message
    proc = ws.git(["cat-file", "-t", "0" * 40], repo, check=False)
    assert proc.returncode != 0 and isinstance(proc.stderr, bytes)


def test_resetting_to_a_final_checkpoint_keeps_no_file_list_of_it(repo, tmp_path, lock_dir):
    """The final verification resets the worktree to each run's own final checkpoint: a commit read
    once. Its file list must not join the base commits' kept in the worker (about 7 MB per 20,000
    files each, bench/worker_memory.py), nor push a stage's base out."""
    path, _ = new_worktree(repo, tmp_path, lock_dir)
    base = head(repo)
    ws.manifest(path, base)  # a stage's base: kept
    assert base in git_manifests._BASE_FILES
    checkpoints = []
    for n in range(git_manifests._BASE_FILES_KEPT + 1):
        write(os.path.join(path, "src", "app.py"), f"print({n})\n")
        run(path, "add", "-A")
        run(path, "commit", "-q", "-m", f"checkpoint {n}")
        checkpoints.append(run(path, "rev-parse", "HEAD").strip())
        assert ws.reset_to_commit(path, checkpoints[-1])
    assert base in git_manifests._BASE_FILES
    assert not set(checkpoints) & set(git_manifests._BASE_FILES)
