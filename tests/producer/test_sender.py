"""The enqueue's sender on real Redis: a chunk goes out pipelined, and a pipelined send that fails is sent
again message by message, so that nothing is lost (a copy that had arrived is run once: the ledger)."""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.signals import before_task_publish

from detq.celery_app import make_celery_app
from detq.contract import batch_id_of
from detq.settings import Settings
from producer.sender import ChunkSender

BATCHES = [(batch_id, [batch_id * 10, batch_id * 10 + 1]) for batch_id in range(1, 41)]


@pytest.fixture()
def app(redis_url: str, tmp_path: Path) -> Iterator[Celery]:
    settings = Settings(_env_file=None, data_dir=tmp_path, broker_url=redis_url)
    app = make_celery_app(settings)
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        "client_name": f"detq-test-sender-{uuid.uuid4().hex[:8]}",  # so the test can cut this client only
    }
    yield app
    app.close()


def queued_batches(redis_url: str) -> Counter[int]:
    """How many copies of each batch the cpu queue holds."""
    client = redis.Redis.from_url(redis_url)
    try:
        messages = [json.loads(raw) for raw in client.lrange("cpu", 0, -1)]
    finally:
        client.close()
    return Counter(batch_id_of(m["headers"]["id"]) or 0 for m in messages)


def test_a_chunk_is_queued_once_per_batch(app: Celery, redis_url: str) -> None:
    # When a chunk of 40 batches is sent
    with ChunkSender(app, job_id=7, pool="cpu") as sender:
        sender.submit(BATCHES)
        sent = sender.finish()
    # Then each batch is queued once, and the sender counts what it sent
    assert sent == [batch_id for batch_id, _ in BATCHES]
    assert queued_batches(redis_url) == Counter({batch_id: 1 for batch_id, _ in BATCHES})
    assert (sender.batches, sender.images) == (40, 80)


class _MendOnWarning(logging.Handler):
    """Deletes the broken key when the sender logs that it sends one by one: between the two tries."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        super().__init__(logging.WARNING)
        self.client, self.key = client, key
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.client.delete(self.key)


def test_a_failed_pipelined_send_is_sent_again_one_by_one(app: Celery, redis_url: str) -> None:
    # Given the queue's key turned into a string while the chunk is buffered, so every pipelined LPUSH
    # fails (WRONGTYPE), and mended once the sender says it sends again
    admin = redis.Redis.from_url(redis_url)
    mend = _MendOnWarning(admin, "cpu")
    broken: list[bool] = []

    def break_the_queue(sender: Any = None, **kwargs: Any) -> None:
        if not broken and kwargs["headers"]["id"] == "detq-batch-40":
            broken.append(admin.set("cpu", "not a list") or False)

    before_task_publish.connect(break_the_queue, weak=False)
    logging.getLogger("producer.sender").addHandler(mend)
    try:
        # When the chunk is sent
        with ChunkSender(app, job_id=7, pool="cpu") as sender:
            sender.submit(BATCHES)
            sent = sender.finish()
    finally:
        logging.getLogger("producer.sender").removeHandler(mend)
        before_task_publish.disconnect(break_the_queue)
        admin.close()
    # Then the pipelined send failed as a whole, was sent again one by one, and each batch is queued once
    assert broken == [True]
    (warning,) = mend.messages
    assert "sending them one by one" in warning and "WRONGTYPE" in warning
    assert sent == [batch_id for batch_id, _ in BATCHES]
    assert queued_batches(redis_url) == Counter({batch_id: 1 for batch_id, _ in BATCHES})
    assert (sender.batches, sender.images) == (40, 80)


def test_a_connection_cut_before_the_pipeline_runs_loses_no_batch(app: Celery, redis_url: str) -> None:
    # Given the producer's Redis connection cut while its chunk is buffered (redis-py reconnects and runs
    # the pipeline again; a message may then arrive twice, which the ledger runs once)
    name = app.conf.broker_transport_options["client_name"]
    cut: list[int] = []

    def cut_the_producer(sender: Any = None, **kwargs: Any) -> None:
        if cut or kwargs["headers"]["id"] != "detq-batch-40":
            return
        admin = redis.Redis.from_url(redis_url)
        try:
            ids = [c["id"] for c in admin.client_list() if c.get("name") == name]
            cut.extend(int(admin.client_kill_filter(_id=i)) for i in ids)
        finally:
            admin.close()

    before_task_publish.connect(cut_the_producer, weak=False)
    try:
        # When the chunk is sent
        with ChunkSender(app, job_id=7, pool="cpu") as sender:
            sender.submit(BATCHES)
            sent = sender.finish()
    finally:
        before_task_publish.disconnect(cut_the_producer)
    # Then the cut happened and every batch is queued at least once
    assert sum(cut) >= 1
    assert sent == [batch_id for batch_id, _ in BATCHES]
    assert set(queued_batches(redis_url)) == {batch_id for batch_id, _ in BATCHES}
