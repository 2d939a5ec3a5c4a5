"""The run detail page of the Control Panel and its action buttons, inside the admin site, in parts:
``common`` (limits, actions, small helpers), ``rows`` (stages, attempts, checks, manifests), ``page`` (the
page as data and its header), ``pages`` (the views: ``RunPages``) and ``actions`` (what each button calls).

``RunPages(model_admin).urls()`` gives the routes that ``RunAdmin.get_urls`` puts before the
admin's own (names in the ``admin`` namespace; ``<run>`` and the others are integer ids):

==============================  ==========================  ==================================================
``<run>/detail/``               ``engine_run_detail``       the page (staff with view permission)
``<run>/state/?v=VERSION``      ``engine_run_state``        204 while nothing changed, else ``HX-Refresh`` and
                                                            ``{"status", "label"}`` (the page of an unfinished
                                                            run polls it; run.js reloads, or says what changed
                                                            while a person types)
``<run>/attempt/<a>/tail/``     ``engine_run_attempt_tail`` the last ``TAIL_BYTES`` of the attempt's display log
                                                            (polled while the attempt is open, then no more;
                                                            ``?size=N&status=S``: 204 while the log is still
                                                            N bytes and the attempt S;
                                                            ``?live=1``: the first fragment after the attempt
                                                            ended carries ``HX-Trigger: cp-attempt-ended``)
``<run>/attempt/<a>/diff/``     ``engine_run_attempt_diff`` the attempt's patch as a coloured diff (the first
                                                            ``DIFF_BYTES``)
``<run>/check/<c>/log/``        ``engine_run_check_log``    a check's page: what ran, where, when, its exit
                                                            status, and the end of its log (``CHECK_LOG_BYTES``);
                                                            ``?raw=1``: the whole log, as text
``<run>/action/<verb>/``        ``engine_run_action``       POST only: start, approve, recheck, recover, fail
==============================  ==========================  ==================================================

Each action needs its permission (``ACTIONS``; 403 otherwise), validates its form
(controlpanel.forms) and calls only ``engine.operations``; a refusal comes back as an error
message naming the field, success as a success message, and both redirect to the page. On a
refusal what was typed is kept in the session (``KEPT_KEY``, under the run and the verb) and the
page fills that form with it once, marked and with the focus on the field at fault.

Cost of the page: a fixed number of queries whatever the number of attempts, checks, manifests
and events (the run, its stages, attempts, checks, manifests, decisions, the last
``EVENT_LIMIT`` events); logs and patches are referred to, never read (a log's size is a
``stat``); a manifest's record is read only from its start up to its first
``MANIFEST_CHANGES_SHOWN`` changes (the record's keys are sorted, so the changes come before the
long list of every file). Patches and logs load on demand.
"""
from .common import (
    CHECK_LOG_BYTES,
    HEADER_POLL_SECONDS,
    STATE_POLL_SECONDS,
    TAIL_BYTES,
    TAIL_POLL_SECONDS,
    applicable_actions,
    exit_text,
    seconds_text,
    state_version,
)
from .page import build_header, build_page, place_on_axis
from .pages import RunPages
from .rows import Box

__all__ = [
    "Box", "CHECK_LOG_BYTES", "HEADER_POLL_SECONDS", "RunPages", "STATE_POLL_SECONDS", "TAIL_BYTES",
    "TAIL_POLL_SECONDS", "applicable_actions", "build_header", "build_page", "exit_text", "place_on_axis",
    "seconds_text", "state_version",
]
