"""The Control Panel's secondary pages are readable: an attempt's page, a check's page (its log), the events
list, a pipeline's and a profile's page, and a run's record (controlpanel/admin.py, controlpanel/readable.py,
controlpanel/views/pages.py ``check_log``), read through the Django test client as a person reads their HTML.

The evidence is recorded, not produced: a run row with its stage (tests/conftest.py ``run_row``), an
attempt, a check, a manifest and events written here with their files in the run's control records, as a
worker leaves them; no worker, no git, no agent. The last test opens the pages in a 390 px wide Chromium
(slow: ``make test``).
"""
from __future__ import annotations

import datetime
import html
import os
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from controlpanel.readable import duration_text, moment_text, yaml_text
from controlpanel.views import CHECK_LOG_BYTES, seconds_text
from engine import operations
from engine.models import Attempt, Check, Decision, Profile, Run, RunEvent

from .conftest import navigate_by

pytestmark = pytest.mark.django_db

UTC = datetime.timezone.utc
#: When the recorded check started: a time with seconds and milliseconds to find on the pages.
STARTED = datetime.datetime(2025, 3, 4, 5, 6, 7, 891000, tzinfo=UTC)
COMMAND = ("python -m pytest -q --maxfail=1 \\\n    --deselect tests/test_core.py::test_slow "
           + " ".join(f"--option-{n}=value-{n}" for n in range(40)) + " && echo ALL-DONE-END-OF-COMMAND")
USAGE = {"input_tokens": 1234, "output_tokens": 56, "cached_tokens": None, "cache_creation_tokens": 7,
         "reasoning_tokens": None, "cost_usd": 0.0123}
VERDICT = {"verdict": "repair", "findings": [{"file": "app/core.py", "line": 4, "severity": "major",
                                              "text": "Say where 42 comes from."}]}
NETWORK = {"allow": ["api.example.invalid"], "connected": [{"host": "api.example.invalid", "port": 443,
                                                            "at": "2025-03-04T05:06:08Z"}], "refused": []}
#: An event's message longer than any column: its end must be on the page too.
LONG_MESSAGE = "The gate failed. " + "Because of many reasons, one after the other. " * 60 + "END-OF-THE-MESSAGE."
NOT_INCLUDED = [{"path": "notes.txt", "status": "untracked", "xy": "??"},
                {"path": "app/new_name.py", "status": "renamed", "xy": "R ", "orig_path": "app/old_name.py"}]


def record(run, rel: str, content: bytes | str) -> str:
    """Write a control record of ``run`` at ``rel`` (inside its control records); returns its recorded path."""
    path = f"{run.control_dir}/{rel}"
    target = Path(settings.VAR_DIR) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@pytest.fixture
def evidence(run_row):
    """A run stopped for review with the evidence of one stage: an implement attempt (files, usage, a verdict,
    refusals, network), a failed gate check with its log, a manifest, a decision and events. Returns a dict."""
    from engine.steps import save_manifest

    run = run_row(status="waiting_review", stage_statuses=("waiting_review",), worktree="/srv/worktrees/run-x",
                  branch="agent/run-x", not_included=NOT_INCLUDED, active_seconds=12.3456,
                  stop_reason="gate_failed", stop_message="Gate 'unit' failed.",
                  stop_evidence={"check": "unit", "exit_code": 1, "files": ["app/core.py", "app/extra.py"]})
    stage = run.stages.get()
    folder = "stages/01-answer/attempts/001-implement"
    change = {"path": "app/core.py", "status": "modified", "old_mode": "100644", "new_mode": "100644",
              "old_blob": "a" * 40, "new_blob": "b" * 40}
    manifest = save_manifest(run, stage, {"digest": "c" * 40, "base": run.commit, "tree": "c" * 40,
                                          "changes": [change], "excluded": [],
                                          "entries": [{"path": "app/core.py", "mode": "100644", "blob": "b" * 40}]})
    attempt = Attempt.objects.create(
        run=run, stage=stage, operation="implement", number=1, role="implementer", profile_name="scripted",
        adapter="scripted", simulated=True, deadline_seconds=600.0, status="succeeded", exit_code=0,
        elapsed_seconds=0.380757248000009, usage=USAGE, verdict=VERDICT, refusals=[
            {"tool": "Bash", "message": "curl http://elsewhere.invalid refused by the sandbox"}],
        network=NETWORK, prompt_path=record(run, f"{folder}/prompt.md", "## Requirement\nAnswer 42.\n"),
        log_path=record(run, f"{folder}/output.log", "thinking\nwriting app/core.py\n"),
        raw_path=record(run, f"{folder}/raw.jsonl", '{"type": "text"}\n'),
        patch_path=record(run, f"{folder}/patch.diff", "--- a/app/core.py\n+++ b/app/core.py\n"),
        result_manifest=manifest, started_at=STARTED, ended_at=STARTED + datetime.timedelta(seconds=0.38))
    log = "collected 1 item\n" + "".join(f"line {n} of the gate's output\n" for n in range(200)) + "1 failed\n"
    check = Check.objects.create(
        run=run, stage=stage, kind="gate", name="unit", command=COMMAND,
        argv=["bash", "-eo", "pipefail", "-c", COMMAND], cwd=run.worktree, started_at=STARTED,
        ended_at=STARTED + datetime.timedelta(seconds=63.24), elapsed_seconds=63.2412, exit_code=1, passed=False,
        failure_kind="nonzero_exit", manifest=manifest, manifest_digest=manifest.digest,
        log_path=record(run, "checks/00001-unit.log", log))
    decision = Decision.objects.create(run=run, stage=stage, kind="review", reason="gate_failed")
    first = RunEvent.objects.create(run=run, kind="attempt_done", message="Attempt 1 (implement) succeeded.",
                                    stage=stage, attempt=attempt)
    failed = RunEvent.objects.create(run=run, kind="check_failed", message=LONG_MESSAGE, stage=stage, gate_check=check)
    stopped = RunEvent.objects.create(run=run, kind="stopped", message="Stopped (gate_failed): Gate 'unit' failed.",
                                      decision=decision)
    for n, event in enumerate((first, failed, stopped)):
        RunEvent.objects.filter(pk=event.pk).update(at=STARTED + datetime.timedelta(seconds=n))
    return {"run": run, "stage": stage, "attempt": attempt, "check": check, "manifest": manifest, "log": log,
            "decision": decision, "events": (first, failed, stopped)}


def get(client, url: str) -> str:
    """The page at ``url`` (asserting a 200), as text."""
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code, response.content[:300])
    return response.content.decode()


def field(text: str, name: str) -> str:
    """What an admin page shows in its read-only field ``name``: its box (``<div class="form-row ... field-NAME">``)
    up to the next field's, or the end of its group."""
    found = re.search(rf'<div class="form-row[^"]*\bfield-{name}\b[^"]*">(.*?)(?=<div class="form-row|</fieldset>)',
                      text, re.S)
    assert found, f"no field {name} on the page"
    return found.group(1)


def no_json_repr(text: str) -> None:
    """No JSON object or list of objects, as Django's admin prints a JSON field (or Python a dict), in what the
    page shows (its text, outside the tags: an inline's ``data-`` attribute holds JSON of its own)."""
    shown = re.sub(r"<[^>]*>", " ", text)
    found = re.search(r".{0,80}(\{&quot;|\[\{&quot;|\{'|\[\{'|\{\"|\[\{\").{0,80}", shown, re.S)
    assert found is None, found.group(0)


def detail(run) -> str:
    """The run's page."""
    return reverse("admin:engine_run_detail", args=[run.pk])


def check_url(check) -> str:
    """The check's page."""
    return reverse("admin:engine_run_check_log", args=[check.run_id, check.pk])


# ----------------------------------------------------------------------------- durations and times


def test_durations_are_given_to_the_tenth_of_a_second_and_times_with_their_seconds():
    assert duration_text(0.380757248000009) == "0.4 s"
    assert duration_text(59.96) == "1 min 0.0 s"  # rounded first: never "60.0 s"
    assert duration_text(63.2412) == "1 min 3.2 s"
    assert duration_text(7384.5) == "2 h 3 min 4.5 s"
    assert duration_text(None) == "—"
    assert seconds_text(63.2412, precise=True) == "1 min 3.2 s" and seconds_text(None, precise=True) == ""
    assert seconds_text(63.2412) == "1 min 03 s"  # the run page's own (shorter) style is unchanged
    assert moment_text(STARTED) == "2025-03-04 05:06:07.891 UTC"
    assert moment_text(STARTED, zone=False) == "2025-03-04 05:06:07.891"
    # kind, name, adapter first, then the rest alphabetically: the same on SQLite and PostgreSQL (jsonb
    # keeps keys by length)
    assert yaml_text({"model": None, "flags": ["-q"], "adapter": "scripted", "name": "p"}) == (
        "name: p\nadapter: scripted\nflags:\n- -q\nmodel: null")
    assert yaml_text("just text") == "just text"
    assert yaml_text({"requirement": "Two lines:\n- one\n- two\n"}) == "requirement: |\n  Two lines:\n  - one\n  - two"


# ----------------------------------------------------------------------------- 1. the attempt's page


def test_the_attempt_page_is_readable(staff, evidence):
    attempt, run = evidence["attempt"], evidence["run"]
    text = get(staff, reverse("admin:engine_attempt_change", args=[attempt.pk]))
    # durations to the tenth of a second, never a float's digits
    assert "0.4 s" in field(text, "elapsed_seconds_shown") and "0.380757" not in text
    assert "10 min 0.0 s" in field(text, "deadline_seconds_shown")
    assert "2025-03-04 05:06:07.891 UTC" in field(text, "started_at_shown")
    # usage: a small table, one row per key, "—" for the unknown
    usage = field(text, "usage_shown")
    assert '<table class="cp-usage">' in usage
    rows = dict(re.findall(r'<th scope="row">([^<]+)</th><td>([^<]+)</td>', usage))
    assert rows == {"input tokens": "1,234", "output tokens": "56", "cached tokens (read)": "—",
                    "cache creation tokens": "7", "cost in USD": "$0.0123"}, rows
    # links: back to the run's page at this attempt, the stage, the result manifest, each stored file
    back = f'href="{detail(run)}#attempt-{attempt.pk}"'
    assert back in field(text, "links") and text.count(back) >= 2  # in the links and among the page's tools
    assert f'href="{detail(run)}#stage-{evidence["stage"].pk}"' in text
    assert f'href="{detail(run)}#manifest-{evidence["manifest"].pk}"' in text
    assert reverse("admin:engine_manifest_change", args=[evidence["manifest"].pk]) in text
    for kind in ("prompt", "log", "raw", "patch"):
        assert f'href="{reverse("admin:engine_attempt_file", args=[attempt.pk, kind])}"' in text, kind
    # JSON fields readable: the verdict and its findings, the refusals as a list, the network as YAML
    verdict = field(text, "verdict_shown")
    assert "<b>repair</b>" in verdict and "<code>app/core.py:4</code>" in verdict
    assert "Say where 42 comes from." in verdict
    assert "<b>Bash</b>" in field(text, "refusals_shown") and "elsewhere.invalid refused" in text
    # a record older than outcomes (engine/text/tool_outcomes.py) shows as what it meant then
    assert "1 tool call refused or failed" in field(text, "refusals_shown")
    assert "[refused or failed]" in field(text, "refusals_shown")
    network = html.unescape(field(text, "network_shown"))
    assert ('<pre class="cp-yaml">allow:\n- api.example.invalid\nconnected:\n- at: \'2025-03-04T05:06:08Z\'\n'
            '  host: api.example.invalid\n  port: 443\n') in network
    no_json_repr(text)
    assert "exit 0" in field(text, "exit_status")
    # read-only still: no form to save, no delete
    assert 'name="_save"' not in text and "deletelink" not in text


def test_an_attempt_without_usage_says_so(staff, evidence):
    attempt = evidence["attempt"]
    Attempt.objects.filter(pk=attempt.pk).update(usage=None, verdict=None, refusals=[], network=None)
    text = get(staff, reverse("admin:engine_attempt_change", args=[attempt.pk]))
    assert "not reported" in field(text, "usage_shown") and "cp-usage" not in text
    assert "none" in field(text, "refusals_shown")


# ----------------------------------------------------------------------------- 2. the check's page


def test_the_check_page_has_a_header_and_the_log(staff, evidence):
    check, run = evidence["check"], evidence["run"]
    text = get(staff, check_url(check))
    assert "<html" in text and "Control Panel" in text
    crumbs = re.search(r'<div class="breadcrumbs">(.*?)</div>', text, re.S).group(1)
    assert re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html.unescape(crumbs))).strip() == (
        f"Home › Run Engine › Runs › Run {run.pk} › check unit")
    assert f'href="{detail(run)}"' in crumbs
    facts = dict(re.findall(r'<tr><th scope="row">([^<]+)</th><td>(.*?)</td></tr>', text, re.S))
    assert html.unescape(facts["command"]) == f'<pre class="cp-command-text">{COMMAND}</pre>'  # whole
    assert facts["executed as"] == ("<code>bash -eo pipefail -c</code> with the command above as its one argument")
    assert "<b>unit</b> · stage gate" in facts["check"]
    assert facts["exit status"] == "exit 1"
    assert "failed" in facts["outcome"] and "(nonzero_exit)" in facts["outcome"]
    assert "/srv/worktrees/run-x" in facts["directory"] and "the run's worktree" in facts["directory"]
    assert facts["duration"] == "1 min 3.2 s"
    assert "2025-03-04 05:06:07.891 UTC" in facts["started"] and "2025-03-04 05:07:11.131 UTC" in facts["ended"]
    assert f'href="{detail(run)}"' in facts["run"] and f"#stage-{evidence['stage'].pk}" in facts["stage"]
    assert f"#manifest-{evidence['manifest'].pk}" in facts["files tested"]
    # back to the run, at this check
    assert f'href="{detail(run)}#check-{check.pk}" class="cp-back-link">back to the run</a>' in text
    # the log, whole here (it is short), and the whole log as plain text one link away
    shown = re.search(r'<pre class="cp-log" id="check-log">(.*?)</pre>', text, re.S).group(1)
    assert html.unescape(shown) == evidence["log"]
    assert f"{len(evidence['log'].encode())} bytes, all shown." in text
    assert f'href="{check_url(check)}?raw=1"' in text


def test_raw_gives_the_log_as_it_is_stored(staff, evidence):
    check = evidence["check"]
    response = staff.get(check_url(check) + "?raw=1")
    assert response.status_code == 200 and response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == f'inline; filename="check-{check.pk}-00001-unit.log"'
    assert b"".join(response.streaming_content) == (Path(settings.VAR_DIR) / check.log_path).read_bytes()


def test_a_long_log_shows_its_end_and_says_it_is_cut(staff, evidence):
    check, run = evidence["check"], evidence["run"]
    lines = [f"line {n:07d} of a long log\n" for n in range(20_000)]  # about 580 KB
    path = Path(settings.VAR_DIR) / check.log_path
    path.write_text("FIRST LINE\n" + "".join(lines) + "LAST LINE\n")
    text = get(staff, check_url(check))
    shown = html.unescape(re.search(r'<pre class="cp-log" id="check-log">(.*?)</pre>', text, re.S).group(1))
    assert shown.endswith("LAST LINE\n") and "FIRST LINE" not in shown
    assert len(shown.encode()) <= CHECK_LOG_BYTES and shown.startswith("line ")  # from a line's start
    note = html.unescape(re.search(r'<p class="cp-log-note" id="log-note">(.*?)</p>', text, re.S).group(1))
    assert re.match(r"The last \d+\.\d\sKB of \d+\.\d\sKB ", note), note
    assert f"({path.stat().st_size} bytes) are shown" in note and "The whole log as plain text" in note
    assert b"".join(staff.get(check_url(check) + "?raw=1").streaming_content) == path.read_bytes()
    assert f"Run {run.pk}" in text


@pytest.mark.parametrize("recorded", ["", "/etc/passwd", "../../../../../../etc/passwd", "runs/../../../etc/passwd",
                                      "test.sqlite3", "checks/missing.log"])
def test_the_log_is_served_only_from_its_recorded_path_in_the_runs_control_records(staff, evidence, recorded):
    check = evidence["check"]
    if recorded.startswith("checks/"):
        recorded = f"{check.run.control_dir}/{recorded}"
    Check.objects.filter(pk=check.pk).update(log_path=recorded)
    assert staff.get(check_url(check) + "?raw=1").status_code == 404
    text = get(staff, check_url(check))  # the page still says what ran, and that there is no log
    assert "This check has no log in its run's control records" in text
    assert 'id="check-log"' not in text and "root:" not in text
    assert "ALL-DONE-END-OF-COMMAND" in text
    if recorded.endswith("missing.log"):  # a run of another host: the page says where its log is
        assert "the run ran on host" not in text
        Run.objects.filter(pk=check.run_id).update(host="far-away")
        assert "the run ran on host <code>far-away</code>, whose var directory this Control Panel reads only where " \
               "<code>CP_OTHER_VAR_DIRS</code> names it" in get(staff, check_url(check))


def test_a_symlinked_log_pointing_out_is_not_followed(staff, evidence, tmp_path):
    check = evidence["check"]
    outside = tmp_path / "outside.txt"
    outside.write_text("NOT A CONTROL RECORD\n")
    log = Path(settings.VAR_DIR) / check.log_path
    log.unlink()
    os.symlink(outside, log)
    assert staff.get(check_url(check) + "?raw=1").status_code == 404
    assert "NOT A CONTROL RECORD" not in get(staff, check_url(check))


def test_a_check_of_another_run_or_no_check_is_not_found_and_a_viewer_needs_the_permission(staff, evidence,
                                                                                            run_row,
                                                                                            django_user_model):
    check = evidence["check"]
    other = run_row(pipeline_kwargs={"name": "other"})
    wrong = reverse("admin:engine_run_check_log", args=[other.pk, check.pk])
    assert staff.get(wrong).status_code == 404 and staff.get(wrong + "?raw=1").status_code == 404
    assert staff.get(reverse("admin:engine_run_check_log", args=[check.run_id, check.pk + 999])).status_code == 404
    nobody = django_user_model.objects.create_user("nobody", "n@example.invalid", "pw-for-tests-only", is_staff=True)
    client = Client()
    client.force_login(nobody)
    assert client.get(check_url(check)).status_code == 403
    assert client.get(check_url(check) + "?raw=1").status_code == 403
    nobody.user_permissions.add(Permission.objects.get(content_type__app_label="engine", codename="view_run"))
    assert client.get(check_url(check)).status_code == 200


def test_a_running_final_check_says_so(staff, evidence):
    check = evidence["check"]
    Check.objects.filter(pk=check.pk).update(ended_at=None, exit_code=None, elapsed_seconds=None, failure_kind="",
                                             kind="final", cwd="/srv/final-checkout", argv=["sh", "-c", "true; x"])
    text = get(staff, check_url(check))
    facts = dict(re.findall(r'<tr><th scope="row">([^<]+)</th><td>(.*?)</td></tr>', text, re.S))
    assert "running" in facts["outcome"] and facts["duration"].startswith("running for ")
    assert facts["exit status"] == "—" and facts["ended"] == "—"
    assert "final verification" in facts["check"]
    assert facts["directory"].startswith("<code>/srv/final-checkout</code> (a fresh checkout of the run")
    assert html.unescape(facts["executed as"]) == "<pre class=\"cp-command-text\">sh -c 'true; x'</pre>"


# ----------------------------------------------------------------------------- 3. the events list


def test_all_events_of_a_run_show_seconds_and_whole_messages_oldest_first(staff, evidence):
    run, (first, failed, stopped) = evidence["run"], evidence["events"]
    text = get(staff, reverse("admin:engine_runevent_changelist") + f"?run__id__exact={run.pk}")
    rows = re.findall(r"<tr>(.*?)</tr>", text.split('id="result_list"')[1], re.S)[1:]
    assert len(rows) == 3
    assert [re.search(r'<time datetime="[^"]+">([^<]+)</time>', r).group(1) for r in rows] == [
        "2025-03-04 05:06:07.891", "2025-03-04 05:06:08.891", "2025-03-04 05:06:09.891"]  # oldest first
    assert html.escape(LONG_MESSAGE) in rows[1] and "END-OF-THE-MESSAGE." in rows[1]  # whole
    assert ('<td class="field-kind_code"><code title="a check exited non-zero, timed out or could not start">'
            'check_failed</code></td>') in rows[1], rows[1]
    # links to the run's page and to what each event names
    assert f'href="{detail(run)}#event-{failed.pk}"' in rows[1]
    assert f'href="{detail(run)}#stage-{evidence["stage"].pk}"' in rows[1]
    assert f'href="{check_url(evidence["check"])}"' in rows[1]
    assert f'href="{reverse("admin:engine_attempt_change", args=[evidence["attempt"].pk])}"' in rows[0]
    assert f'href="{detail(run)}#decision-{evidence["decision"].pk}"' in rows[2]
    # it names the run, and leads back to its page
    assert f"Events of run {run.pk}" in text and f'href="{detail(run)}" class="cp-back-link"' in text
    assert "controlpanel/pages.css" in text
    # unfiltered: newest first
    every = get(staff, reverse("admin:engine_runevent_changelist"))
    assert every.index(f"#event-{stopped.pk}") < every.index(f"#event-{first.pk}")


def test_the_events_list_shows_500_a_page(staff, evidence):
    run = evidence["run"]
    RunEvent.objects.bulk_create([RunEvent(run=run, kind="recheck", message=f"note {n}") for n in range(600)])
    text = get(staff, reverse("admin:engine_runevent_changelist") + f"?run__id__exact={run.pk}")
    rows = re.findall(r'<td class="field-whole_message">', text)
    assert len(rows) == 500
    assert "603" in text  # the count of all of them


# ----------------------------------------------------------------------------- 4. pipeline and profile pages


def test_the_pipeline_page_shows_definition_and_profiles_as_yaml(staff, make_pipeline):
    pipeline = make_pipeline(name="yaml-shown")
    profile = Profile.objects.get(pipeline=pipeline, name="scripted")
    text = get(staff, reverse("admin:engine_pipeline_change", args=[pipeline.pk]))
    no_json_repr(text)
    inline = text[text.index('id="profiles-group"'):]
    block = html.unescape(re.search(r'<pre class="cp-yaml">(.*?)</pre>', inline, re.S).group(1))
    assert block.startswith("name: scripted\nadapter: scripted\n")
    assert "\nscenario:\n  stages:\n    answer:\n      implement:\n      - " in block and "\n        write:\n" in block
    # a text of several lines as a person writes it (the file the scripted agent writes)
    assert '          app/core.py: |\n            """Core."""\n' in block
    definition = html.unescape(field(text, "definition_yaml"))
    assert "name: yaml-shown\n" in definition and "stages:\n- key: answer\n" in definition
    # the profile's own page: the same
    page = get(staff, reverse("admin:engine_profile_change", args=[profile.pk]))
    no_json_repr(page)
    assert html.unescape(field(page, "settings_shown")).count("adapter: scripted\n") == 1


# ----------------------------------------------------------------------------- 5. the run's record


def test_the_run_record_shows_paths_as_a_list_and_json_as_yaml(staff, evidence, run_row):
    run = evidence["run"]
    text = get(staff, reverse("admin:engine_run_change", args=[run.pk]))
    included = field(text, "not_included_shown")
    assert re.findall(r"<li>(.*?)</li>", included) == [
        '<code>notes.txt</code> <span class="cp-quiet">untracked</span>',
        '<code>app/old_name.py</code> → <code>app/new_name.py</code> <span class="cp-quiet">renamed</span>']
    evidence_yaml = html.unescape(field(text, "stop_evidence_shown"))
    assert "check: unit\nexit_code: 1\nfiles:\n- app/core.py\n- app/extra.py" in evidence_yaml
    definition = html.unescape(field(text, "definition_shown"))
    assert '<pre class="cp-yaml">pipeline:\n  name: p\n' in definition and "\n  format: 1\n" in definition
    assert "12.3 s" in field(text, "active_seconds_shown") and "12.3456" not in text
    # its attempts (inline) to 0.1 s, its events with seconds
    assert "0.4 s" in text and "0.380757" not in text
    assert "2025-03-04 05:06:08.891 UTC" in text
    no_json_repr(text)
    # a run with nothing left out says so
    clean = run_row(pipeline_kwargs={"name": "clean"})
    shown = field(get(staff, reverse("admin:engine_run_change", args=[clean.pk])), "not_included_shown")
    assert '<div class="readonly">none</div>' in shown
    assert "uncommitted changes of the original checkout, not in the run" in shown  # its help text stays


def test_every_record_page_renders_readably(staff, evidence):
    """The other evidence pages (stage, manifest, decision, event, check, journal entry, start request,
    notification) render, their JSON as YAML and their times with seconds."""
    from engine.models import JournalEntry, Notification, StartRequest

    run, stage = evidence["run"], evidence["stage"]
    StageRun = type(stage)
    StageRun.objects.filter(pk=stage.pk).update(last_defect={"kind": "gate", "name": "unit", "message": "1 failed"})
    journal = JournalEntry.objects.create(run=run, stage=stage, parent_commit="0" * 40, expected_tree="c" * 40)
    start = StartRequest.objects.create(run=run, requested_by="someone", source="admin")
    notice = Notification.objects.create(run=run, key=f"end:{run.uid}", kind="ended", channel="webhook",
                                         target="http://hooks.example.invalid/cp", payload={"event": "run.ended"},
                                         log=[{"at": "2025-03-04T05:06:07Z", "status": 500, "error": "", "seconds": 0.2}])
    seconds = r"<time datetime=\"[^\"]+\">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC</time>"
    for name, obj, shown in (("stagerun", stage, "kind: gate\nname: unit\nmessage: 1 failed"),
                             ("manifest", evidence["manifest"], seconds), ("decision", evidence["decision"], seconds),
                             ("runevent", evidence["events"][1], "2025-03-04 05:06:08.891 UTC"),
                             ("check", evidence["check"], "1 min 3.2 s"), ("journalentry", journal, seconds),
                             ("startrequest", start, seconds),
                             ("notification", notice, "- at: &#x27;2025-03-04T05:06:07Z&#x27;\n  error: &#x27;&#x27;\n  seconds: 0.2\n  status: 500")):
        text = get(staff, reverse(f"admin:engine_{name}_change", args=[obj.pk]))
        no_json_repr(text)
        assert "controlpanel/pages.css" in text, name
        assert re.search(shown, text) if shown is seconds else shown in text, (name, shown)
        assert not re.search(r"\b\d{1,2}:\d\d [ap]\.m\.", text), name  # no time to the minute only
    check_list = get(staff, reverse("admin:engine_check_changelist"))
    assert f'href="{check_url(evidence["check"])}"' in check_list
    attempt_list = get(staff, reverse("admin:engine_attempt_changelist"))
    assert "0.4 s" in attempt_list and "0.380757" not in attempt_list


# ----------------------------------------------------------------------------- 6. narrow screens


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_pages_fit_a_390_px_wide_screen(evidence, narrow_page, django_user_model, make_pipeline):
    """Each page at 390 px: the page is no wider than the screen (long lines wrap), and the long values are there."""
    run, check, attempt = evidence["run"], evidence["check"], evidence["attempt"]
    pipeline = make_pipeline(name="narrow")
    django_user_model.objects.create_superuser("narrow", "narrow@example.invalid", "pw-for-tests-only")
    pages = {
        "attempt": reverse("admin:engine_attempt_change", args=[attempt.pk]),
        "check": check_url(check),
        "events": reverse("admin:engine_runevent_changelist") + f"?run__id__exact={run.pk}",
        "pipeline": reverse("admin:engine_pipeline_change", args=[pipeline.pk]),
        "profile": reverse("admin:engine_profile_change", args=[pipeline.profiles.first().pk]),
        "record": reverse("admin:engine_run_change", args=[run.pk]),
    }
    tab = narrow_page
    tab.goto("/admin/login/")
    tab.fill("#id_username", "narrow")
    tab.fill("#id_password", "pw-for-tests-only")
    navigate_by(tab, lambda: tab.click("#login-form input[type=submit]"))
    too_wide = {}
    for name, url in pages.items():
        tab.goto(url)
        width = tab.evaluate("Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)")
        main = tab.evaluate("document.querySelector('#content-main, #content').scrollWidth")
        # nor a box inside it that scrolls sideways (a table in a scrolling box, a <pre> too wide)
        boxes = tab.evaluate("""[...document.querySelectorAll('#content *')].filter(e =>
            e.scrollWidth > e.clientWidth + 1 && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
            .map(e => e.tagName + '.' + e.className + ' ' + e.scrollWidth + '>' + e.clientWidth)""")
        if width > 390 or main > 390 or boxes:
            too_wide[name] = (width, main, boxes)
    tab.goto(pages["check"])
    assert tab.locator(".cp-command-text").first.bounding_box()["width"] <= 390
    assert "ALL-DONE-END-OF-COMMAND" in tab.inner_text(".cp-command-text >> nth=0")
    tab.goto(pages["events"])
    assert "END-OF-THE-MESSAGE." in tab.inner_text("#result_list")
    assert not too_wide, too_wide


def test_the_run_list_makes_as_many_queries_for_twelve_runs_as_for_two(staff, make_pipeline, repo):
    """Issue 21: one query per row (each run's current stage) made the list grow with the page."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    pipeline = make_pipeline(stages=[{"key": f"s{i}", "requirement": "r", "scope": ["app/**"],
                                      "gates": [{"name": "unit", "command": "true"}]} for i in range(3)],
                             scenario={"default": [{}], "stages": {}})
    counts = {}
    for total in (2, 12):
        while Run.objects.count() < total:
            operations.create_run(pipeline, str(repo), "main")
        with CaptureQueriesContext(connection) as seen:
            text = get(staff, reverse("admin:engine_run_changelist"))
        assert text.count('class="field-current_stage">s0<') == total, text  # every row names its stage
        counts[total] = len(seen.captured_queries)
    assert counts[12] == counts[2], counts


@pytest.mark.django_db
def test_the_run_list_shows_repository_branch_start_time_taken_spend_and_stop_reason(staff, run_row):
    """Issue 22: the run list says where each run ran, when, how long it took and what it spent, and filters by
    stop reason and repository."""
    from django.utils import timezone

    now = timezone.now()
    done = run_row(status="succeeded", stage_statuses=("passed",), repo_path="/srv/repos/textstats",
                   branch="cp/run-done", started_at=now - datetime.timedelta(seconds=95), finished_at=now)
    Run.objects.filter(pk=done.pk).update(simulated=False)
    Attempt.objects.create(run=done, stage=done.stages.get(), number=1, operation="implement", role="implementer",
                           profile_name="claude-code", adapter="claude-code", status="succeeded", deadline_seconds=60,
                           spend={"tokens": 4100, "cost_usd": 0.0135, "unpriced_calls": 0})
    failed = run_row(status="failed", stage_statuses=("failed",), repo_path="/srv/repos/other", stop_reason="gate_failed",
                     stop_message="Gate 'unit' exited 1.", started_at=now - datetime.timedelta(seconds=30),
                     finished_at=now)
    listed = get(staff, reverse("admin:engine_run_changelist"))
    row = listed.split(f">{done.pk}</a>")[1].split("</tr>")[0]
    assert '<span title="/srv/repos/textstats">textstats</span>' in row and "cp/run-done" in row
    assert "1 min 35 s" in row and "4,100 tokens · $0.0135" in row
    assert "<code" not in row  # no stop reason for a success
    assert "gate_failed" in listed.split(f">{failed.pk}</a>")[1].split("</tr>")[0]
    only_failed = get(staff, reverse("admin:engine_run_changelist") + "?stop_reason__exact=gate_failed")
    assert f">{failed.pk}</a>" in only_failed and f">{done.pk}</a>" not in only_failed
    only_repo = get(staff, reverse("admin:engine_run_changelist") + "?repo_path__exact=/srv/repos/textstats")
    assert f">{done.pk}</a>" in only_repo and f">{failed.pk}</a>" not in only_repo
