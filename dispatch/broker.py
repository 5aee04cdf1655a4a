"""What the broker holds of detq's batches: task ids queued, and on Redis the messages not yet acked."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery

from detq.broker_url import is_redis_url
from detq.contract import INFERENCE_QUEUES
from detq.settings import Settings
from detq.transports import DEAD_LETTER_FOLDER, DEAD_LETTER_KEY, queue_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unacked:
    """A message a consumer took from Redis and has not acknowledged yet."""

    tag: str
    task_id: str | None
    delivered_at: float  # Unix time


# A reconciler pass reads the messages of a queue holding at most this many; a deeper queue's are not read
# (it has work for every consumer, and its lost batches are sent once it falls under this): so a pass costs
# the same with a million images queued as with thirty thousand.
READ_LIMIT = 2000


@dataclass(frozen=True)
class BrokerView:
    """Task ids waiting in the inference queues; for Redis, the unacked messages; or why it cannot see.

    deep: the queues holding more than the read limit, whose messages were not read (queued lacks them).
    """

    queued: set[str] = field(default_factory=set)
    unacked: list[Unacked] = field(default_factory=list)
    visible: bool = True  # False: this transport cannot list its queues (lost messages go unnoticed)
    deep: frozenset[str] = frozenset()


def _task_id(payload: Any) -> str | None:
    try:
        task_id = payload["headers"]["id"]
    except (KeyError, TypeError):
        return None
    return task_id if isinstance(task_id, str) else None


def read_broker(
    app: Celery, settings: Settings, skip: frozenset[str] = frozenset(), empty: frozenset[str] = frozenset()
) -> BrokerView:
    """A snapshot of what the broker holds; a message sent or taken meanwhile may be missed (callers wait).

    skip: queues whose messages are not read (deep ones: unread_queues), the view's `deep`; empty: queues
    just counted empty (the embedded broker's folder is not listed when no other queue is left to read).
    """
    url = settings.resolved_broker_url
    if settings.is_embedded_broker:
        if not set(INFERENCE_QUEUES) - skip - empty:
            return BrokerView(deep=skip)
        return _read_folder(settings.broker_dir / "queue", skip)
    if is_redis_url(url):
        return _read_redis(app, skip)
    return BrokerView(visible=False)


def unread_queues(
    app: Celery, settings: Settings, limit: int = READ_LIMIT
) -> tuple[frozenset[str], frozenset[str]]:
    """The inference queues not worth reading, counted: (those holding more than `limit` messages, those
    holding none). A queue empty when counted and not when read: its message is missed for one pass."""
    depths = queue_depths(app, settings)
    deep = frozenset(queue for queue, depth in depths.items() if depth > limit)
    return deep, frozenset(queue for queue, depth in depths.items() if depth == 0)


def _read_folder(folder: Path, deep: frozenset[str]) -> BrokerView:
    """The embedded broker: one file per message, <time>_<token>.<queue>.msg, JSON inside."""
    queued: set[str] = set()
    by_queue: dict[str, list[str]] = {queue: [] for queue in INFERENCE_QUEUES}
    try:
        for name in os.listdir(folder):
            if (queue := queue_of(name)) in by_queue:
                by_queue[queue].append(name)
    except FileNotFoundError:
        return BrokerView()
    for queue, names in by_queue.items():
        if queue in deep:
            continue
        for name in names:
            try:
                task_id = queued_task_id((folder / name).read_bytes())
            except OSError:  # taken by a worker meanwhile
                continue
            if task_id is not None:
                queued.add(task_id)
    return BrokerView(queued=queued, deep=deep)


def _read_redis(app: Celery, deep: frozenset[str]) -> BrokerView:
    """kombu's Redis transport: a list per queue and priority, and the unacked hash with its index."""
    queued: set[str] = set()
    unacked: list[Unacked] = []
    with app.connection_for_read() as connection:
        channel: Any = connection.default_channel
        client = channel.client
        for queue in INFERENCE_QUEUES:
            if queue in deep:
                continue
            for priority in channel.priority_steps:
                for raw in _list_pages(client, channel._q_for_pri(queue, priority)):
                    task_id = queued_task_id(raw)
                    if task_id is not None:
                        queued.add(task_id)
        index, held = _unacked_state(client, channel.unacked_index_key, channel.unacked_key)
        delivered: dict[Any, float] = dict(index)
        for tag, raw in held.items():
            entry = _loads(raw)
            payload = entry[0] if isinstance(entry, list) and entry else None
            key = tag.decode() if isinstance(tag, bytes) else str(tag)
            when = delivered.get(tag, delivered.get(key))
            # A message with no delivery time is taken as delivered now: never given back on a guess
            stamp = float(when) if isinstance(when, int | float) else math.inf
            unacked.append(Unacked(tag=key, task_id=_task_id(payload), delivered_at=stamp))
    return BrokerView(queued=queued, unacked=unacked, deep=deep)


def _redis_depths(channel: Any) -> dict[str, int]:
    with channel.client.pipeline() as pipe:
        for queue in INFERENCE_QUEUES:
            for priority in channel.priority_steps:
                pipe.llen(channel._q_for_pri(queue, priority))
        lengths = iter(pipe.execute())
    return {queue: sum(int(next(lengths)) for _ in channel.priority_steps) for queue in INFERENCE_QUEUES}


def _unacked_state(
    client: Any, index_key: str, hash_key: str
) -> tuple[list[tuple[bytes, float]], dict[bytes, bytes]]:
    """kombu's unacked index (tag, delivery time) and hash (tag -> message), read in one MULTI: the
    state between two commands. Read apart, a message delivered between them was in the hash with no
    time, taken for one delivered at 0 and given back at once."""
    with client.pipeline(transaction=True) as pipe:
        pipe.zrange(index_key, 0, -1, withscores=True)
        pipe.hgetall(hash_key)
        index, held = pipe.execute()
    return list(index), dict(held)


# Messages read per LRANGE: a backlog of 60,000 batches is 60 MB of messages, which one LRANGE would hold
# in memory at once (with its parsed copies, about 130 MB) and which Redis would serve in one go.
LIST_PAGE = 1000


def _list_pages(client: Any, key: str) -> Iterator[bytes]:
    """Every message of a Redis list, a page at a time from its head (where kombu pushes).

    Consumers pop from the tail, which moves no message nearer the head; pushes at the head (new
    messages, some restores) move the others away from it. So a page never skips a message that stays
    queued; one may be read twice.
    """
    start = 0
    while page := client.lrange(key, start, start + LIST_PAGE - 1):
        yield from page
        if len(page) < LIST_PAGE:
            return
        start += LIST_PAGE


# A Celery (protocol 2) message as kombu stores it in Redis, JSON: the task id is the third header. JSON
# escapes every quote inside a string, so this can only match those keys; any other layout is parsed whole.
_CELERY_TASK_ID = re.compile(rb'"headers": \{"lang": "[^"\\]*", "task": "[^"\\]*", "id": "([^"\\]*)"')


def queued_task_id(raw: bytes) -> str | None:
    """The task id of a queued message: read in place in Celery's layout (5x cheaper than parsing the
    message, 60,000 of which a reconciler pass may read), else from the parsed message."""
    found = _CELERY_TASK_ID.search(raw)
    if found is not None:
        return found.group(1).decode(errors="replace")  # a forged id of bad bytes matches no batch
    return _task_id(_loads(raw))


def _loads(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def restore_unacked(app: Celery, tags: list[str]) -> int:
    """Put unacked Redis messages back where consumers take next (the list's tail: kombu pushes new
    messages at its head and consumers pop its tail), as kombu does after its visibility timeout, but now
    (their consumer is gone); returns how many were restored. Put at the head, a batch a hung worker held
    waited behind the whole backlog."""
    if not tags:
        return 0
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        for tag in tags:
            channel.qos.restore_by_tag(tag, client=channel.client, leftmost=False)
    return len(tags)


def queue_depths(app: Celery, settings: Settings) -> dict[str, int]:
    """Messages waiting in each inference queue; empty when the transport cannot count them."""
    if settings.is_embedded_broker:
        folder = settings.broker_dir / "queue"
        names = os.listdir(folder) if folder.is_dir() else []
        # <time>_<token>.<queue>.msg: by suffix, in C (a million queued images: 62,500 names, 15 ms)
        suffixes = {queue: f".{queue}.msg" for queue in INFERENCE_QUEUES}
        return {queue: len([n for n in names if n.endswith(end)]) for queue, end in suffixes.items()}
    if not is_redis_url(settings.resolved_broker_url):
        return {}
    with app.connection_for_read() as connection:
        return _redis_depths(connection.default_channel)


@dataclass(frozen=True)
class DeadLetters:
    """Messages the consumers set aside (detq/transports.py): how many are kept, the newest first."""

    count: int
    latest: list[dict[str, Any]]


def dead_letters(app: Celery | None, settings: Settings, latest: int = 5) -> DeadLetters:
    """What the broker's consumers set aside; none where the transport keeps no such place. (app: needed
    for Redis only; the embedded broker's are files, read without making its folders.)"""
    if settings.is_embedded_broker:
        folder = settings.broker_dir / DEAD_LETTER_FOLDER
        names = sorted((p for p in folder.glob("*.json")), reverse=True) if folder.is_dir() else []
        records = []
        for path in names[:latest]:
            try:
                records.append(json.loads(path.read_bytes()))
            except (OSError, ValueError):  # pruned meanwhile
                continue
        return DeadLetters(count=len(names), latest=records)
    if app is None or not is_redis_url(settings.resolved_broker_url):
        return DeadLetters(count=0, latest=[])
    with app.connection_for_read() as connection:
        connection.ensure_connection(max_retries=0, timeout=5)  # one try: a broker down says so at once
        client = connection.default_channel.client  # type: ignore[attr-defined]
        count = int(client.llen(DEAD_LETTER_KEY))
        entries = [_loads(raw) for raw in client.lrange(DEAD_LETTER_KEY, 0, latest - 1)] if latest else []
    return DeadLetters(count=count, latest=[e for e in entries if isinstance(e, dict)])
