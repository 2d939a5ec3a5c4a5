"""Crash points for tests of recovery: a real process death at an exact place in a step.

``hit(point)`` ends the process at once (``os._exit(70)``, no cleanup, like a SIGKILL or an
out-of-memory kill) when the environment variable ``CP_TEST_FAULT`` names ``point``. Nothing
happens otherwise. Only tests set it, on the worker processes they start; the points are:

* ``checkpoint.before_commit``: the journal entry is recorded, no commit exists yet;
* ``checkpoint.after_commit``: the commit exists on the run's branch, the journal entry is
  still ``intent``;
* ``chain.after_hand_off``: a step of a chain (engine/runner.py ``advance_chain``) ended and handed
  the run off; the next step is claimed by no one and no message carries its token.
"""
from __future__ import annotations

import logging
import os
import sys

ENV = "CP_TEST_FAULT"
log = logging.getLogger("engine.faults")


def hit(point: str) -> None:
    """Die here when ``CP_TEST_FAULT`` is ``point``."""
    if os.environ.get(ENV) == point:
        log.error("CP_TEST_FAULT=%s: the process ends here, as a crash would end it", point)
        sys.stderr.flush()
        os._exit(70)
