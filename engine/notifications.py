"""Notifications: a run that starts waiting for a person, and a run that ends, is told to people.

The notice is written as an outbox row (engine/models.py ``Notification``), one per configured
channel, in the very transaction that made it (engine/machine.py ``notify``: a human gate's new
approval decision, a stop that opens a review decision, success, failure); the unique
(key, channel) makes it once per decision (``decision:ID``) and once per end (``end:RUN_UID``).
After commit the ``engine.notify`` task is sent (``enqueue``); the worker that takes it delivers
(``deliver``), and reconciliation (engine/reconcile.py, beat and every worker start) delivers what
is due and what a dead worker left in ``sending`` (``sweep``).

Channels (controlpanel/settings.py, docs/notifications.md):

* email through Django's mail framework (``send_mail``) to ``CP_NOTIFY_EMAIL_TO``;
* a webhook: a JSON POST to ``CP_NOTIFY_WEBHOOK_URL`` with ``X-CP-Delivery`` (the row's uid),
  ``X-CP-Event`` and ``X-CP-Signature: sha256=<hex HMAC-SHA256 of the body>`` keyed by
  ``CP_NOTIFY_WEBHOOK_SECRET``; only a 2xx answer delivers it.

A failed try goes back to pending, due again after ``CP_NOTIFY_BACKOFF * 2**(tries-1)`` seconds,
until ``CP_NOTIFY_TRIES`` tries are used: then it is failed. Every try is appended to the row's
log. At-least-once: a worker that dies after the receiver got a POST but before the row says
delivered leaves it in sending; after ``CP_NOTIFY_STALE`` seconds it is claimed and sent again
with the same delivery id, which lets a receiver de-duplicate.

State moves are engine/machine.py's (``NOTIFICATION_TRANSITIONS``); this module decides and sends.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from celery import current_app

from . import answers, machine
from .models import RUN_TERMINAL, Decision, Notification, Run

log = logging.getLogger("engine.notifications")

#: The Celery task that delivers outbox rows (engine/tasks.py ``notify``).
NOTIFY_TASK = "engine.notify"
#: The ``event`` of a notice, by its ``kind``.
EVENTS = {"waiting": "run.waiting", "ended": "run.ended"}
#: Rows one sweep delivers at most (each webhook try may take CP_NOTIFY_TIMEOUT seconds).
SWEEP_LIMIT = 20


def channels() -> list[tuple[str, str]]:
    """The configured channels as ``[(channel, target)]``: ``("email", "a@x, b@y")`` when
    CP_NOTIFY_EMAIL_TO names addresses, ``("webhook", URL)`` when CP_NOTIFY_WEBHOOK_URL and
    CP_NOTIFY_WEBHOOK_SECRET are both set (a webhook without a secret, or whose URL is not http or
    https, is not used: logged)."""
    found = []
    to = [address.strip() for address in settings.CP_NOTIFY_EMAIL_TO if address.strip()]
    if to:
        found.append((Notification.Channel.EMAIL, ", ".join(to)))
    url = settings.CP_NOTIFY_WEBHOOK_URL
    if url:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            log.error("CP_NOTIFY_WEBHOOK_URL must be an http:// or https:// URL with a host, not %r: no webhook is "
                      "sent", url)
        elif settings.CP_NOTIFY_WEBHOOK_SECRET:
            found.append((Notification.Channel.WEBHOOK, url))
        else:
            log.error("CP_NOTIFY_WEBHOOK_URL is set without CP_NOTIFY_WEBHOOK_SECRET: no unsigned webhook is sent")
    return found


def run_link(run: Run) -> str:
    """The run page's address for a person: ``CP_PUBLIC_URL`` + ``/admin/engine/run/ID/detail/``."""
    return f"{settings.CP_PUBLIC_URL}/admin/engine/run/{run.pk}/detail/"


def payload(run: Run, kind: str, decision: Decision | None, delivery: str) -> dict:
    """The notice as JSON data: ``delivery`` (the row's uid), ``event`` (run.waiting / run.ended),
    ``run`` (id, uid, status, pipeline, stop_reason, stop_message, simulated, link), ``decision``
    (id, kind, reason, artifact; None for an end), ``waiting`` (what the run waits for, a
    sentence) and ``actions`` (the actions that apply now, each with its form's initial values,
    engine/answers.py). No secret: stop messages are redacted where they are made."""
    decisions = list(run.decisions.order_by("id"))
    return {
        "delivery": delivery,
        "event": EVENTS[kind],
        "run": {"id": run.pk, "uid": str(run.uid), "status": run.status, "pipeline": run.pipeline_name,
                "stop_reason": run.stop_reason or None, "stop_message": run.stop_message or None,
                "simulated": run.simulated, "link": run_link(run)},
        "decision": ({"id": decision.pk, "kind": decision.kind, "reason": decision.reason,
                      "artifact": decision.artifact} if decision is not None else None),
        "waiting": answers.waiting_sentence(run, decisions) or None,
        "actions": answers.applicable(run, decisions),
    }


def notice(run: Run, kind: str, decision: Decision | None = None) -> list[int]:
    """Write the notice's outbox rows inside the caller's transaction (engine/machine.py
    ``notify``) and send ``engine.notify`` for them after commit. ``kind`` is "waiting" (with the
    ``decision`` that waits) or "ended" (ignored while the run has not ended). Idempotent: a
    notice that already has its rows writes none. Returns the ids of the rows written."""
    if kind == "ended" and run.status not in RUN_TERMINAL:
        return []
    if kind == "waiting" and decision is None:
        return []
    configured = channels()
    if not configured:
        return []
    key = f"decision:{decision.pk}" if kind == "waiting" else f"end:{run.uid}"
    written = []
    for channel, target in configured:
        delivery = uuid.uuid4()
        row = machine.notification_outbox(run, decision, uid=delivery, key=key, kind=kind, channel=channel,
                                          target=target, payload=payload(run, kind, decision, str(delivery)))
        if row is not None:
            written.append(row.pk)
    if written:
        transaction.on_commit(lambda: enqueue(written), robust=True)
    return written


def enqueue(ids: list[int], countdown: float | None = None) -> None:
    """Send ``engine.notify`` for the outbox rows ``ids`` (after ``countdown`` seconds). Never
    raises: when the broker is down, or no worker runs, the rows stay pending and reconciliation
    delivers them."""
    try:
        current_app.send_task(NOTIFY_TASK, args=[list(ids)], countdown=countdown, retry=True,
                              retry_policy={"max_retries": 3})
    except Exception:
        log.exception("notifications %s: could not reach the broker; reconciliation delivers them", ids)


def signature(body: bytes, secret: str) -> str:
    """The ``X-CP-Signature`` value of ``body``: ``sha256=`` + the hex HMAC-SHA256 keyed by ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def body_of(row: Notification) -> bytes:
    """The exact bytes POSTed (and signed): the payload as compact JSON with sorted keys."""
    return json.dumps(row.payload, sort_keys=True, separators=(",", ":")).encode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 3xx is an answer of its own (not 2xx): the try failed


def _post(row: Notification) -> tuple[int | None, str]:
    """POST the row's payload; ``(HTTP status or None, error text or "")``."""
    body = body_of(row)
    request = urllib.request.Request(row.target, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "control-panel-notify/1",
        "X-CP-Delivery": str(row.uid), "X-CP-Event": row.payload.get("event", ""),
        "X-CP-Signature": signature(body, settings.CP_NOTIFY_WEBHOOK_SECRET)})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=settings.CP_NOTIFY_TIMEOUT) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code} {exc.reason}"
    except Exception as exc:  # refused, timed out, a bad URL: the try failed, say why
        return None, f"{type(exc).__name__}: {exc}"[:500]
    if not isinstance(status, int):  # not an HTTP answer at all
        return None, "the webhook's answer had no HTTP status"
    return status, "" if 200 <= status < 300 else f"HTTP {status}"


def _mail(row: Notification) -> tuple[None, str]:
    """Send the row's notice as email; ``(None, error text or "")``."""
    data = row.payload
    run = data["run"]
    what = "waits for a person" if data["event"] == EVENTS["waiting"] else f"ended: {run['status']}"
    label = " [simulated]" if run["simulated"] else ""
    subject = f"[Control Panel] Run {run['id']} ({run['pipeline']}){label} {what}"
    lines = [f"Run {run['id']} of pipeline {run['pipeline']}{label} {what}.", ""]
    if run["stop_reason"]:
        lines.append(f"Reason: {run['stop_reason']}: {run['stop_message'] or ''}")
    if data.get("decision"):
        decision = data["decision"]
        lines.append(f"Decision {decision['id']} ({decision['kind']}), files {decision['artifact'][:12] or '-'}.")
    if data.get("waiting"):
        lines.append(data["waiting"])
    if data.get("actions"):
        lines.append("What you can do: " + ", ".join(sorted(data["actions"])) + ".")
    lines += ["", f"Open the run: {run['link']}", "", f"Delivery id: {data['delivery']}"]
    try:
        send_mail(subject, "\n".join(lines), settings.CP_NOTIFY_EMAIL_FROM,
                  [a.strip() for a in row.target.split(",") if a.strip()], fail_silently=False)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]
    return None, ""


def backoff(tries: int) -> float:
    """Seconds before the next try after ``tries`` failed ones: CP_NOTIFY_BACKOFF * 2**(tries-1)."""
    return settings.CP_NOTIFY_BACKOFF * (2 ** max(0, tries - 1))


def deliver(pk: int, stale_before=None) -> str | None:
    """Try to deliver outbox row ``pk`` once: claim it (engine/machine.py ``notification_claim``;
    with ``stale_before`` a row stuck in sending since before it too), send it, record the try.
    Returns "delivered", "retry" (pending again, due after ``backoff``; ``engine.notify`` is sent
    for then), "failed" (its CP_NOTIFY_TRIES are used up), or None when it was not ours to try
    (delivered, failed, not due, claimed by another, gone). Never raises for a send's failure."""
    now = timezone.now()
    claimed = machine.notification_claim(pk, now, stale_before=stale_before)
    if claimed is None:
        return None
    row = Notification.objects.get(pk=pk)
    started = time.monotonic()
    if row.channel == Notification.Channel.WEBHOOK:
        status, error = _post(row)
    else:
        status, error = _mail(row)
    entry = {"at": timezone.now().isoformat(), "try": row.tries, "status": status, "error": error or None,
             "seconds": round(time.monotonic() - started, 3)}
    if not error:
        machine.notification_delivered(pk, claimed, entry, status)
        log.info("notification %s (%s, %s) of run %s delivered", row.uid, row.channel, row.key, row.run_id)
        return "delivered"
    if row.tries >= settings.CP_NOTIFY_TRIES:
        machine.notification_failed(pk, claimed, entry, status, error)
        log.error("notification %s (%s, %s) of run %s failed after %s tries: %s", row.uid, row.channel, row.key,
                  row.run_id, row.tries, error)
        return "failed"
    delay = backoff(row.tries)
    if machine.notification_retry(pk, claimed, entry, status, error, now + timedelta(seconds=delay)):
        enqueue([pk], countdown=delay)
    log.warning("notification %s (%s, %s) of run %s: try %s failed (%s); again in %.0f s", row.uid, row.channel,
                row.key, row.run_id, row.tries, error, delay)
    return "retry"


def deliver_all(ids: list[int]) -> dict[int, str | None]:
    """``deliver`` each of ``ids`` (the ``engine.notify`` task); ``{id: outcome}`` ("error" for a
    row whose try raised: logged, the others are still tried; the sweep finds it in sending later)."""
    outcomes: dict[int, str | None] = {}
    for pk in ids:
        try:
            outcomes[pk] = deliver(pk)
        except Exception:
            log.exception("notification %s: its delivery failed; the sweep tries it again", pk)
            outcomes[pk] = "error"
    return outcomes


def sweep(limit: int = SWEEP_LIMIT) -> int:
    """Deliver what is due (pending, ``next_attempt_at`` passed or empty) and what has been
    sending for more than CP_NOTIFY_STALE seconds (its worker died mid-try: this may deliver it a
    second time, with the same delivery id), oldest first, at most ``limit`` rows. Returns how
    many tries were made. Called by reconciliation (engine/reconcile.py)."""
    now = timezone.now()
    stale_before = now - timedelta(seconds=settings.CP_NOTIFY_STALE)
    due = Notification.objects.filter(
        Q(state=Notification.State.PENDING, next_attempt_at__isnull=True)
        | Q(state=Notification.State.PENDING, next_attempt_at__lte=now)
        | Q(state=Notification.State.SENDING, claimed_at__lt=stale_before)).order_by("id")
    tried = 0
    for pk in list(due.values_list("pk", flat=True)[:limit]):
        if deliver(pk, stale_before=stale_before) is not None:
            tried += 1
    return tried
