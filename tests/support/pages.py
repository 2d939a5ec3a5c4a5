"""Reading and using a run's detail page through the Django test client, as a person would: its URL, its HTML,
the buttons (action forms) it shows, pressing one, the messages on top and the values a form was prefilled with;
a run not started yet (``pending_run``) and an attempt as a worker leaves it while it runs (``live_attempt``)."""
import html
import re
from pathlib import Path

from django.conf import settings
from django.urls import reverse

from engine import operations
from engine.models import Attempt

from ..conftest import ANSWER_STEP


def detail_url(run) -> str:
    return reverse("admin:engine_run_detail", args=[run.pk])


def action_url(run, verb) -> str:
    return reverse("admin:engine_run_action", args=[run.pk, verb])


def page(client, run) -> str:
    response = client.get(detail_url(run))
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def buttons(text: str) -> set[str]:
    """The actions whose forms the page shows."""
    return set(re.findall(r'<form method="post" action="[^"]+" id="action-\w+" class="cp-action[^"]*" data-cp-action="(\w+)"', text))


def press(client, run, verb, **fields) -> str:
    """Post an action's form and follow the redirect back to the page; returns the page's HTML."""
    response = client.post(action_url(run, verb), fields, follow=True)
    assert response.redirect_chain == [(detail_url(run), 302)], response.redirect_chain
    return response.content.decode()


def messages_of(text: str, level: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", m)).strip()
            for m in re.findall(rf'<li class="{level}">(.*?)</li>', text, re.S)]


def prefilled(text: str, verb: str, name: str) -> str:
    """The value the page put in field ``name`` of the ``verb`` form."""
    form = re.search(rf'data-cp-action="{verb}">(.*?)</form>', text, re.S)
    assert form, f"no {verb} form"
    found = re.search(rf'<input[^>]*name="{name}"[^>]*value="([^"]*)"', form.group(1))
    assert found, f"no prefilled {name} in the {verb} form"
    return html.unescape(found.group(1))


def pending_run(make_pipeline, repo):
    return operations.create_run(make_pipeline(scenario={"stages": {"answer": {"implement": [ANSWER_STEP]}}}),
                                 str(repo), "main")


def live_attempt(run, text: str, status: str = "running", **fields) -> tuple[Attempt, Path]:
    """A recorded attempt of ``run``'s first stage (status ``status``) whose output log holds ``text``,
    as a worker leaves it while the attempt runs; returns the attempt and its log's path."""
    from django.utils import timezone

    stage = run.stages.order_by("order").first()
    number = Attempt.objects.filter(stage=stage).count() + 1
    folder = f"{run.control_dir}/stages/01-{stage.key}/attempts/{number:03d}-implement"
    log = Path(settings.VAR_DIR) / folder / "output.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text, encoding="utf-8")
    attempt = Attempt.objects.create(
        run=run, stage=stage, operation="implement", number=number, role="implementer", profile_name="scripted",
        adapter="scripted", simulated=True, deadline_seconds=600, status=status, log_path=f"{folder}/output.log",
        started_at=timezone.now(), **fields)
    return attempt, log
