"""kombu's filesystem transport with an atomic publish, for the embedded default broker.

kombu 5.7's ``filesystem`` transport creates the message file in the queue folder and then
writes into it; a consumer polling that folder can move and read the file before the write
lands, read zero bytes and die with ``JSONDecodeError`` (seen here with two workers). This
subclass writes each message to a sibling ``incoming`` folder first and renames it into the
queue folder, so a consumer only ever sees complete messages. Registered under the alias
``filesystem`` by ``controlpanel.celery``; nothing else changes.
"""
from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    """Publishes by write-then-rename; reading is kombu's own."""

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
