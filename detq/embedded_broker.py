"""The embedded broker: kombu's filesystem transport, made safe against partly written message files."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import uuid
from queue import Empty
from time import monotonic, monotonic_ns
from typing import Any

from kombu.transport import filesystem, virtual
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

from detq.contract import SENT_AGAIN_HEADER

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"


class QoS(virtual.QoS):
    """kombu's prefetch accounting, which also wakes the node's drain loop when a slot frees."""

    def ack(self, delivery_tag: Any) -> None:
        super().ack(delivery_tag)
        _wake(self.channel)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        super().reject(delivery_tag, requeue=requeue)
        _wake(self.channel)


def _wake(channel: Any) -> None:
    transport = channel.connection
    if isinstance(transport, Transport):
        transport.slot_freed.set()


class Channel(filesystem.Channel):
    """Writes each message under a temporary name and renames it into place, so a reader never sees half
    a message; a message file that still cannot be read is dropped with a warning instead of stopping
    the consumer (kombu raises, and Celery calls that an unrecoverable error: the worker exits).

    A dropped message is a lost batch like any other: the reconciler sends it again.
    """

    QoS = QoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Message names and delivery tags are a random token and a count: unique as uuid4s are, without
        # a uuid4 a message. Each of those reads the system's random source, letting go of the GIL, and
        # on an enqueue's sending thread getting it back from the threads that scan and write the ledger
        # took 0.1 to 0.3 ms a time, on the thread that set the pace. A forked copy of the channel draws
        # a token of its own.
        self._pid = -1
        self._token = ""
        self._numbers = itertools.count()

    def _unique(self) -> str:
        if (pid := os.getpid()) != self._pid:
            self._pid, self._token = pid, uuid.uuid4().hex
        return f"{self._token}-{next(self._numbers):09d}"

    def _next_delivery_tag(self) -> str:
        return self._unique()

    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        # (The ignore: kombu's stubs name this argument differently in its two base classes.)
        # Named as kombu names it (readers take files in name order, a per-host monotonic time first), but
        # in nanoseconds, zero-padded: in kombu's milliseconds, the batches one enqueue sends within a
        # millisecond came out in the order of their random uuids, and a job's tapered last batches were
        # taken small before large; unpadded, "99999_" sorts after "100000_".
        name = f"{monotonic_ns():020d}_{self._unique()}.{queue}.msg"
        if payload.get("headers", {}).get(SENT_AGAIN_HEADER):
            # Sent again by the reconciler (its batch lost, or held by a worker gone): named to sort before
            # every other message (their times are not all zeros), in the order such messages were sent
            name = f"{0:020d}_{name}"
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
    """kombu's filesystem transport with the safe channel, waking for a free prefetch slot, polling faster
    while the node is busy.

    kombu's loop sleeps polling_interval after every empty poll, also when the node cannot take a message
    because each prefetch slot is in use: a pool process that finishes a batch then waits half that
    interval on average for its next one. Here a node whose slots are full waits for an ack or a reject
    (QoS sets slot_freed) and polls the moment one comes, without spinning meanwhile; a node with a free
    slot that took a message in the last BUSY_S seconds polls every busy_polling_interval, an idle node
    as configured.
    """

    Channel = Channel
    busy_polling_interval = 0.005
    BUSY_S = 2.0
    _last_delivery = float("-inf")

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.slot_freed = threading.Event()

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:  # type: ignore[override]
        # (The ignore: as for _put, kombu's stubs give this method two signatures in its two bases.)
        cycle, idle = self.cycle, float(self.polling_interval or 0.0)
        assert cycle is not None, "kombu sets the cycle when the transport is created"
        began = monotonic()
        while True:
            self.slot_freed.clear()  # before the poll: an ack from here on ends the wait below at once
            try:
                cycle.get(self._deliver, timeout=timeout)
            except Empty:
                now = monotonic()
                if timeout is not None and now - began >= timeout:
                    raise TimeoutError() from None
                full = self._slots_full()
                pause = self.busy_polling_interval if self._recent(now) and not full else idle
                if timeout is not None:
                    pause = min(pause, max(0.0, timeout - (now - began)))
                # An ack ends the pause whether or not the slots were full when looked at: one that came
                # between the poll and that look has set the event already, and the next poll is at once.
                self.slot_freed.wait(pause)
            else:
                self._last_delivery = monotonic()
                return

    def _slots_full(self) -> bool:
        return any(channel._consumers and not channel.qos.can_consume() for channel in self.channels or ())

    def _recent(self, now: float) -> bool:
        return now - self._last_delivery < self.BUSY_S
