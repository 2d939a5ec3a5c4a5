"""kombu's filesystem transport with an atomic publish, for the embedded default broker.

kombu 5.7's ``filesystem`` transport creates the message file in the queue folder and then
writes into it; a consumer polling that folder can move and read the file before the write
lands, read zero bytes and die with ``JSONDecodeError`` (seen here with two workers). This
subclass writes each message to a sibling ``incoming`` folder first and renames it into the
queue folder, so a consumer only ever sees complete messages. Registered under the alias
``filesystem`` by ``controlpanel.celery``; nothing else changes.
"""
from __future__ import annotations

import logging
import os
import shutil
import uuid
from queue import Empty
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger("controlpanel.fs_broker")


class Channel(filesystem.Channel):
    """Publishes by write-then-rename; a message that cannot be decoded is set aside, not fatal."""

    def _get(self, queue):
        """The next message of ``queue``; a file that is not a message (empty, cut, foreign) is moved
        to the sibling ``broken`` folder and logged instead of killing the worker (kombu 5.7 raises)."""
        suffix = f".{queue}.msg"
        for filename in sorted(os.listdir(self.data_folder_in)):
            if not filename.endswith(suffix) or filename.partition(".")[2] != f"{queue}.msg":
                continue
            source = os.path.join(self.data_folder_in, filename)
            taken = os.path.join(os.path.dirname(os.path.abspath(self.data_folder_in)), "taken", filename)
            os.makedirs(os.path.dirname(taken), exist_ok=True)
            try:
                os.rename(source, taken)  # atomic: exactly one consumer takes it
            except OSError:
                continue
            try:
                with open(taken, "rb") as fh:
                    payload = fh.read()
                message = loads(bytes_to_str(payload))
                if not isinstance(message, dict) or not isinstance(message.get("properties"), dict) \
                        or "body" not in message:
                    raise ValueError("not a kombu message (no properties or body)")
            except (OSError, ValueError) as exc:
                broken = os.path.join(os.path.dirname(taken), os.pardir, "broken", filename)
                os.makedirs(os.path.dirname(broken), exist_ok=True)
                shutil.move(taken, broken)
                log.error("broker: %s is not a readable message (%s); moved to %s", filename, exc,
                          os.path.normpath(broken))
                continue
            os.remove(taken)
            return message
        raise Empty()

    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        incoming = os.path.join(os.path.dirname(os.path.abspath(self.data_folder_out)), "incoming")
        os.makedirs(incoming, exist_ok=True)
        staged = os.path.join(incoming, name)
        try:
            with open(staged, "wb") as fh:
                fh.write(str_to_bytes(dumps(payload)))
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(staged, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add message {name!r} to {self.data_folder_out!r}") from exc


class Transport(filesystem.Transport):
    Channel = Channel
