"""Hosts (engine/hosts.py): the first claim pins a run to its host, every later message of it goes to
that host's queue and no other host takes a step of it; reconciliation leaves a live host's runs to
that host, marks a lost host's runs interrupted once and waits for the host to confirm its old
processes gone before a recovery. In-process, on the suite's database; tests/test_two_hosts.py runs
two real hosts."""
import io
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from engine import answers, hosts, machine, operations, reconcile, runner, workers
from engine.processes import worker_process
from engine.models import Attempt, Host, Run, Worker
from engine.steps.attempts import _prepare_workspace

pytestmark = pytest.mark.django_db(transaction=True)


def _queued(make_pipeline, repo, sent) -> Run:
    run = operations.create_run(make_pipeline(), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    sent.clear()
    return Run.objects.get(pk=run.pk)


def _host(name: str, age_seconds: float) -> Host:
    at = timezone.now() - timedelta(seconds=age_seconds)
    return Host.objects.create(name=name, queue=hosts.host_queue(name), started_at=at, beat_at=at)


def _only_these_live_hosts(monkeypatch, reaching: dict[str, list[str]]) -> None:
    """Live hosts ``{name: the folders it reaches}`` made now, and the only ones ``hosts.live_hosts`` sees:
    the suite's own workers beat as this machine's host, which reaches every path, and are not in the
    test's world (the CI machine's once took a message a test meant to drop)."""
    for name, roots in reaching.items():
        _host(name, age_seconds=1)
        Host.objects.filter(name=name).update(repo_roots=roots)
    every_live_host = hosts.live_hosts
    monkeypatch.setattr(hosts, "live_hosts", lambda now=None: [
        host for host in every_live_host(now) if host.name in reaching])


def _running_on(run: Run, host: str, age_seconds: float = 3600) -> Attempt:
    """``run`` as a worker of ``host`` left it: running, its lease held, its heartbeat ``age_seconds`` old,
    an attempt open on that host."""
    Run.objects.filter(pk=run.pk).update(status="running", host=host, lease_owner=f"{host}:4242",
                                         lease_token="held-by-a-worker",
                                         heartbeat_at=timezone.now() - timedelta(seconds=age_seconds))
    stage = run.stages.get()
    stage.status = "running"
    stage.save()
    return Attempt.objects.create(run=run, stage=stage, operation="implement", number=1, role="implementer",
                                  profile_name="scripted", adapter="scripted", simulated=True, deadline_seconds=60,
                                  status="running", host=host, pid=4242, marker=f"cp-far-{run.pk}",
                                  started_at=timezone.now() - timedelta(seconds=age_seconds + 5))


def test_the_first_claim_pins_the_run_and_no_other_host_claims_it_again(make_pipeline, repo, sent):
    run = _queued(make_pipeline, repo, sent)
    assert machine.claim(run.pk, None, "host-a:1", "host-a")
    assert Run.objects.get(pk=run.pk).host == "host-a"
    # a handed-off step: only its host claims it
    Run.objects.filter(pk=run.pk).update(lease_owner="", lease_token="next-step")
    assert machine.claim(run.pk, "next-step", "host-b:1", "host-b") is None
    assert machine.claim(run.pk, "next-step", "host-a:2", "host-a")
    # queued again (a person's recovery): still only its host
    Run.objects.filter(pk=run.pk).update(status="queued", lease_owner="", lease_token="")
    assert machine.claim(run.pk, None, "host-b:1", "host-b") is None
    assert Run.objects.get(pk=run.pk).status == "queued"
    assert machine.claim(run.pk, None, "host-a:3", "host-a")


def test_a_runs_messages_go_to_its_hosts_queue_once_pinned(make_pipeline, repo, sent, settings):
    run = _queued(make_pipeline, repo, sent)
    assert hosts.queue_for(run.pk) == settings.CELERY_TASK_DEFAULT_QUEUE
    Run.objects.filter(pk=run.pk).update(host="host-a")
    assert hosts.queue_for(run.pk) == f"{settings.CELERY_TASK_DEFAULT_QUEUE}.host.host-a"
    assert workers.run_queue(Run.objects.get(pk=run.pk)) == hosts.queue_for(run.pk)


def test_a_worker_of_another_host_sends_the_step_on_instead_of_taking_it(make_pipeline, repo, sent, monkeypatch):
    run = _queued(make_pipeline, repo, sent)
    Run.objects.filter(pk=run.pk).update(host="elsewhere")
    forwarded = []

    class App:
        def send_task(self, name, args, queue, **retrying):
            forwarded.append((name, args, queue))

    monkeypatch.setattr(runner, "current_app", App())
    assert runner.advance(run.pk, None) == "forwarded"
    assert forwarded == [(runner.ADVANCE_TASK, [run.pk, None], hosts.host_queue("elsewhere"))]
    run = Run.objects.get(pk=run.pk)
    assert run.status == "queued" and not run.lease_owner and run.steps == 0


def test_a_host_that_cannot_reach_the_repository_leaves_the_run_queued(make_pipeline, repo, sent, tmp_path):
    run = _queued(make_pipeline, repo, sent)
    with override_settings(CP_HOST_REPOS=[str(tmp_path / "other-repos")]):
        assert not hosts.can_reach(str(repo))
        assert runner.advance(run.pk, None) == "unreachable"
    run = Run.objects.get(pk=run.pk)
    assert run.status == "queued" and run.host == ""
    with override_settings(CP_HOST_REPOS=[str(repo.parent)]):
        assert hosts.can_reach(str(repo))


def test_a_stale_run_of_a_live_host_is_left_to_that_host(make_pipeline, repo, sent):
    run = _queued(make_pipeline, repo, sent)
    far = _host("far-alive", age_seconds=1)
    _running_on(run, far.name)
    counts = reconcile.reconcile()
    assert counts["interrupted"] == counts["host_lost"] == 0
    assert Run.objects.get(pk=run.pk).status == "running"
    assert [host.name for host in reconcile.hosts_to_reconcile()] == [far.name]


def test_a_lost_hosts_run_is_interrupted_once_and_recovered_only_after_its_host_confirms(make_pipeline, repo, sent):
    run = _queued(make_pipeline, repo, sent)
    far = _host("far-lost", age_seconds=600)
    attempt = _running_on(run, far.name)
    first, second = reconcile.reconcile(), reconcile.reconcile()
    assert (first["host_lost"], second["host_lost"]) == (1, 0)
    assert first["interrupted"] == 0  # nothing of it could be reaped or inspected here
    run = Run.objects.get(pk=run.pk)
    assert run.status == "waiting_review" and run.stop_reason == "interrupted"
    assert run.stop_message.startswith("Host far-lost has had no heartbeat for 6"), run.stop_message
    assert "not resumed on another host" in run.stop_message
    assert run.stop_evidence["host_confirmed"] is False and run.stop_evidence["unconfirmed"] == [1]
    assert Attempt.objects.get(pk=attempt.pk).status == "interrupted"
    assert run.decisions.count() == 1  # one interruption, one decision for a person
    decision = run.decisions.get(state="pending")
    with pytest.raises(operations.OperationError) as refused:
        operations.recover(run, decision.pk, "try again", "retry", reviewer="t")
    assert refused.value.code == "host_unconfirmed" and "far-lost" in str(refused.value)
    offered = answers.actions(run)
    assert not offered["recover"].applies and "far-lost" in offered["recover"].why  # the pages offer no Recover
    assert not offered["recheck"].applies and offered["fail"].applies
    assert reconcile.hosts_to_reconcile() == []  # the host is gone: nobody to send a pass to
    # where the run is, and that its host is lost, in run_status (JSON and text) and the run page's header
    status = operations.run_status(run)
    assert (status["host"], status["host_alive"]) == ("far-lost", False) and status["host_beat_age_seconds"] >= 600
    out = io.StringIO()
    call_command("run_status", str(run.pk), stdout=out)
    assert "on host far-lost (LOST: no heartbeat for 6" in out.getvalue(), out.getvalue()
    # what a person reads agrees with what is refused: no Recover offered anywhere until the host confirms
    assert "waits for its host: the run's host far-lost stopped beating" in out.getvalue(), out.getvalue()
    assert "manage.py recover" not in out.getvalue() and "fail_run" in out.getvalue()
    assert status["host_unconfirmed"].startswith("the run's host far-lost stopped beating")
    assert answers.waiting_sentence(run).startswith("Waiting for its host: the run's host far-lost")
    from controlpanel import home
    waiting = {row["id"]: row for row in home._waiting(timezone.now())[0]}
    assert waiting[run.pk]["button"] == "Wait for its host, or fail"
    client = Client()
    client.force_login(User.objects.create_superuser("hosts-admin", "h@example.invalid", "pw"))
    header = client.get(reverse("admin:engine_run_header", args=[run.pk])).content.decode()
    assert "on host <code>far-lost</code>: LOST, no heartbeat for 6" in header, header
    # the host comes back: its own pass confirms the old processes gone
    with override_settings(CP_HOST_NAME="far-lost"):
        hosts.beat()  # its worker's first beat
        assert reconcile.reconcile()["host_confirmed"] == 1
        assert reconcile.reconcile()["host_confirmed"] == 0
    run = Run.objects.get(pk=run.pk)
    assert run.stop_evidence["host_confirmed"] is True
    assert operations.run_status(run)["host_alive"] is True and operations.run_status(run)["host_unconfirmed"] is None
    out = io.StringIO()
    call_command("run_status", str(run.pk), stdout=out)
    assert "since then: host far-lost is back and confirmed the run's old processes gone" in out.getvalue()
    assert "manage.py recover" in out.getvalue()  # and the way on is offered again
    assert home._waiting(timezone.now())[0][0]["button"] == "Recover or fail"
    assert "on host <code>far-lost</code></p>" in client.get(
        reverse("admin:engine_run_header", args=[run.pk])).content.decode()
    assert "Host far-lost is back" in run.events.get(kind="host_confirmed").message
    assert answers.actions(run)["recover"].applies
    operations.recover(run, decision.pk, "try again", "retry", reviewer="t")
    assert Run.objects.get(pk=run.pk).status == "queued"
    assert sent == [(run.pk, None)]


def test_a_queued_run_pinned_to_a_host_without_a_live_worker_says_so(make_pipeline, repo, sent):
    run = _queued(make_pipeline, repo, sent)
    Run.objects.filter(pk=run.pk).update(host="far-gone")
    now = timezone.now()
    rows = [{"alive": True, "queues": [hosts.host_queue("near")], "concurrency": 1, "runs": [], "name": "w@near",
             "host": "near", "beat_at": now, "stopped_at": None, "beat_age_seconds": 1.0}]
    text = workers.queued_without_worker(Run.objects.get(pk=run.pk), rows=rows, now=now)
    assert text.startswith("This run is pinned to host far-gone"), text
    assert "CP_HOST_NAME=far-gone" in text


def test_each_worker_beat_records_its_host(db, settings):
    beat = workers.WorkerBeat(lambda: {"name": "w1@here", "queues": ["runs", hosts.host_queue(hosts.this_host())],
                                       "concurrency": 1, "pool_pids": []}, 1.0)
    beat.beat()
    host = Host.objects.get(name=hosts.this_host())
    assert host.queue == hosts.host_queue(hosts.this_host())
    assert host.var_dir == str(settings.VAR_DIR) and host.repo_roots == hosts.repo_roots()
    assert hosts.is_alive(host) and host in hosts.live_hosts()


def test_a_host_with_its_own_var_directory_adopts_a_run_created_elsewhere(make_pipeline, repo, sent, tmp_path,
                                                                          settings):
    pipeline = make_pipeline(protected_paths=["tests/**"])
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    made_here = (settings.VAR_DIR / run.control_dir / "definition.sha256").read_text()
    other = tmp_path / "host-b-var"
    with override_settings(VAR_DIR=other, CP_HOST_NAME="host-b"):
        lease = machine.claim(run.pk, None, "host-b:1", "host-b")
        done = hosts.adopt(run.pk, lease)
        assert len(done) == 2, done
        run = Run.objects.get(pk=run.pk)
        assert run.worktree == str(other / "worktrees" / f"{run.pk}-{run.uid.hex[:8]}")
        assert (other / run.control_dir / "definition.sha256").read_text() == made_here
        assert (other / run.control_dir / "protected" / "files" / "tests" / "test_core.py").is_file()
        assert hosts.adopt(run.pk, lease) == []  # at home now: nothing to do


def test_a_host_that_reads_other_protected_files_refuses_the_run(make_pipeline, repo, sent, tmp_path):
    run = operations.create_run(make_pipeline(protected_paths=["tests/**"]), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    records = [{**record, "sha256": "0" * 64} for record in Run.objects.get(pk=run.pk).protected_files]
    assert records
    Run.objects.filter(pk=run.pk).update(protected_files=records)  # as if host b's copy differed
    with override_settings(VAR_DIR=tmp_path / "host-b-var", CP_HOST_NAME="host-b"):
        assert runner.advance(run.pk, None) == "host_mismatch"
    run = Run.objects.get(pk=run.pk)
    assert run.status == "waiting_review" and run.stop_reason == "host_mismatch"
    assert "Host host-b cannot take this run" in run.stop_message


def test_the_control_panel_reads_a_hosts_files_from_its_mounted_var_directory(tmp_path):
    from engine.steps.paths import var_path

    mine, other = tmp_path / "web-var", tmp_path / "hosts" / "host-a"
    (other / "runs" / "7").mkdir(parents=True)
    (other / "runs" / "7" / "log.txt").write_text("from host a")
    with override_settings(VAR_DIR=mine, CP_OTHER_VAR_DIRS=[str(other)]):
        assert var_path("runs/7/log.txt").read_text() == "from host a"
        assert var_path("runs/8/log.txt") == mine / "runs/8/log.txt"  # nowhere: its own path
        (mine / "runs" / "7").mkdir(parents=True)
        (mine / "runs" / "7" / "log.txt").write_text("mine")
        assert var_path("runs/7/log.txt").read_text() == "mine"
    with override_settings(VAR_DIR=mine, CP_OTHER_VAR_DIRS=[]):
        assert var_path("runs/9/x") == mine / "runs/9/x"


def test_a_start_this_host_cannot_take_goes_straight_to_a_host_that_reaches_the_repository(
        make_pipeline, repo, sent, tmp_path, monkeypatch):
    run = _queued(make_pipeline, repo, sent)
    _only_these_live_hosts(monkeypatch, {"reaches-it": [str(repo.parent)],
                                         "reaches-other": [str(tmp_path / "elsewhere")]})
    forwarded = []

    class App:
        def send_task(self, name, args, queue, **retrying):
            forwarded.append((args, queue))

    monkeypatch.setattr(runner, "current_app", App())
    with override_settings(CP_HOST_REPOS=[str(tmp_path / "not-here")], CP_HOST_NAME="near"):
        assert runner.advance_chain(run.pk, None) == "forwarded"
        assert forwarded == [([run.pk, None, ["near"]], hosts.host_queue("reaches-it"))]
        # that host found it cannot either: nobody else is left to ask, the message is dropped
        assert runner.advance_chain(run.pk, None, tried=["reaches-it"]) == "unreachable"
    assert len(forwarded) == 1 and Run.objects.get(pk=run.pk).status == "queued"


def _live_worker_of(host: str, age_seconds: float = 1) -> Worker:
    at = timezone.now() - timedelta(seconds=age_seconds)
    return Worker.objects.create(name=f"w@{host}", host=host, pid=4242, started_at=at, beat_at=at)


def test_a_second_disk_under_one_host_name_is_refused_while_the_first_has_live_workers(db, settings, tmp_path):
    first = tmp_path / "first-disk"
    with override_settings(CP_HOST_NAME="one-disk", VAR_DIR=first):
        assert hosts.disk_conflict() == ""  # no row yet
        hosts.beat()
        assert hosts.disk_conflict() == ""  # the same disk: another worker of the host
        _live_worker_of("one-disk")
    with override_settings(CP_HOST_NAME="one-disk", VAR_DIR=tmp_path / "second-disk"):
        said = hosts.disk_conflict()
        assert "w@one-disk" in said and str(first) in said and str(tmp_path / "second-disk") in said
        assert "own CP_HOST_NAME" in said
        # the first disk's workers stopped (or went silent): the name may move to another disk
        Worker.objects.filter(host="one-disk").update(stopped_at=timezone.now())
        assert hosts.disk_conflict() == ""
        Worker.objects.filter(host="one-disk").update(stopped_at=None,
                                                      beat_at=timezone.now() - timedelta(seconds=3600))
        assert hosts.disk_conflict() == ""
    with override_settings(CP_HOST_NAME="another-host", VAR_DIR=tmp_path / "second-disk"):
        assert hosts.disk_conflict() == ""


@pytest.mark.slow
def test_a_real_worker_started_on_a_second_disk_under_a_served_host_name_exits_refused(tmp_path):
    from tests.conftest import Workers

    first = tmp_path / "first-disk"
    now = timezone.now()
    Host.objects.create(name="one-disk", queue=hosts.host_queue("one-disk"), var_dir=str(first),
                        started_at=now, beat_at=now)
    _live_worker_of("one-disk")
    env = {**Workers(1, tmp_path).env(), "CP_HOST_NAME": "one-disk", "CP_VAR_DIR": str(tmp_path / "second-disk")}
    done = subprocess.run(worker_process.worker_argv(1, queue="disk-test"), cwd=str(settings.BASE_DIR), env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "worker refused: host one-disk (CP_HOST_NAME)" in said, said[-3000:]
    assert " ready." not in said
    assert Host.objects.get(name="one-disk").var_dir == str(first)  # it never beat


def test_failing_a_run_of_another_host_says_where_its_evidence_is(make_pipeline, repo, sent, tmp_path):
    run = _queued(make_pipeline, repo, sent)
    far = _host("far-disk", age_seconds=600)
    Host.objects.filter(pk=far.pk).update(var_dir="/srv/far-var")
    _running_on(run, far.name)
    Run.objects.filter(pk=run.pk).update(worktree="/srv/far-var/worktrees/x")
    out = io.StringIO()
    call_command("fail_run", str(run.pk), "--reason", "its host burned", stdout=out)
    said = out.getvalue()
    assert "1 process(es) reaped" not in said and "attempts [1] ran on host far-disk" in said, said
    assert f"Evidence kept in /srv/far-var/{run.control_dir} on host far-disk" in said, said
    assert "the worktree /srv/far-var/worktrees/x on host far-disk" in said, said
    # a run that had no step in progress (interrupted when its host was lost) says so
    other = _queued(make_pipeline, repo, sent)
    _running_on(other, far.name)
    assert reconcile.reconcile()["host_lost"] == 1
    out = io.StringIO()
    call_command("fail_run", str(other.pk), "--reason", "its host burned", stdout=out)
    assert "no step was in progress" in out.getvalue() and "on host far-disk" in out.getvalue(), out.getvalue()


def test_a_returning_host_inspects_what_its_interrupted_attempt_left_in_the_worktree(make_pipeline, repo, sent):
    from engine import workspace
    from engine.steps.common import manifest_excludes

    run = _queued(make_pipeline, repo, sent)
    with override_settings(CP_HOST_NAME="far-back"):
        hosts.beat()
        lease = machine.claim(run.pk, None, "far-back:1", "far-back")
        hosts.adopt(run.pk, lease)
        _prepare_workspace(Run.objects.get(pk=run.pk), lease)
    run = Run.objects.get(pk=run.pk)
    attempt = _running_on(run, "far-back")
    stage = run.stages.get()
    stage.base_commit = run.commit
    stage.save()
    attempt.start_manifest = workspace.manifest(run.worktree, run.commit, manifest_excludes(run))["digest"]
    attempt.log_path = f"{run.control_dir}/attempts/1/log.txt"
    attempt.save()
    (settings.VAR_DIR / attempt.log_path).parent.mkdir(parents=True)
    (settings.VAR_DIR / attempt.log_path).write_text("the agent's output until its host died\n")
    (Path(run.worktree) / "left_behind.py").write_text("x = 1\n")  # what the agent wrote before its host died
    Host.objects.filter(name="far-back").update(beat_at=timezone.now() - timedelta(seconds=600))
    assert reconcile.reconcile()["host_lost"] == 1
    with override_settings(CP_HOST_NAME="far-back"):
        hosts.beat()
        assert reconcile.reconcile()["host_confirmed"] == 1
    run = Run.objects.get(pk=run.pk)
    effects = run.stop_evidence["effects"]
    assert [(e["attempt"], e["problem"]) for e in effects] == [(attempt.pk, "")]
    assert effects[0]["changed"] == [{"path": "left_behind.py", "status": "added"}], effects
    said = run.events.get(kind="host_confirmed").message
    assert "Attempt 1 changed 1 file(s) in the worktree before it was interrupted (left_behind.py)" in said, said
    kept = Attempt.objects.get(pk=attempt.pk)
    assert kept.result_manifest.digest == effects[0]["manifest"] and kept.patch_path  # its result, unverified
    assert answers.stage_has_result(run.stages.get())  # so Recover offers verify, as after a local interruption


def test_a_host_name_that_cannot_name_a_queue_is_refused_at_start(tmp_path):
    import json
    import os
    import sys

    names = ["bad host", "a:b", "x" * 121, "ok-host.example_1"]
    # the settings module read afresh for each name, as a process starting with it reads it (one process)
    code = f"""
import json, os, runpy
said = {{}}
for name in {names!r}:
    os.environ["CP_HOST_NAME"] = name
    try:
        said[name] = runpy.run_path("controlpanel/settings.py")["CP_HOST_NAME"]
    except SystemExit as exc:
        said[name] = "refused: " + str(exc)
print(json.dumps(said))
"""
    env = {**os.environ, "CP_VAR_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=settings.BASE_DIR, capture_output=True,
                          text=True, check=True)
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["ok-host.example_1"] == "ok-host.example_1"
    for name in names[:3]:
        assert said[name] == f"refused: CP_HOST_NAME={name!r}: a host name is 1 to 120 letters, digits, dots, " \
                             f"dashes or underscores, starting with a letter or a digit", said[name]
    # as a person sees it: one line, no traceback
    done = subprocess.run([sys.executable, "manage.py", "check"], env={**env, "CP_HOST_NAME": "bad host"},
                          cwd=settings.BASE_DIR, capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "CP_HOST_NAME='bad host': a host name is 1 to 120 letters, digits, dots, dashes or underscores, starting "
        "with a letter or a digit"], done.stderr


def test_a_lost_hosts_name_moves_to_another_disk_only_when_no_unfinished_run_needs_the_old_one(
        make_pipeline, repo, sent, tmp_path):
    first, second = tmp_path / "disk-a", tmp_path / "disk-b"
    run = _queued(make_pipeline, repo, sent)
    with override_settings(CP_HOST_NAME="moving", VAR_DIR=first):
        hosts.beat()
        lease = machine.claim(run.pk, None, "moving:1", "moving")
        hosts.adopt(run.pk, lease)
        _prepare_workspace(Run.objects.get(pk=run.pk), lease)
    _running_on(Run.objects.get(pk=run.pk), "moving")
    Host.objects.filter(name="moving").update(beat_at=timezone.now() - timedelta(seconds=600))
    assert reconcile.reconcile()["host_lost"] == 1
    # its workers are gone, but its interrupted run's worktree is on disk-a: another disk may not take the name
    with override_settings(CP_HOST_NAME="moving", VAR_DIR=second):
        said = hosts.disk_conflict()
        assert f"has unfinished run(s) {run.pk} whose worktrees are on its disk {first}" in said, said
        assert f"CP_VAR_DIR={first}" in said and "fail_run" in said
        # and were such a worker started anyway, its pass confirms nothing of a run whose worktree it lacks
        hosts.beat()
        assert reconcile.reconcile()["host_confirmed"] == 0
    assert Run.objects.get(pk=run.pk).stop_evidence["host_confirmed"] is False
    with override_settings(CP_HOST_NAME="moving", VAR_DIR=first):  # its own disk back: confirmed
        assert hosts.disk_conflict() == ""
        hosts.beat()
        assert reconcile.reconcile()["host_confirmed"] == 1
    operations.fail_run(run, "the disk is retired", requested_by="t")
    with override_settings(CP_HOST_NAME="moving", VAR_DIR=second):  # nothing needs disk-a any more
        assert hosts.disk_conflict() == ""


def test_a_queued_run_no_live_host_reaches_says_so_where_a_person_looks(make_pipeline, repo, sent, tmp_path,
                                                                        monkeypatch):
    run = _queued(make_pipeline, repo, sent)
    _only_these_live_hosts(monkeypatch, {"only-b": [str(tmp_path / "repo-b")]})
    now = timezone.now()
    rows = [{"alive": True, "queues": [settings.CELERY_TASK_DEFAULT_QUEUE, hosts.host_queue("only-b")],
             "concurrency": 1, "runs": [],
             "name": "w@only-b", "host": "only-b", "beat_at": now, "stopped_at": None, "beat_age_seconds": 1.0}]
    monkeypatch.setattr(workers, "worker_rows", lambda limit=None, now=None: rows)
    said = workers.queued_without_worker(Run.objects.get(pk=run.pk))
    assert said.startswith(f"No live host reaches its repository {repo}: the live hosts' CP_HOST_REPOS are "
                           f"only-b: {tmp_path / 'repo-b'}"), said
    out = io.StringIO()
    call_command("run_status", str(run.pk), stdout=out)
    assert f"queued, and not claimed: No live host reaches its repository {repo}" in out.getvalue(), out.getvalue()
    assert "same CP_VAR_DIR" not in out.getvalue()
    # a live host that reaches it: nothing to say (it is claimed shortly)
    Host.objects.filter(name="only-b").update(repo_roots=[str(repo.parent)])
    assert workers.queued_without_worker(Run.objects.get(pk=run.pk)) == ""


def test_a_host_gone_for_good_is_forgotten_only_when_nothing_needs_it(make_pipeline, repo, sent):
    live, gone = _host("still-here", age_seconds=1), _host("retired", age_seconds=3600)
    _live_worker_of("still-here")
    Worker.objects.create(name="w@retired", host="retired", pid=7, started_at=gone.started_at, beat_at=gone.beat_at)
    run = _queued(make_pipeline, repo, sent)
    Run.objects.filter(pk=run.pk).update(host="retired", status="waiting_review")
    refusals = {}
    for name in ("nobody", "still-here", "retired"):
        with pytest.raises(operations.OperationError) as refused:
            operations.forget_host(name)
        refusals[name] = (refused.value.code, refused.value.field)
    assert refusals == {"nobody": ("unknown_host", "host"), "still-here": ("host_alive", "host"),
                        "retired": ("host_has_runs", "host")}
    operations.fail_run(run, "its host is retired", requested_by="t")
    # through the admin's action, as a person with the permission does it
    client = Client()
    client.force_login(User.objects.create_superuser("hosts-admin", "h@example.invalid", "pw"))
    page = client.post(reverse("admin:engine_host_changelist"),
                       {"action": "forget", "_selected_action": [live.pk, gone.pk]}, follow=True).content.decode()
    assert "Host retired forgotten." in page and "Host still-here beat" in page, page
    assert list(Host.objects.values_list("name", flat=True).filter(name__in=["still-here", "retired"])) == [
        "still-here"]
    assert not Worker.objects.filter(host="retired").exists() and Worker.objects.filter(host="still-here").exists()
    assert Run.objects.get(pk=run.pk).host == "retired"  # its evidence still says where it ran
    assert b'value="forget"' in client.get(reverse("admin:engine_host_changelist")).content
    clerk = User.objects.create_user("clerk", "c@example.invalid", "pw", is_staff=True)
    clerk.user_permissions.add(*Permission.objects.filter(codename="view_host"))
    client.force_login(clerk)
    assert b'value="forget"' not in client.get(reverse("admin:engine_host_changelist")).content


def test_an_ended_run_of_a_lost_host_is_not_said_to_wait_for_it(make_pipeline, repo, sent):
    run = _queued(make_pipeline, repo, sent)
    _host("far-ended", age_seconds=600)
    Run.objects.filter(pk=run.pk).update(host="far-ended", status="succeeded", finished_at=timezone.now())
    out = io.StringIO()
    call_command("run_status", str(run.pk), stdout=out)
    assert " on host far-ended\n" in out.getvalue() and "LOST" not in out.getvalue(), out.getvalue()
    client = Client()
    client.force_login(User.objects.create_superuser("hosts-admin", "h@example.invalid", "pw"))
    header = client.get(reverse("admin:engine_run_header", args=[run.pk])).content.decode()
    assert "on host <code>far-ended</code></p>" in header and "LOST" not in header, header


def test_a_queued_run_counts_only_the_slots_that_could_take_it(make_pipeline, repo, sent, tmp_path, monkeypatch):
    run = _queued(make_pipeline, repo, sent)
    _only_these_live_hosts(monkeypatch, {"reaches": [str(repo.parent)], "elsewhere": [str(tmp_path / "other")]})
    now = timezone.now()

    def row(host, held):
        return {"alive": True, "queues": [settings.CELERY_TASK_DEFAULT_QUEUE], "concurrency": 1, "name": f"w@{host}",
                "host": host, "beat_at": now, "stopped_at": None, "beat_age_seconds": 1.0,
                "runs": [{"id": pk} for pk in held]}

    queued = Run.objects.get(pk=run.pk)
    # read as queued, then its worker's row already holding it (claimed in between): not "busy"
    assert workers.queued_without_worker(queued, rows=[row("reaches", [run.pk])], now=now) == ""
    # the free slot is on a host that cannot reach the repository: the run does wait
    said = workers.queued_without_worker(queued, rows=[row("reaches", [run.pk + 1]), row("elsewhere", [])], now=now)
    assert said.startswith("Every live worker of queue"), said
