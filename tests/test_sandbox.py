"""The bubblewrap sandbox of an agent (engine/agents/sandbox.py, engine/agents/cli_adapter.py ``sandboxed_view``,
engine/agents/codex/adapter.py ``sandboxed``), run for real: what a wrapped shell can read and write.

Each test lays out a var directory (another run's control records and worktree, a database
file, broker messages, this run's scratch folders and worktree), a worker HOME with fake
credentials, and runs ``sh -c`` through exactly the arguments the claude adapter uses (or the
codex adapter's, in the user-namespace mode with a private /tmp).
"""
import hashlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from engine.agents import AgentRequest, sandbox
from engine.agents.codex import adapter as codex_adapter
from engine.agents.claude.adapter import find_executable
from engine.agents.cli_adapter import sandboxed_view

from .conftest import git, make_repo

needs_bwrap = pytest.mark.skipif(not sandbox.available()[0], reason=f"no sandbox: {sandbox.available()[1]}")
pytestmark = needs_bwrap

SECRET = "s3cret-do-not-read"


def lay_out(root: Path, *, var_in_home: bool, repo_in_var: bool) -> dict:
    """A var directory with another run's files, a worker HOME with credentials, and this run's
    worktree of a repository (inside or outside var), its scratch folders and attempt HOME."""
    home = root / "worker-home"
    var = (home / "project" / "var") if var_in_home else (root / "var")
    for rel in (".codex/auth.json", ".claude/.credentials.json", ".ssh/id_ed25519"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(SECRET)
    other = {"control": var / "runs" / "7-other" / "control.json", "worktree": var / "worktrees" / "7-other" / "a.py",
             "database": var / "controlpanel.sqlite3", "broker": var / "broker" / "queue" / "msg.json",
             "scratch": var / "scratch" / "run-7" / "data" / "kept.txt"}
    for path in other.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(SECRET)
    origin = make_repo((var / "repos" / "origin") if repo_in_var else (root / "origin"),
                       {"README.md": "hello\n", "app.py": "x = 1\n"})
    worktree = var / "worktrees" / "1-abcdef12"
    git(origin, "worktree", "add", "-q", "-b", "agent/1", str(worktree), "main")
    scratch = var / "scratch" / "run-1"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(scratch / "home" / "attempt-001"),
           "TMPDIR": str(scratch / "tmp"), "CP_DATA_DIR": str(scratch / "data"), "LANG": "C.UTF-8",
           "GIT_TERMINAL_PROMPT": "0"}
    for key in ("TMPDIR", "CP_DATA_DIR", "HOME"):
        os.makedirs(env[key], exist_ok=True)
    return {"home": home, "var": var, "other": other, "origin": origin, "worktree": worktree, "env": env}


@pytest.fixture(params=[(False, False), (True, True)], ids=["var-apart", "var-in-home-repo-in-var"])
def layout(request, tmp_path, monkeypatch, settings):
    var_in_home, repo_in_var = request.param
    found = lay_out(tmp_path, var_in_home=var_in_home, repo_in_var=repo_in_var)
    monkeypatch.setenv("HOME", str(found["home"]))  # the worker's HOME, as os.path.expanduser sees it
    settings.VAR_DIR = found["var"]
    return found


def run_in(layout: dict, role: str, script: str, argv0: str = "/bin/sh",
           wrapper=sandboxed_view) -> subprocess.CompletedProcess:
    """``sh -c script`` in the worktree, wrapped the way the claude adapter wraps its CLI for ``role``
    (``wrapper``: or the codex adapter's ``sandboxed``)."""
    env = layout["env"]
    request = AgentRequest(role=role, operation="implement", prompt="", workspace=str(layout["worktree"]),
                           profile={}, deadline_seconds=30, log_path="", raw_path="", env=env, stage_key="s",
                           attempt_number=1, control_dir=str(layout["var"] / "runs" / "1-abcdef12"),
                           home_dir=env["HOME"])
    argv = wrapper([argv0, "-c", script], env, request)
    return subprocess.run(argv, cwd=str(layout["worktree"]), env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("role", ["implementer", "reviewer"])
def test_other_runs_the_database_and_the_workers_home_are_hidden(layout, role):
    targets = [*layout["other"].values(), layout["home"] / ".codex" / "auth.json",
               layout["home"] / ".claude" / ".credentials.json", layout["home"] / ".ssh" / "id_ed25519"]
    for target in targets:
        out = run_in(layout, role, f"cat '{target}'")
        assert out.returncode != 0 and SECRET not in out.stdout, (target, out.stdout)
        assert "No such file or directory" in out.stderr, (target, out.stderr)
    listing = run_in(layout, role, f"ls -a '{layout['var']}' '{layout['var']}/worktrees' '{layout['var']}/scratch'")
    assert "7-other" not in listing.stdout and "run-7" not in listing.stdout and "broker" not in listing.stdout
    assert "1-abcdef12" in listing.stdout and "run-1" in listing.stdout, listing.stdout + listing.stderr
    grep = run_in(layout, role, f"grep -rl {SECRET} '{layout['var']}' '{layout['home']}' 2>/dev/null; true")
    assert grep.stdout.strip() == ""


@pytest.mark.parametrize("role", ["implementer", "reviewer"])
def test_nothing_outside_its_own_folders_is_writable(layout, role):
    for target in (layout["var"] / "runs" / "x.txt", layout["var"] / "x.txt", layout["home"] / "x.txt",
                   layout["var"] / "worktrees" / "x.txt", layout["origin"] / ".git" / "x.txt"):
        out = run_in(layout, role, f"echo x > '{target}'")
        assert not target.exists(), target  # never on the host
        if not str(target.resolve()).startswith("/tmp/"):  # under /tmp: the sandbox's own tmpfs, gone with it
            assert out.returncode != 0, target
    out = run_in(layout, role, "echo 'gitdir: /tmp/elsewhere' > .git")
    assert out.returncode != 0 and "Read-only file system" in out.stderr
    for key in ("HOME", "TMPDIR", "CP_DATA_DIR"):  # its own folders are
        out = run_in(layout, role, f'echo ok > "${key}/written" && cat "${key}/written"')
        assert out.stdout == "ok\n", (key, out.stderr)
        assert (Path(layout["env"][key]) / "written").read_text() == "ok\n"


def test_the_writer_reads_and_writes_its_worktree(layout):
    out = run_in(layout, "implementer", "cat README.md && echo 'x = 2' > app.py && echo new > new.txt")
    assert out.returncode == 0 and out.stdout == "hello\n", out.stderr
    assert (layout["worktree"] / "app.py").read_text() == "x = 2\n" and (layout["worktree"] / "new.txt").exists()


def test_the_reviewer_reads_but_cannot_write_its_worktree(layout):
    out = run_in(layout, "reviewer", "cat README.md && ls")
    assert out.returncode == 0 and out.stdout.startswith("hello\n") and "app.py" in out.stdout, out.stderr
    for script in ("echo 'x = 2' > app.py", "echo new > new.txt", "rm README.md", "mkdir d"):
        out = run_in(layout, "reviewer", script)
        assert out.returncode != 0 and "Read-only file system" in out.stderr, (script, out.stderr)
    assert (layout["worktree"] / "app.py").read_text() == "x = 1\n"
    assert sorted(p.name for p in layout["worktree"].iterdir()) == [".git", "README.md", "app.py"]


@pytest.mark.parametrize("role", ["implementer", "reviewer"])
def test_git_works_in_the_worktree_but_cannot_commit(layout, role):
    (layout["worktree"] / "app.py").write_text("x = 3\n")
    out = run_in(layout, role, "git status --porcelain && git log -1 --format=%s && git diff --stat")
    assert out.returncode == 0, out.stderr
    assert " M app.py" in out.stdout and "initial" in out.stdout and "app.py" in out.stdout
    head = git(layout["origin"], "rev-parse", "agent/1")
    out = run_in(layout, role, "git -c user.name=a -c user.email=a@b commit -qam agent")
    assert out.returncode != 0 and git(layout["origin"], "rev-parse", "agent/1") == head


def test_python_and_the_agent_cli_stay_runnable(layout):
    """The interpreter (its install may live under the hidden HOME, e.g. ~/.pyenv) and the pinned CLI."""
    out = run_in(layout, "implementer", f"'{sys.executable}' -c 'import json, sqlite3; print(42)'")
    assert out.stdout == "42\n", out.stderr
    claude = find_executable("claude")
    if claude:
        out = run_in(layout, "reviewer", f"'{claude}' --version")
        assert out.returncode == 0 and "Claude Code" in out.stdout, out.stderr


def test_wrap_hides_a_file_and_keeps_the_deeper_mount(tmp_path):
    """``hide`` of a file gives /dev/null; a visible folder inside a hidden one comes back read-only,
    a writable one inside it read-write, whatever the order of the lists."""
    secret = tmp_path / ".env"
    secret.write_text("DJANGO_SECRET_KEY=x\n")
    hidden = tmp_path / "hidden"
    (hidden / "tools").mkdir(parents=True)
    (hidden / "tools" / "t").write_text("tool\n")
    (hidden / "other").write_text(SECRET)
    work = hidden / "tools" / "work"
    argv = sandbox.wrap(["sh", "-c", f"cat {secret}; cat {hidden}/tools/t; cat {hidden}/other; "
                        f"echo w > {work}/w; echo t > {hidden}/tools/x; echo h > {hidden}/h; true"],
                        writable=[str(work)], hide=[str(secret), str(hidden)], visible=[str(hidden / "tools")])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.stdout == "tool\n", out
    assert "DJANGO" not in out.stdout and SECRET not in out.stdout
    assert (work / "w").read_text() == "w\n"
    assert not (hidden / "tools" / "x").exists() and not (hidden / "h").exists()
    # tools/ is bound read-only, and hidden/ stays a read-only empty folder in the sandbox's own /tmp
    assert out.stderr.count("Read-only file system") == 2, out.stderr
    assert "/dev/null" in argv and secret.read_text() == "DJANGO_SECRET_KEY=x\n"


def test_a_tool_installed_under_the_workers_home_runs_but_its_credentials_stay_hidden(layout):
    """A PATH folder under the hidden HOME (``~/.cargo/bin``) comes back read-only with its install,
    except the credentials files known to live there."""
    cargo = layout["home"] / ".cargo"
    (cargo / "bin").mkdir(parents=True)
    (cargo / "bin" / "mytool").write_text("#!/bin/sh\ncat \"$(dirname \"$0\")/../share.txt\"\n")
    (cargo / "bin" / "mytool").chmod(0o755)
    (cargo / "share.txt").write_text("tool data\n")
    (cargo / "credentials.toml").write_text(SECRET)
    layout["env"]["PATH"] = f"{cargo / 'bin'}{os.pathsep}{layout['env']['PATH']}"
    out = run_in(layout, "implementer", "mytool; cat ~/.cargo/credentials.toml " + str(cargo / "credentials.toml"))
    assert out.stdout == "tool data\n", out.stderr
    assert SECRET not in out.stdout
    out = run_in(layout, "implementer", f"ls -a '{layout['home']}'")
    assert out.stdout.split() == [".", "..", ".cargo"] or out.stdout.split() == [".", "..", ".cargo", "project"]


def test_root_in_the_sandbox_cannot_unmount_or_remount_its_way_out(layout):
    """Without ``--cap-drop ALL`` bubblewrap started by root leaves root its capabilities: it
    could unmount the tmpfs hiding the var directory or remount a read-only bind read-write."""
    control = layout["other"]["control"]
    script = (f"grep CapEff /proc/self/status; umount '{layout['var']}'; umount -l '{layout['var']}'; "
              f"cat '{control}'; mount -o remount,rw,bind .git; echo 'gitdir: /tmp/elsewhere' > .git; "
              f"unshare -U -r -m sh -c \"umount -l '{layout['var']}'; cat '{control}'\"; true")
    out = run_in(layout, "implementer", script)
    assert "CapEff:\t0000000000000000" in out.stdout, out.stdout
    assert SECRET not in out.stdout, out
    assert (layout["worktree"] / ".git").read_text().startswith("gitdir: ") and "elsewhere" not in out.stdout
    assert "/tmp/elsewhere" not in (layout["worktree"] / ".git").read_text()


def run_codex_wrapped(layout: dict, role: str, script: str) -> subprocess.CompletedProcess:
    return run_in(layout, role, script, wrapper=codex_adapter.sandboxed)


needs_user_namespace = pytest.mark.skipif(not sandbox.user_namespace_available()[0],
                                          reason=f"no user-namespace sandbox: {sandbox.user_namespace_available()[1]}")


@needs_user_namespace
@pytest.mark.parametrize("role", ["implementer", "reviewer"])
def test_the_user_namespace_mode_hides_and_binds_back_the_same(layout, role):
    """codex's wrap: the same hidden and writable folders as claude's, as uid SANDBOX_UID, with a
    private writable /tmp (the layout lies under /tmp: what it needs is bound back into it)."""
    targets = [*layout["other"].values(), layout["home"] / ".codex" / "auth.json",
               layout["home"] / ".ssh" / "id_ed25519"]
    for target in targets:
        out = run_codex_wrapped(layout, role, f"cat '{target}'")
        assert out.returncode != 0 and SECRET not in out.stdout and "No such file or directory" in out.stderr, target
    listing = run_codex_wrapped(layout, role, f"ls -a '{layout['var']}/worktrees' '{layout['var']}/scratch'")
    assert "7-other" not in listing.stdout and "run-7" not in listing.stdout
    assert "1-abcdef12" in listing.stdout and "run-1" in listing.stdout, listing.stdout + listing.stderr
    for key in ("HOME", "TMPDIR", "CP_DATA_DIR"):
        out = run_codex_wrapped(layout, role, f'echo ok > "${key}/written" && cat "${key}/written"')
        assert out.stdout == "ok\n", (key, out.stderr)
        assert (Path(layout["env"][key]) / "written").read_text() == "ok\n"
    probe = f"/tmp/cp-private-tmp-{uuid.uuid4().hex}"
    out = run_codex_wrapped(layout, role, f"id -u; echo t > {probe} && cat {probe}; git status --porcelain; "
                                          f"cat README.md")
    assert out.stdout.split("\n")[:3] == [str(sandbox.SANDBOX_UID), "t", "hello"], out
    assert not os.path.exists(probe)  # the sandbox's own /tmp, gone with it
    out = run_codex_wrapped(layout, role, "echo 'x = 2' > app.py; echo 'gitdir: /tmp/elsewhere' > .git")
    if role == "implementer":
        assert (layout["worktree"] / "app.py").read_text() == "x = 2\n"
    else:
        assert out.stderr.count("Read-only file system") == 2
        assert (layout["worktree"] / "app.py").read_text() == "x = 1\n"
    assert "/tmp/elsewhere" not in (layout["worktree"] / ".git").read_text()
    for target in (layout["var"] / "x.txt", layout["home"] / "x.txt", layout["origin"] / ".git" / "x.txt"):
        written = run_codex_wrapped(layout, role, f"echo x > '{target}'")
        assert not target.exists()  # never on the host; under /tmp it lands in the sandbox's own tmpfs
        assert written.returncode != 0 or str(target.resolve()).startswith("/tmp/")


@needs_user_namespace
def test_the_user_namespace_mode_nests_a_sandbox_and_still_cannot_be_undone(layout):
    """A bubblewrap inside it can make its own user namespace (what codex's sandbox does for every
    command), while no mount of the outer one can be unmounted or remounted, neither directly nor
    from a user namespace of the agent's own (there they are locked), and the host's processes
    cannot be signalled."""
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    control, key = layout["other"]["control"], layout["home"] / ".ssh" / "id_ed25519"
    undo = ("for m in $(awk '{print $5}' /proc/self/mountinfo | sort -r); do umount -l \"$m\" 2>/dev/null && "
            f"echo unmounted $m; done; mount -o remount,rw / && echo remounted; cat '{control}' '{key}'")
    bwrap = sandbox.bwrap_path()
    script = (f"'{bwrap}' --ro-bind / / --dev /dev --unshare-user --unshare-pid --unshare-net -- "
              "sh -c 'echo nested-ok'; "
              f"grep CapEff /proc/self/status; kill -9 {bystander.pid}; {undo}; "
              f"unshare -U -r -m sh -c \"{undo.replace(chr(34), chr(92) + chr(34)).replace('$', chr(92) + '$')}\"; "
              f"'{bwrap}' --bind / / --unshare-user --uid 0 -- sh -c \"cat '{control}'\"; "
              "mount -o remount,rw,bind .git; echo 'gitdir: /tmp/elsewhere' > .git; touch /cp-root-was-here; true")
    try:
        out = run_codex_wrapped(layout, "implementer", script)
        assert bystander.poll() is None, out  # still alive: its own PID namespace
    finally:
        bystander.kill()
        bystander.wait()
    assert "nested-ok" in out.stdout and "CapEff:\t0000000000000000" in out.stdout, out
    assert "No such process" in out.stderr, out.stderr
    assert "unmounted" not in out.stdout and "remounted" not in out.stdout and SECRET not in out.stdout, out
    assert out.stderr.count(f"{control}: No such file or directory") == 3, out.stderr
    assert not os.path.exists("/cp-root-was-here")
    assert "/tmp/elsewhere" not in (layout["worktree"] / ".git").read_text()


@pytest.mark.slow
@pytest.mark.skipif(find_executable("claude") is None, reason="run `make agents` to install the pinned claude CLI")
def test_the_real_claude_works_in_the_sandbox_and_its_shell_sees_nothing_private(layout):
    """The pinned claude (against the scripted endpoint) runs with its var directory and the
    worker's HOME hidden; its Bash tool cannot read them, and it still edits its worktree."""
    from engine.agents.claude.adapter import ClaudeCodeAdapter

    control = layout["var"] / "runs" / "1-abcdef12"
    control.mkdir(parents=True)
    (control / "prompt.md").write_text("Do it.\n")
    look = (f"cat '{layout['other']['control']}' '{layout['home']}/.claude/.credentials.json' "
            f"'{layout['other']['database']}'; git status --short; echo rc=$?")
    scenario = {"turns": [
        {"tools": [{"tool": "Bash", "input": {"command": look, "description": "look around"}}]},
        {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/app.py"}}]},
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/app.py", "content": "x = 42\n"}}]},
        {"text": "Done."}]}
    env = {**os.environ, **layout["env"]}
    request = AgentRequest(
        role="implementer", operation="implement", prompt="Do it.", workspace=str(layout["worktree"]),
        profile={"adapter": "claude-code", "max_turns": 6, "scripted_endpoint": {"default": scenario}},
        deadline_seconds=60, log_path=str(control / "out.log"), raw_path=str(control / "out.raw"), env=env,
        stage_key="s", attempt_number=1, control_dir=str(control), prompt_path=str(control / "prompt.md"),
        home_dir=layout["env"]["HOME"])
    result = ClaudeCodeAdapter().run(request)
    raw = (control / "out.raw").read_text()
    assert result.exit_code == 0 and result.failure_kind is None, raw[-3000:]
    assert SECRET not in raw and "No such file or directory" in raw and "rc=0" in raw
    assert (layout["worktree"] / "app.py").read_text() == "x = 42\n"


@needs_bwrap
def test_the_user_namespace_sandbox_works_wherever_bubblewrap_does():
    """Codex needs it; a probe that fails here (for example because the project, and so the bundled
    bubblewrap, lies under /tmp) must fail the suite, not skip the codex tests."""
    ok, why = sandbox.user_namespace_available()
    assert ok, why


def test_a_path_folder_in_tmp_never_shows_the_hosts_tmp(tmp_path):
    """A PATH entry such as /tmp/bin names its folder, not /tmp, and /tmp is always the sandbox's own."""
    secret = Path("/tmp") / f"cp-host-tmp-{uuid.uuid4().hex}"
    secret.write_text(SECRET)
    try:
        argv = sandbox.wrap(["sh", "-c", f"cat {secret}; ls /tmp"], writable=[str(tmp_path / "w")],
                            visible=["/tmp", "/"])
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert SECRET not in out.stdout and secret.name not in out.stdout, out
    finally:
        secret.unlink()


def test_a_path_given_through_a_symlink_works_inside(tmp_path):
    """Binds are of real paths; a tool or folder named through a symlink (a project's .venv linked
    from elsewhere) finds the same symlink inside the sandbox."""
    real = tmp_path / "real"
    (real / "bin").mkdir(parents=True)
    tool = real / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho tool-ran\n")
    tool.chmod(0o755)
    (tmp_path / "linked").symlink_to(real)
    argv = sandbox.wrap([str(tmp_path / "linked" / "bin" / "tool")], writable=[str(tmp_path / "w")],
                        visible=[str(tmp_path / "linked")])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.stdout == "tool-ran\n", out


def test_a_chain_of_symlinks_on_the_way_works_inside(tmp_path):
    real = tmp_path / "real"
    (real / "bin").mkdir(parents=True)
    (real / "bin" / "f").write_text("through the chain\n")
    (tmp_path / "mid").mkdir()
    (tmp_path / "mid" / "venvlink").symlink_to(real)
    (tmp_path / "chain").symlink_to(tmp_path / "mid" / "venvlink")
    argv = sandbox.wrap(["cat", str(tmp_path / "chain" / "bin" / "f")], writable=[str(tmp_path / "w")],
                        visible=[str(tmp_path / "chain" / "bin")])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.stdout == "through the chain\n", out


@needs_user_namespace
@pytest.mark.skipif(sandbox.bundled_bwrap() is None, reason="the pinned codex package is not installed (make agents)")
@pytest.mark.parametrize("host_bwrap", [False, True], ids=["machine-path", "stand-in-first-on-path"])
def test_every_bwrap_codex_can_find_is_its_bundled_one(layout, tmp_path, host_bwrap, role="implementer"):
    """codex 0.171.0 starts the first ``bwrap`` on PATH, else its bundled candidate; Debian's 0.8.0
    (no ``--argv0``) fails every command it runs with "execvp codex-linux-sandbox". In codex's wrap
    the bwrap codex would start is the bundled file, read-only, whatever the host has.

    ``stand-in-first-on-path`` makes the host case here rather than taking it from the machine: a
    stand-in for Debian's bubblewrap (it refuses ``--argv0``) in a folder first on the agent's PATH.
    ``machine-path`` is the machine's own PATH: with no ``bwrap`` on it (a fresh machine, CI) codex
    takes its bundled candidate; with Debian's bubblewrap installed, that file is replaced in the view."""
    bundled_path = sandbox.bundled_bwrap()
    bundled = hashlib.sha256(Path(bundled_path).read_bytes()).hexdigest()
    host_bin = tmp_path / "host-bin"
    host_bin.mkdir()
    stand_in = host_bin / "bwrap"
    stand_in.write_text("#!/bin/sh\necho 'bwrap: Unknown option --argv0' >&2\nexit 1\n")
    stand_in.chmod(0o755)
    if host_bwrap:
        layout["env"]["PATH"] = os.pathsep.join([str(host_bin), layout["env"]["PATH"]])
    # codex's choice: the first bwrap on PATH, else its bundled candidate (the path it was shipped at)
    out = run_codex_wrapped(layout, role, f"chosen=$(command -v bwrap || echo '{bundled_path}'); "
                                          f"for f in \"$chosen\" $(which -a bwrap) {stand_in}; "
                                          "do [ -e \"$f\" ] && sha256sum \"$f\"; done; "
                                          "\"$chosen\" --argv0 named --ro-bind / / -- sh -c 'echo \"$0\"'; "
                                          "echo x >> \"$chosen\" || echo refused")
    found = dict(reversed(line.split()) for line in out.stdout.splitlines() if line.count(" /") == 1)
    assert found and set(found.values()) == {bundled}, (found, out.stderr)  # reachable, and only the bundled one
    assert (str(stand_in) in found) is host_bwrap, found  # the stand-in is seen only where it is on PATH
    assert "named" in out.stdout.splitlines() and "refused" in out.stdout.splitlines(), out
    assert "Unknown option" in stand_in.read_text()  # the host's file untouched


def test_replace_binds_a_file_only_over_the_read_only_view(tmp_path):
    """``wrap(replace=...)`` puts a host file read-only in the place of a file the view shows; a
    target inside a writable folder, or outside the view, is left alone."""
    ok, _ = sandbox.available()
    source = tmp_path / "tool"
    source.write_text("#!/bin/sh\necho replaced\n")
    writable = tmp_path / "work"
    writable.mkdir()
    (writable / "tool").write_text("mine\n")
    argv = sandbox.wrap(["true"], writable=[str(writable)], visible=[],
                        replace={"/usr/bin/env": str(source), str(writable / "tool"): str(source),
                                 str(tmp_path / "elsewhere"): str(source)})
    pairs = [(argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg == "--ro-bind"]
    assert (str(source), "/usr/bin/env") in pairs
    assert all(target not in (str(writable / "tool"), str(tmp_path / "elsewhere")) for _, target in pairs)
