"""The embedded broker: kombu's filesystem transport, made safe against partly written message files."""

from __future__ import annotations

import logging
import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"


class Channel(filesystem.Channel):
    """Writes each message under a temporary name and renames it into place, so a reader never sees half
    a message; a message file that still cannot be read is dropped with a warning instead of stopping
    the consumer (kombu raises, and Celery calls that an unrecoverable error: the worker exits).

    A dropped message is a lost batch like any other: the reconciler sends it again.
    """

    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        # (The ignore: kombu's stubs name this argument differently in its two base classes.)
        # The name kombu gives it (readers take files in name order, a per-host monotonic time first), with
        # the time zero-padded: unpadded, "99999_" sorts after "100000_" and a torn "1_x" after "12345_y".
        name = f"{int(round(monotonic() * 1000)):015d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + PARTIAL_SUFFIX  # not *.<queue>.msg: no reader picks it up
        with open(partial, "wb") as handle:
            handle.write(str_to_bytes(dumps(payload)))
        os.rename(partial, final)  # atomic on one file system

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        while True:
            try:
                return super()._get(queue)
            except ValueError as exc:  # a truncated or corrupt file, already taken out of the queue
                log.warning("detq: dropped an unreadable message of queue %s: %s", queue, exc)


class Transport(filesystem.Transport):
    """kombu's filesystem transport with the safe channel."""

    Channel = Channel
