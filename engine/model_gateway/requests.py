"""What the model gateway reads in a request before it forwards it (no Django imports): whether its path is a
model call (``model_call``) or a harmless one (``harmless``), the model it asks for (``model_of``), a length or
chunk size (``number``), and how much of a relayed piece could begin the key (``key_start``)."""
from __future__ import annotations

import json
import re

from .usage import GEMINI_PATH

def key_start(data: bytes, key: bytes) -> int:
    """The length of the longest end of ``data`` that is a beginning of ``key`` (shorter than it): the bytes a
    relay holds back until it knows they are not the key, split between two reads."""
    for size in range(min(len(key) - 1, len(data)), 0, -1):
        if data.endswith(key[:size]):
            return size
    return 0


def number(text: bytes, base: int) -> int | None:
    """A length or chunk size: digits only (no sign, no space inside), else None."""
    allowed = b"0123456789abcdefABCDEF" if base == 16 else b"0123456789"
    if not text or len(text) > 16 or any(byte not in allowed for byte in text):
        return None
    return int(text, base)


#: Calls that are not model calls but that the CLIs make and that cost nothing: model lists, token counts.
HARMLESS = re.compile(r"(?:/v1(?:beta|alpha)?)?/models(?:/[^/:]+)?|/v1/messages/count_tokens"
                      r"|/v1(?:beta|alpha)?/models/[^/:]+:countTokens")


#: The model calls the gateway forwards (POST only), as paths below the upstream's base path, whole.
MODEL_CALLS = {"anthropic": re.compile(r"(?:/v\d+)?/messages"), "responses": re.compile(r"(?:/v\d+)?/responses"),
               "chat": re.compile(r"(?:/v\d+)?(?:/openai)?/chat/completions"),
               "gemini": re.compile(r"(?:/v1(?:beta|alpha)?)?/models/[A-Za-z0-9._-]+:(?:stream)?[gG]enerateContent")}


def model_call(method: str, path: str, base: str) -> str:
    """The wire format of a model call (``anthropic``, ``responses``, ``chat``, ``gemini``), or '' for anything
    else: another method, a path not below ``base`` (the upstream's base path), a ``.``/``..`` segment, or a
    path that only ends like a model call (``/v1/threads/x/messages``)."""
    if method != "POST" or not path.startswith(base) or any(part in (".", "..") for part in path.split("/")):
        return ""
    below = path[len(base):]
    return next((fmt for fmt, pattern in MODEL_CALLS.items() if pattern.fullmatch(below)), "")


def harmless(method: str, path: str) -> bool:
    """Whether a call that is no model call may still go upstream: a model list or a token count."""
    return bool(HARMLESS.fullmatch(path)) and (method in ("GET", "HEAD") or path.endswith(("count_tokens",
                                                                                          ":countTokens")))


def model_of(fmt: str, path: str, body: bytes) -> str:
    """The model a call asks for: the body's ``model``, or Gemini's path (``/models/<model>:...``)."""
    if fmt == "gemini":
        found = GEMINI_PATH.search(path)
        return found.group("model") if found else ""
    if not fmt or not body:
        return ""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    return str(data.get("model") or "")[:200] if isinstance(data, dict) else ""
