"""Fixtures of the dispatch tests: a real SQLite ledger and the real embedded broker, a recorded job, a
live worker node."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from celery import Celery

from db.batches_repo import create_batches, mark_sent
from db.images_repo import NewImage, insert_images
from db.jobs_repo import create_job, finish_enqueue, get_or_create_model
from db.ledger import Ledger, open_ledger
from db.models import utcnow
from db.workers_repo import ROLE_NODE, ROLE_PROCESS, Beat, WorkerIdentity, beat, register_worker
from detq.celery_app import make_celery_app
from detq.contract import task_id_for
from detq.settings import Settings


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(_env_file=None, data_dir=tmp_path / "data", worker_timeout=30)


@pytest.fixture()
def ledger(settings: Settings) -> Iterator[Ledger]:
    opened = open_ledger(settings)
    yield opened
    opened.close()


@pytest.fixture()
def app(settings: Settings) -> Iterator[Celery]:
    made = make_celery_app(settings)
    yield made
    made.close()


def job_with_batch(ledger: Ledger, images: int = 3, *, enqueued: bool = True) -> tuple[int, int]:
    """A job with one batch of pending images recorded (not sent); (job id, batch id)."""
    with ledger.sessions() as s, s.begin():
        model = get_or_create_model(s, sha256="a" * 64, path="/m.pt", size_bytes=1, meta={})
        job = create_job(s, model_id=model.id, roots=["/d"], pool="cpu", batch_size=8)
        (batch_id,) = create_batches(s, job.id, [images], utcnow())
        insert_images(
            s, job.id, [NewImage(f"/d/{i}.jpg", 1, 1.0, 0, batch_id=batch_id) for i in range(images)]
        )
        if enqueued:
            finish_enqueue(s, job.id, images)
        return job.id, batch_id


def live_node(ledger: Ledger, name: str, processes: int, held: list[str]) -> int:
    """A worker node that beat just now holding these task ids, with its pool processes; the node's row id."""
    now = utcnow()
    with ledger.sessions() as s, s.begin():
        node = register_worker(s, WorkerIdentity(ROLE_NODE, name, "h", "k", os.getpid(), "cpu"), now)
        beat(s, node, now, Beat(held=held))
        for _ in range(processes):
            register_worker(s, WorkerIdentity(ROLE_PROCESS, name, "h", "k", os.getpid(), "cpu"), now)
        return node


def batch_on_slow_node(ledger: Ledger, sent_at: datetime) -> int:
    """A job's batch, sent at sent_at and held by a busy node "slow" of one process; the batch's id."""
    _, batch_id = job_with_batch(ledger)
    with ledger.sessions() as s, s.begin():
        mark_sent(s, [batch_id], sent_at)
    live_node(ledger, "slow", 1, [task_id_for(batch_id)])
    return batch_id
