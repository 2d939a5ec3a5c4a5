"""The stored files of an attempt that the Control Panel serves: prompt, output log, raw output (stdout), stderr, patch,
transcript (engine/text/transcript.py: beside the raw log, no field of its own).

Used by the attempt's admin page (controlpanel/admin.py ``AttemptAdmin``) and by the run page
(controlpanel/views/). A file is served only from the attempt's own recorded path, and only
when that path resolves inside its run's control records (``CP_VAR_DIR/runs/<run>/``): never an
arbitrary path.
"""
from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from engine.text import transcript
from engine.models import Attempt

#: The files of an attempt that its page serves: URL name -> (Attempt field, label, sha256 field).
ATTEMPT_FILES = {
    "prompt": ("prompt_path", "prompt", "prompt_sha256"),
    "log": ("log_path", "output log", ""),
    "raw": ("raw_path", "raw output: stdout (redacted bytes)", ""),
    "stderr": ("stderr_path", "stderr (redacted bytes)", ""),
    "patch": ("patch_path", "patch", "patch_sha256"),
    "transcript": ("raw_path", "transcript (the CLI's own account of the conversation, normalized)", ""),
    "conversation": ("raw_path", "conversation (what the model was sent and answered, at the model gateway)", ""),
}
#: The files that lie beside the raw log, with no field of their own.
BESIDE_RAW = {"transcript": transcript.FILE_NAME, "conversation": "conversation.jsonl"}


def attempt_file(attempt: Attempt, kind: str) -> Path | None:
    """The stored file ``kind`` of ``attempt`` (ATTEMPT_FILES), or None.

    Only the attempt's own recorded path is used, and only when it resolves (symlinks
    followed) to a regular file inside its run's control records; anything else is None.
    """
    if kind not in ATTEMPT_FILES:
        return None
    if kind in BESIDE_RAW:  # no field of its own: beside the raw log (engine/text/transcript.py, engine/model_gateway)
        raw = attempt.raw_path or ""
        rel = os.path.join(os.path.dirname(raw), BESIDE_RAW[kind]) if raw else ""
    else:
        rel = getattr(attempt, ATTEMPT_FILES[kind][0]) or ""
    if not rel or os.path.isabs(rel) or "\x00" in rel:
        return None
    base = os.path.realpath(os.path.join(settings.VAR_DIR, attempt.run.control_dir))
    real = os.path.realpath(os.path.join(settings.VAR_DIR, rel))
    if not real.startswith(base + os.sep) or not os.path.isfile(real):
        return None
    return Path(real)
