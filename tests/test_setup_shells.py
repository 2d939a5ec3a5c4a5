"""Every CLI's shell sees the setup's environment (engine/environments.py): the real claude, codex,
gemini and pi, each driven by the scripted model endpoint, run the repository's test command in their
own shell tool (codex's is a login shell, `bash -lc`), which passes only with the environment's
python (a module only it holds) and node_modules/.bin first on PATH; the conversation shows the
command's exit status 0. And none of them can write into the environment."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from engine.text import transcript
from engine.agents import AgentRequest, get_adapter
from engine.agents.claude.adapter import find_executable
from engine.environments import MOUNT, Environment
from engine.model_gateway.conversation import conversation_path

from .conftest import make_repo

pytestmark = pytest.mark.slow

#: The repository's test command: unittest, whose test imports a module only the environment has.
TEST_COMMAND = ("python -c 'import sys; print(\"prefix\", sys.prefix)' && js-tool && python -m unittest -q "
                "&& (touch \"$CP_ENV/planted\" 2>/dev/null && echo PLAN\"\"TED || echo env-read-only)")
#: Its test also writes /tmp/foo and a temporary file, as real suites do (freezegun's sqlite tests open
#: /tmp/foo): every shell, as every gate, has a /tmp and a TMPDIR of the attempt's own.
REPO_FILES = {"README.md": "a library\n",
              "test_lib.py": "import tempfile\nimport unittest\n\nimport envonly\n\n\nclass T(unittest.TestCase):\n"
                             "    def test_it(self):\n        self.assertEqual(envonly.VALUE, 7)\n"
                             "        with open('/tmp/foo', 'w') as f:\n            f.write('x')\n"
                             "        with tempfile.NamedTemporaryFile() as f:\n            f.write(b'x')\n"}

#: Each CLI's shell tool and how the scripted endpoint names its command.
SHELLS = {
    "claude-code": ("claude", {"tool": "Bash", "input": {"command": TEST_COMMAND}}),
    "codex": ("codex", {"tool": "exec_command", "input": {"cmd": TEST_COMMAND}}),
    "gemini-cli": ("gemini", {"tool": "run_shell_command", "input": {"command": TEST_COMMAND}}),
    "pi": ("pi", {"tool": "bash", "input": {"command": TEST_COMMAND}}),
}


def _environment(folder: Path) -> Environment:
    """What a setup would have made: a venv (no pip) holding ``envonly``, and node_modules/.bin/js-tool."""
    env = Environment("test-" + uuid.uuid4().hex[:8], str(folder), ("node_modules",))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env.env_dir], check=True)
    site = next(Path(env.env_dir, "lib").glob("python3*/site-packages"))
    (site / "envonly.py").write_text("VALUE = 7\n")
    tool = Path(env.keep_dir("node_modules"), ".bin", "js-tool")
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho js-tool-ran\n")
    tool.chmod(0o755)
    return env


@pytest.mark.parametrize("adapter", sorted(SHELLS))
def test_each_clis_shell_runs_the_repository_tests_with_the_setups_environment(adapter, tmp_path):
    executable, call = SHELLS[adapter]
    if find_executable(executable) is None:
        pytest.skip(f"the pinned {executable} CLI is not installed: run `make agents`")
    work = make_repo(tmp_path / "work", REPO_FILES)
    environment = _environment(tmp_path / "environment")
    control = tmp_path / "control"
    control.mkdir()
    (control / "prompt.md").write_text("Run the tests.\n")
    env, binds = environment.apply({"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}, str(work))
    profile = {"adapter": adapter, "max_turns": 6,
               "scripted_endpoint": {"default": {"turns": [{**call, "text": "Running the tests."},
                                                           {"text": "The tests pass."}]}}}
    request = AgentRequest(role="implementer", operation="implement", prompt="Run the tests.", workspace=str(work),
                           profile=profile, deadline_seconds=120, log_path=str(control / "out.log"),
                           raw_path=str(control / "out.raw"), env=env, stage_key="s", attempt_number=1,
                           control_dir=str(control), prompt_path=str(control / "prompt.md"),
                           home_dir=str(tmp_path / "home"), marker=f"cp-test-{uuid.uuid4().hex[:12]}", binds=binds)
    result = get_adapter(adapter).run(request)
    log = Path(request.log_path).read_text(errors="replace")
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log[-3000:])
    raw = Path(request.raw_path).read_text(errors="replace") + log
    assert f"prefix {MOUNT}" in raw and "js-tool-ran" in raw and "env-read-only" in raw, raw[-3000:]
    assert "PLANTED" not in raw and not Path(environment.env_dir, "planted").exists()
    # the conversation the run page shows (what the engine's model gateway saw the CLI tell its model):
    # the command's exit status, 0; gemini's own stream leaves it out, the wire does not
    entries = [json.loads(line) for line in conversation_path(request.raw_path).read_text().splitlines()]
    results = [e for e in entries if e.get("kind") == "tool_result"]
    assert results and all(e.get("ok") for e in results), results
    assert [e.get("exit") for e in results] == [0], results
    if adapter != "gemini-cli":  # and the CLI's own account says the same
        cli = [json.loads(line) for line in transcript.transcript_path(request.raw_path).read_text().splitlines()]
        assert [e.get("exit") for e in cli if e.get("kind") == "tool_result"] == [0], cli
