"""What the adapters of real agent CLIs share (engine/agents/claude.py, engine/agents/codex.py).

* ``find_executable``: the profile's ``executable``, else the project's pinned install in
  tools/agents (``TOOLS_BIN``), else the name on PATH;
* ``cli_version`` and ``probe``: ``--version``'s first line and the help text, the latter cached
  by path, modification time and help arguments;
* ``endpoint_turns``: the scripted model endpoint's scenario of one attempt (simulated runs);
* ``CliAdapter``: the ``Adapter`` base of a real CLI: ``check`` (the binary, its version, the
  help words each role's boundary needs, the operating-system sandbox), ``version`` and
  ``supervise`` (the attempt in the subclass's sandbox, ``wrapper``, with the prompt on stdin).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from . import sandbox
from .base import Adapter, AgentRequest

BASE_DIR = Path(__file__).resolve().parent.parent.parent
TOOLS_BIN = BASE_DIR / "tools" / "agents" / "node_modules" / ".bin"

var_dir = sandbox.var_dir


def find_executable(name: str, configured: str | None = None) -> str | None:
    """The CLI to run: the profile's ``executable`` (a path or a name on PATH), else the
    project's pinned install in tools/agents, else ``name`` on PATH; None when none exists."""
    if configured:
        if os.sep in configured:
            return configured if os.access(configured, os.X_OK) else None
        return shutil.which(configured)
    pinned = TOOLS_BIN / name
    if os.access(pinned, os.X_OK):
        return str(pinned)
    return shutil.which(name)


def cli_version(executable: str, timeout: float = 30.0) -> str:
    """``<executable> --version``'s first line, or '' when it does not answer."""
    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0][:200] if text else ""


_checked: dict[tuple, tuple[str, str]] = {}


def probe(executable: str, timeout: float = 30.0, help_args: tuple[str, ...] = ("--help",)) -> tuple[str, str]:
    """``(version, help text)`` of an executable (``--version``'s first line, the output of
    ``help_args``), cached by path, modification time and help arguments; ``("", "")`` when the
    file cannot be read."""
    try:
        key = (os.path.realpath(executable), os.stat(executable).st_mtime_ns, help_args)
    except OSError:
        return "", ""
    if key not in _checked:
        helptext = ""
        try:
            out = subprocess.run([executable, *help_args], capture_output=True, text=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL)
            helptext = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired):
            pass
        _checked[key] = (cli_version(executable, timeout), helptext)
    return _checked[key]


def endpoint_turns(spec: dict | None, stage_key: str, operation: str):
    """The scripted endpoint's scenario for one attempt, or None (a real model)."""
    if not spec:
        return None
    stage = ((spec.get("stages") or {}).get(stage_key) or {}).get(operation)
    if stage is None:
        stage = spec.get("default")
    return stage if stage is not None else []  # nothing scripted: the endpoint says so and ends


class CliAdapter(Adapter):
    """What the adapters of real CLIs share: the executable (``executable_name``) and its version."""

    executable_name = ""
    #: How the help text is asked for, as named in messages (e.g. ``claude --help``), and its arguments.
    help_command = ""
    help_args: tuple[str, ...] = ("--help",)
    #: Words of the help text that must be there for every role.
    common_help: tuple[str, ...] = ()
    #: What the sandbox problem keeps from being enforced, for the message.
    sandbox_boundary = ""

    def required_help(self, role: str) -> dict[str, str]:
        """``{word of the help text: the boundary it enforces}`` that ``role`` needs."""
        return {}

    def sandbox_available(self) -> tuple[bool, str]:
        """``(True, path)`` when this CLI's operating-system sandbox can be made here."""
        return sandbox.available()

    def check(self, profile: dict, role: str) -> list[str]:
        """Problems that keep ``profile`` from playing ``role`` (empty when it can): the binary is
        missing, ``--version`` does not answer, a word the role's boundary needs is not in the
        help text (the boundary is named), or the operating-system sandbox cannot be made."""
        exe = find_executable(self.executable_name, profile.get("executable"))
        if exe is None:
            return [f"the {self.executable_name} executable was not found (profile executable: "
                    f"{profile.get('executable') or 'not set'}; run `make agents`)"]
        version, helptext = probe(exe, help_args=self.help_args)
        if not version:
            return [f"{exe} --version does not answer"]
        problems = [f"{word} is not in `{self.help_command}`, so it cannot enforce: {boundary}"
                    for word, boundary in self.required_help(role).items() if word not in helptext]
        problems += [f"{word} is not in `{self.help_command}`" for word in self.common_help if word not in helptext]
        ok, why = self.sandbox_available()
        if not ok:
            problems.append(f"no operating-system sandbox, so nothing {self.sandbox_boundary}: {why}")
        return problems

    def version(self, profile: dict) -> str:
        exe = find_executable(self.executable_name, profile.get("executable"))
        return cli_version(exe) if exe else ""

    #: The adapter's sandbox builder, ``(argv, env, request, network) -> argv``: each subclass sets
    #: its own (engine/agents/claude.py and engine/agents/codex.py ``sandboxed``).
    wrapper: Callable[..., list[str]]

    def supervise(self, argv: list[str], env: dict, request: AgentRequest, endpoint_url: str | None = None):
        """Run ``argv`` for the attempt in its sandbox with its egress proxy (``Adapter.sandboxed_run``),
        the prompt file on stdin; ``endpoint_url``: the scripted endpoint of a simulated attempt."""
        return self.sandboxed_run(argv, env, request, self.wrapper, endpoint_url, stdin_path=request.prompt_path)
