"""A hostile agent names files to drive the operator's terminal: ESC (clear the screen), OSC 52
ending in BEL (write the clipboard), CR (overwrite the line) and LF (forge a whole line of
output). The run stops for the stray files and names them; ``run_status`` (the summary, the
progress lines of ``--follow``) prints them escaped, never the bytes (engine/text/terminal.py), and
``--json`` keeps them as JSON escapes that decode to the names."""
import io
import json
import re

import pytest
from django.core.management import call_command

from engine import operations
from engine.models import Run

from ..conftest import ANSWER_STEP
from ..support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = ["clear\x1b[2J\x1b[H.txt", "clip\x1b]52;c;ZXZpbA==\x07.txt", "over\rrun 1 of p: succeeded.txt",
           "forge\nrun 1 of p: succeeded\n.txt", "c1\x9b2J\u202eevil.txt"]
#: Any C0 control but the line feed a command ends its own lines with, DEL, any C1 control.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")


def stopped_run(make_pipeline, repo, sent) -> Run:
    # the agent's own program names the files (a scenario's "write" refuses such names)
    names = json.dumps(HOSTILE)
    step = {**ANSWER_STEP, "run": ["python3", "-c", f"import json\nfor n in json.loads({names!r}): open(n, 'w').write('x')"]}
    run = operations.create_run(make_pipeline(scenario={"stages": {"answer": {"implement": [step]}}}), str(repo),
                                "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.stop_reason == "scope_violation", (run.status, run.stop_reason, run.stop_message)
    assert any(name in run.stop_message for name in HOSTILE), run.stop_message  # the names, raw, in the record
    return run


def test_run_status_prints_no_control_character_an_agent_chose(make_pipeline, repo, sent):
    run = stopped_run(make_pipeline, repo, sent)
    for options in ({}, {"follow": True, "timeout": 5, "interval": 0.1}):
        out, err = io.StringIO(), io.StringIO()
        call_command("run_status", str(run.pk), stdout=out, stderr=err, **options)
        text = out.getvalue() + err.getvalue()
        assert not CONTROL.search(text), (options, [m.group() for m in CONTROL.finditer(text)])
        assert "\\x1b[2J" in text and "\\x1b]52;c;ZXZpbA==\\x07" in text, text  # shown, as escapes
        lines = text.splitlines()
        assert not any(line.startswith("run 1 of p: succeeded") for line in lines), text  # no forged line
        assert "forge\\nrun 1 of p: succeeded\\n.txt" in text
    out = io.StringIO()
    call_command("run_status", str(run.pk), json=True, stdout=out)
    assert not CONTROL.search(out.getvalue())
    data = json.loads(out.getvalue())
    assert any(name in data["stop_message"] for name in HOSTILE)  # JSON keeps the names exactly


def test_a_command_error_naming_a_hostile_value_is_escaped(make_pipeline, repo, sent):
    """A refusal's message carries what it refuses; printed, it drives nothing either."""
    err = io.StringIO()
    from engine.management.commands.run_status import Command

    command = Command(stdout=io.StringIO(), stderr=err)
    command.stderr.write("refused: pipeline 'x\x1b]0;owned\x07' \rnot found\n")
    assert err.getvalue() == "refused: pipeline 'x\\x1b]0;owned\\x07' \\rnot found\n"


def test_the_processes_log_lines_escape_what_an_agent_named():
    """The worker's console log (controlpanel/settings.py LOGGING) names folders an agent made."""
    import logging

    from django.conf import settings

    from engine.text.terminal import SafeFormatter

    spec = settings.LOGGING["formatters"]["plain"]
    assert spec["()"] == "engine.text.terminal.SafeFormatter"
    record = logging.LogRecord("engine.runner", logging.WARNING, __file__, 1,
                               "nested repository at %s", ("x\x1b]0;PWNED\x07\x1b[2J/.git",), None)
    line = SafeFormatter(spec["format"]).format(record)
    assert "\x1b" not in line and "\x07" not in line and "x\\x1b]0;PWNED\\x07\\x1b[2J/.git" in line
