"""What the reconciler reads of the broker: every queued task id, a page of a Redis list at a time, each
read in place where the message has Celery's layout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from detq.celery_app import make_celery_app
from detq.settings import Settings
from detq.vocabulary import JobPool
from dispatch import broker
from dispatch.broker import read_broker
from dispatch.send import send_batch
from producer.sender import ChunkSender


class RecordingClient:
    """A real Redis client whose LRANGE calls are noted."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.calls: list[tuple[int, int]] = []

    def lrange(self, key: str, start: int, end: int) -> list[bytes]:
        self.calls.append((start, end))
        return self.client.lrange(key, start, end)  # type: ignore[return-value]


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url)
    yield made
    made.close()


def test_a_redis_backlog_longer_than_a_page_is_read_whole(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 25 batches queued on Redis and pages of 10 messages
    settings = Settings(_env_file=None, broker_url=redis_url, database_url="sqlite://")
    app = make_celery_app(settings)
    with ChunkSender(app, 1, JobPool.CPU) as sender:
        sender.submit([(b, [b]) for b in range(1, 26)])
        sender.finish()
    monkeypatch.setattr(broker, "LIST_PAGE", 10)
    # When the reconciler reads the broker
    view = read_broker(app, settings)
    app.close()
    # Then it saw every batch's task id
    assert view.queued == {f"detq-batch-{b}" for b in range(1, 26)}


def test_pages_skip_no_message_while_others_are_pushed_and_popped(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a list of 25 messages, pushed at its head as kombu does (the oldest at the tail)
    client.lpush("q", *[f"m{n}" for n in range(25)])
    monkeypatch.setattr(broker, "LIST_PAGE", 10)
    recording = RecordingClient(client)
    seen = []
    # When it is read a page at a time while, after each page, a consumer pops the oldest message and a
    # producer pushes a new one
    for n, message in enumerate(broker._list_pages(recording, "q")):
        seen.append(message.decode())
        if n % 10 == 9:
            client.rpop("q")
            client.lpush("q", f"new{n}")
    # Then LRANGE read pages of 10, and every message still queued at the end was read
    assert recording.calls[:3] == [(0, 9), (10, 19), (20, 29)]
    left = {m.decode() for m in client.lrange("q", 0, -1)}
    assert left - {m for m in left if m.startswith("new")} <= set(seen)
    assert {f"m{n}" for n in range(3, 25)} <= set(seen)


def test_the_task_id_read_in_place_is_the_one_in_the_parsed_message(redis_url: str) -> None:
    # Given a batch message and a backup copy queued as detq sends them
    settings = Settings(_env_file=None, broker_url=redis_url, database_url="sqlite://")
    app = make_celery_app(settings)
    send_batch(app, job_id=1, batch_id=7, image_ids=[1, 2], pool=JobPool.CPU)
    send_batch(app, job_id=1, batch_id=8, image_ids=[3], pool=JobPool.CPU, backup=True)
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        raws = channel.client.lrange(channel._q_for_pri("cpu", 0), 0, -1)
    app.close()
    # Then the id read without parsing is the header's, for each
    assert len(raws) == 2
    for raw in raws:
        assert broker._CELERY_TASK_ID.search(raw) is not None
        assert broker.queued_task_id(raw) == json.loads(raw)["headers"]["id"]
    # And a message in another layout is parsed whole; one that is not JSON has none
    other = {"headers": {"id": "detq-batch-9", "lang": "py"}, "body": "e30="}
    assert broker.queued_task_id(json.dumps(other).encode()) == "detq-batch-9"
    assert broker.queued_task_id(b'{"body": "abc') is None
    # And an id of bytes that are not UTF-8 is read without an error (it names no batch)
    forged = b'{"headers": {"lang": "py", "task": "t", "id": "\xff\xfe"}}'
    assert broker.queued_task_id(forged) == "\ufffd\ufffd"


def test_a_message_delivered_between_the_reads_is_not_given_back(redis_url: str, client: redis.Redis) -> None:
    from datetime import UTC, datetime

    from dispatch.reconcile import _restore_orphans

    # Given a batch queued on Redis and delivered to a consumer that has not acked it
    settings = Settings(_env_file=None, broker_url=redis_url, database_url="sqlite://")
    app = make_celery_app(settings)
    with ChunkSender(app, 1, JobPool.CPU) as sender:
        sender.submit([(7, [7])])
        sender.finish()
    connection = app.connection_for_write()
    channel = connection.default_channel
    message = channel.basic_get("cpu", no_ack=False)
    assert message is not None
    tag = message.delivery_tag
    # And the broker caught as a reader reading the index and the hash apart saw it: in the hash, with no
    # delivery time in the index yet
    client.zrem(channel.unacked_index_key, tag)
    try:
        # When the reconciler reads the broker and looks for messages no live worker holds
        view = read_broker(app, settings)
        (seen,) = view.unacked
        given_back = _restore_orphans(app, view, set(), 0.0, datetime.now(UTC))
        # Then the message counts as just delivered: not given back on a guess
        assert (seen.tag, seen.task_id) == (tag, "detq-batch-7") and seen.delivered_at == float("inf")
        assert given_back == set() and client.llen("cpu") == 0
        # And once its delivery time shows, long past, with no live holder, it is given back where consumers
        # take next (the list's tail: kombu pushes at the head, consumers pop the tail), ahead of a backlog
        with ChunkSender(app, 1, JobPool.CPU) as sender:
            sender.submit([(b, [b]) for b in range(8, 30)])
            sender.finish()
        client.zadd(channel.unacked_index_key, {tag: 1.0})
        assert _restore_orphans(app, read_broker(app, settings), set(), 0.0, datetime.now(UTC)) == {
            "detq-batch-7"
        }
        assert client.llen("cpu") == 23
        next_taken = client.rpop("cpu")
        assert isinstance(next_taken, bytes) and broker.queued_task_id(next_taken) == "detq-batch-7"
    finally:
        connection.close()
        app.close()


def test_the_unacked_index_and_hash_are_read_in_one_transaction(redis_url: str, client: redis.Redis) -> None:
    # Given an index and a hash, and Redis' MONITOR showing every command it runs
    client.zadd("idx", {"t1": 5.0})
    client.hset("h", "t1", "[1]")
    reader = redis.Redis.from_url(redis_url)
    with client.monitor() as monitor:
        # When the reconciler's read of the unacked state runs
        index, held = broker._unacked_state(reader, "idx", "h")
        commands: list[str] = []
        while "EXEC" not in commands and len(commands) < 20:  # after the connection's own HELLO, SELECT
            name = str(monitor.next_command()["command"]).split()[0].upper()
            commands += [name] if name in ("MULTI", "ZRANGE", "HGETALL", "EXEC") else []
    reader.close()
    # Then both came back from one MULTI ... EXEC: nothing can change between them
    assert index == [(b"t1", 5.0)] and held == {b"t1": b"[1]"}
    assert commands == ["MULTI", "ZRANGE", "HGETALL", "EXEC"]


def test_the_embedded_broker_hands_out_a_batch_sent_again_before_its_backlog(tmp_path: Path) -> None:
    from dispatch.send import send_batch

    # Given the embedded broker with a backlog of 22 batches, then two batches the reconciler sends again
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    app = make_celery_app(settings)
    with ChunkSender(app, 1, JobPool.CPU) as sender:
        sender.submit([(b, [b]) for b in range(1, 23)])
        sender.finish()
    send_batch(app, job_id=1, batch_id=40, image_ids=[40], pool="cpu", again=True)
    send_batch(app, job_id=1, batch_id=41, image_ids=[41], pool="cpu", again=True)
    # When a worker's channel takes the next messages of the queue
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        taken = [channel.basic_get("cpu", no_ack=True) for _ in range(3)]
    app.close()
    # Then the batches sent again come first, in the order they were sent, then the backlog's oldest
    assert [message.headers["id"] for message in taken if message is not None] == [
        "detq-batch-40",
        "detq-batch-41",
        "detq-batch-1",
    ]


def test_a_deep_queue_is_counted_not_read_and_its_orphaned_message_still_given_back(
    redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    from db.ledger import open_ledger
    from dispatch.reconcile import reconcile
    from tests.dispatch.conftest import job_with_batch

    # Given a job on the cpu queue, three messages queued, one delivered long ago to a consumer gone quiet
    settings = Settings(_env_file=None, broker_url=redis_url, data_dir=tmp_path / "data", worker_timeout=30)
    ledger = open_ledger(settings)
    job_id, batch_id = job_with_batch(ledger)
    app = make_celery_app(settings)
    with ChunkSender(app, job_id, JobPool.CPU) as sender:
        sender.submit([(batch_id, [1, 2, 3]), (batch_id + 1, [4]), (batch_id + 2, [5]), (batch_id + 3, [6])])
        sender.finish()
    connection = app.connection_for_write()
    channel = connection.default_channel
    held = channel.basic_get("cpu", no_ack=False)
    assert held is not None
    client.zadd(channel.unacked_index_key, {held.delivery_tag: 1.0})
    try:
        # When the periodic pass runs with a read limit under the queue's depth
        report = reconcile(ledger, app, settings, read_limit=2)
        # Then the queue's messages were not read, and the orphan was put back all the same
        assert report.deep_queues == ["cpu"] and report.restored == 1
        assert read_broker(app, settings, skip=frozenset({"cpu"})).queued == set()
        assert client.llen("cpu") == 4
    finally:
        connection.close()
        app.close()
        ledger.close()
