"""detq's two brokers as kombu transports: the embedded folder and Redis, each refusing what it cannot use.

Both set aside a message detq's consumers could not use (not JSON, not a Celery message, a task detq does
not run, arguments a batch cannot have) instead of handing it on: on kombu's own transports, a message that
is not JSON raises inside the consumer, Celery calls that an unrecoverable error and the worker exits, so
one stray entry on a queue stopped one worker each. Set aside means kept where a person can look (the
folder's `dead/`, Redis's `detq.dead` list; `detq info`, the detq_dead_letters metric), the last
DEAD_LETTERS_KEPT of them, with why and when.

The embedded transport also reads its folder by name once and takes messages from that listing, where
kombu's lists and sorts the whole folder on every poll of every queue (a million queued images cost each
poll 0.3 s, an empty queue's poll more).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from queue import Empty
from time import monotonic, monotonic_ns
from typing import Any

from kombu.transport import filesystem, redis, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

from detq.contract import (
    INFERENCE_QUEUES,
    QUEUE_CONTROL,
    SENT_AGAIN_HEADER,
    TASK_PROCESS_BATCH,
    TASK_SCHEDULED_RUN,
    parse_batch_args,
)

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
DEAD_LETTER_KEY = "detq.dead"  # Redis: a list, newest first
DEAD_LETTER_FOLDER = "dead"  # the embedded broker: beside its queue folder, one JSON file each
DEAD_LETTERS_KEPT = 1000
DEAD_LETTER_RAW_BYTES = 64 * 1024  # of a set-aside message, what is kept to look at

# The queues detq's consumers read, and the one task each runs; any other queue (Celery's own remote
# control, replies) is handed on as kombu would.
TASKS_BY_QUEUE: dict[str, str] = {
    **dict.fromkeys(INFERENCE_QUEUES, TASK_PROCESS_BATCH),
    QUEUE_CONTROL: TASK_SCHEDULED_RUN,
}


class NamedByScheme(type):
    """A transport class that prints as its URL's scheme. kombu writes a connection's URL (`as_uri`: Celery's
    "Connected to" line, Flower, which picks its broker client by that URL's scheme) with the transport
    class in the scheme's place: given a class, "<class '...'>://host"."""

    scheme = ""

    def __str__(cls) -> str:
        return cls.scheme


# ---------------------------------------------------------------------------------------------------
# What a consumer of detq's queues can use


def unusable_reason(queue: str, payload: Any) -> str | None:
    """Why a decoded message on one of detq's queues cannot be run there, or None when it can.

    A kombu message as Celery's protocol 2 sends it: a JSON object with a JSON body, headers naming the
    queue's task and an id; a batch's arguments as parse_batch_args accepts them.
    """
    task = TASKS_BY_QUEUE.get(queue)
    if task is None:
        return None
    if not isinstance(payload, dict):
        return f"not a Celery message (a JSON {type(payload).__name__}, not an object)"
    headers, properties, body = payload.get("headers"), payload.get("properties"), payload.get("body")
    if not isinstance(headers, dict) or not isinstance(properties, dict) or not isinstance(body, str):
        return "not a Celery message (no headers, properties or body)"
    if payload.get("content-type") != "application/json":
        return f"content type {payload.get('content-type')!r} refused: detq reads JSON only"
    if headers.get("task") != task:
        return f"task {headers.get('task')!r} is not what queue {queue} runs ({task})"
    if not isinstance(headers.get("id"), str):
        return "no task id"
    try:
        text = base64.b64decode(body, validate=True) if properties.get("body_encoding") == "base64" else body
        arguments = json.loads(text)
    except (binascii.Error, ValueError) as exc:
        return f"its body is not JSON: {exc}"
    if not (isinstance(arguments, list) and len(arguments) == 3 and isinstance(arguments[0], list)):
        return "its body is not a task's [args, kwargs, embed]"
    if task == TASK_PROCESS_BATCH:
        try:
            parse_batch_args(*arguments[0])
        except (TypeError, ValueError) as exc:
            return f"not a batch: {exc}"
    return None


def decode(queue: str, raw: bytes) -> tuple[Any, str | None]:
    """The message in raw bytes taken from a queue, and why it cannot be used there (None: it can)."""
    try:
        payload = loads(bytes_to_str(raw))  # kombu's: as its transports decode (its type markers too)
    except ValueError as exc:  # UnicodeDecodeError is one
        return None, f"not JSON: {exc}"
    return payload, unusable_reason(queue, payload)


def dead_letter(queue: str, reason: str, raw: bytes) -> dict[str, Any]:
    """The record kept of a message set aside: where, why, when, and its first bytes."""
    return {
        "queue": queue,
        "reason": reason,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "size": len(raw),
        "raw": raw[:DEAD_LETTER_RAW_BYTES].decode("utf-8", errors="backslashreplace"),
    }


def _warn_set_aside(queue: str, reason: str, where: str) -> None:
    log.warning("detq: set aside a message of queue %s (%s): kept in %s", queue, reason, where)


# ---------------------------------------------------------------------------------------------------
# The embedded broker: a folder of message files


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


def queue_of(name: str) -> str | None:
    """The queue a message file of the embedded broker belongs to, by its name (<time>_<token>.<queue>.msg,
    a batch sent again 0..0_<time>_...); None for any other file (a *.partial being written)."""
    queue, dot, kind = name.partition(".")[2].rpartition(".")
    return queue if dot and kind == "msg" else None


class FolderListing:
    """The queue folder's message names by queue, in the order readers take them, from one listing.

    Listed again when a queue asked for has none left, and at least every REFRESH_S (a batch sent again
    sorts first and is seen by then); never more often than keeps listing to SHARE of the time, measured
    by what the last listing cost. A name taken meanwhile by another consumer fails its rename and is
    skipped. So a poll costs a listing only when the folder is small; at 62,500 queued messages, where
    one listing takes about 0.3 s, one every 6 s.
    """

    REFRESH_S = 1.0
    SHARE = 0.05

    def __init__(self, folder: str, clock: Callable[[], float] = monotonic) -> None:
        self.folder = folder
        self._clock = clock
        self._names: dict[str, list[str]] = {}  # queue: its names, the next to take last
        self._listed_at = float("-inf")
        self._cost = 0.0
        self.listings = 0

    def next_name(self, queue: str) -> str | None:
        """The next message name of this queue to try, or None when it has none."""
        names = self._names.get(queue)
        now = self._clock()
        since, spacing = now - self._listed_at, self._cost / self.SHARE
        if since >= spacing and (not names or since >= self.REFRESH_S):
            self._list(now)
            names = self._names.get(queue)
        return names.pop() if names else None

    def _list(self, now: float) -> None:
        by_queue: dict[str, list[str]] = {}
        for name in os.listdir(self.folder):
            if (queue := queue_of(name)) is not None:
                by_queue.setdefault(queue, []).append(name)
        for names in by_queue.values():
            names.sort(reverse=True)
        self._names = by_queue
        self._listed_at = now
        self._cost = self._clock() - now
        self.listings += 1


class Channel(filesystem.Channel):
    """Writes each message under a temporary name and renames it into place, so a reader never sees half
    a message; reads through a FolderListing; sets aside a message it cannot use (dead/).

    A torn file (its writer killed between write and rename cannot happen; a disk error can) is set
    aside like any other: a lost batch, which the reconciler sends again.
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
        self._listing: FolderListing | None = None

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
        if self._listing is None:
            self._listing = FolderListing(self.data_folder_in)
        while (name := self._listing.next_name(queue)) is not None:
            raw = self._take(name)
            if raw is None:
                continue  # another consumer took it first
            payload, reason = decode(queue, raw)
            if reason is None:
                return payload
            self._set_aside(queue, reason, raw)
        raise Empty()

    def _take(self, name: str) -> bytes | None:
        """The file's bytes, the file gone from the queue; None if another consumer renamed it first.

        Renamed into the processed folder first, on the same file system: of two consumers, one wins.
        (kombu moves it to the system's temporary folder, which can be another file system, where a move
        is a copy both can make.)
        """
        taken = os.path.join(self.processed_folder, name)
        try:
            os.rename(os.path.join(self.data_folder_in, name), taken)
        except OSError:
            return None
        try:
            with open(taken, "rb") as handle:
                return handle.read()
        except OSError as exc:
            log.warning("detq: cannot read message %s: %s; the reconciler sends its batch again", name, exc)
            return None
        finally:
            try:
                os.remove(taken)
            except OSError:
                pass

    def _set_aside(self, queue: str, reason: str, raw: bytes) -> None:
        folder = self.transport_options.get("dead_letter_folder") or os.path.join(
            os.path.dirname(self.data_folder_in), DEAD_LETTER_FOLDER
        )
        try:
            os.makedirs(folder, exist_ok=True)
            name = os.path.join(folder, f"{datetime.now(UTC):%Y%m%dT%H%M%S}_{self._unique()}.json")
            with open(name + PARTIAL_SUFFIX, "w", encoding="utf-8") as handle:
                json.dump(dead_letter(queue, reason, raw), handle)
            os.rename(name + PARTIAL_SUFFIX, name)
            kept = sorted(entry for entry in os.listdir(folder) if entry.endswith(".json"))
            for old in kept[:-DEAD_LETTERS_KEPT]:
                os.remove(os.path.join(folder, old))
        except OSError:
            log.exception("detq: could not keep a message set aside from queue %s (%s)", queue, reason)
            return
        _warn_set_aside(queue, reason, name)


class Transport(filesystem.Transport, metaclass=NamedByScheme):
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
    scheme = "filesystem"
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


# ---------------------------------------------------------------------------------------------------
# Redis


class RedisChannel(redis.Channel):
    """kombu's Redis channel, checking each message it pops from detq's queues before handing it on.

    The two reads are kombu's (`_brpop_read` for the event loop, `_get` for basic_get), with the decode
    checked: kombu 5.x parses the popped bytes inside them, where a failure escapes to Celery's consumer.
    """

    def _brpop_read(self, **options: Any) -> bool:
        channel: Any = self  # kombu's stubs know little of its Redis channel
        try:
            try:
                popped = channel.client.parse_response(channel.client.connection, "BRPOP", **options)
            except channel.connection_errors:
                # if there's a ConnectionError, disconnect so the next iteration reconnects (as kombu)
                channel.client.connection.disconnect()
                raise
            if not popped:
                raise Empty()
            dest, item = popped
            queue = bytes_to_str(dest).rsplit(channel.sep, 1)[0]
            channel._queue_cycle.rotate(queue)
            payload = self._checked(queue, item)
            if payload is None:
                raise Empty()  # set aside; the loop polls again
            channel.connection._deliver(payload, queue)
            return True
        finally:
            channel._in_poll = None
            flush = getattr(channel, "_flush_brpop_reauth", None)  # kombu >= 5.6: re-auth between BRPOPs
            if flush is not None:
                flush()

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        channel: Any = self
        with channel.conn_or_acquire() as client:
            for priority in channel.priority_steps:
                while item := client.rpop(channel._q_for_pri(queue, priority)):
                    payload = self._checked(queue, item)
                    if payload is not None:
                        channel._maybe_update_queues_expire(client, queue)
                        return payload
            channel._maybe_update_queues_expire(client, queue)
            raise Empty()

    def _checked(self, queue: str, item: bytes | str) -> Any:
        """The decoded message, or None once it is set aside on the detq.dead list."""
        channel: Any = self
        raw = str_to_bytes(item)
        payload, reason = decode(queue, raw) if queue in TASKS_BY_QUEUE else (loads(bytes_to_str(raw)), None)
        if reason is None:
            return payload
        try:
            with channel.conn_or_acquire() as client, client.pipeline() as pipe:
                pipe.lpush(DEAD_LETTER_KEY, json.dumps(dead_letter(queue, reason, raw)))
                pipe.ltrim(DEAD_LETTER_KEY, 0, DEAD_LETTERS_KEPT - 1)
                pipe.execute()
        except channel.connection_errors:
            log.exception("detq: could not keep a message set aside from queue %s (%s)", queue, reason)
            return None
        _warn_set_aside(queue, reason, f"the Redis list {DEAD_LETTER_KEY}")
        return None


class RedisTransport(redis.Transport, metaclass=NamedByScheme):
    """kombu's Redis transport with the checking channel, for redis:// URLs."""

    Channel = RedisChannel
    scheme = "redis"


class TlsRedisTransport(RedisTransport):
    """The same for rediss:// URLs (TLS: its settings come from the URL's query, detq.broker_url)."""

    scheme = "rediss"
