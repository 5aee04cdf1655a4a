"""Backups at a queue's tail over a real SQLite ledger and the real embedded broker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery

from db.batches_repo import mark_sent, open_batches
from db.ledger import Ledger
from db.models import utcnow
from db.workers_repo import live_workers
from detq.contract import backup_task_id_for, task_id_for
from detq.settings import Settings
from dispatch import tail
from dispatch.backups import node_loads
from dispatch.broker import queue_depths, read_broker
from dispatch.send import send_batch
from dispatch.tail import send_backups, tail_pass
from tests.dispatch.conftest import batch_on_slow_node, job_with_batch, live_node


def test_an_idle_node_next_to_an_empty_queue_gets_a_backup_of_a_batch_running_elsewhere(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given a batch sent a while ago and taken by a busy slow node, while a fast node idles
    batch_id = batch_on_slow_node(ledger, utcnow() - timedelta(seconds=60))
    live_node(ledger, "fast", 2, [])
    # When the tail pass runs
    assert tail_pass(ledger, app, settings) == 1
    # Then a backup copy is queued under its own task id, and a pass right after sends no other
    assert read_broker(app, settings).queued == {backup_task_id_for(batch_id)}
    assert tail_pass(ledger, app, settings) == 0


def test_no_backup_while_the_queue_still_has_work(ledger: Ledger, app: Celery, settings: Settings) -> None:
    # Given a running batch, an idle node, and another batch of the job still waiting in the queue
    job_id, running = job_with_batch(ledger)
    _, waiting = job_with_batch(ledger)
    with ledger.sessions() as s, s.begin():
        mark_sent(s, [running, waiting], utcnow() - timedelta(seconds=60))
    send_batch(app, job_id=job_id, batch_id=waiting, image_ids=[1], pool="cpu")
    live_node(ledger, "slow", 1, [task_id_for(running)])
    live_node(ledger, "fast", 2, [])
    # Then the tail pass sends nothing: the idle node will take the waiting batch
    assert tail_pass(ledger, app, settings) == 0
    assert read_broker(app, settings).queued == {task_id_for(waiting)}


def test_a_short_jobs_tail_gets_its_backup_without_waiting_for_the_missing_grace(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given a batch sent a moment ago (a job shorter than the missing grace) that a busy slow node took
    batch_id = batch_on_slow_node(ledger, utcnow())
    live_node(ledger, "fast", 2, [])
    # When the tail pass runs, then its backup goes out at once
    assert tail_pass(ledger, app, settings) == 1
    assert read_broker(app, settings).queued == {backup_task_id_for(batch_id)}


def test_two_passes_that_read_the_same_batch_send_one_backup(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given two passes (a lease holder and an idle node) that both read a batch a busy slow node holds
    batch_on_slow_node(ledger, utcnow() - timedelta(seconds=60))
    live_node(ledger, "fast", 2, [])
    now = utcnow()
    with ledger.sessions() as s:
        batches = open_batches(s)
        nodes = node_loads(live_workers(s, now - timedelta(seconds=30)))
    # When each sends the backups it chose from what it read
    sent = [send_backups(ledger, app, batches, nodes, set(), now, settings.missing_grace_s) for _ in range(2)]
    # Then one copy went out between them
    assert sent == [1, 0]
    assert queue_depths(app, settings)["cpu"] == 1


@pytest.mark.parametrize("fast_holds", [False, True], ids=["idle fleet", "every node busy"])
def test_a_pass_with_no_busy_node_beside_an_idle_one_reads_neither_the_queues_nor_the_batches(
    ledger: Ledger, app: Celery, settings: Settings, monkeypatch: pytest.MonkeyPatch, fast_holds: bool
) -> None:
    # Given open batches sent a while ago, and either only idle nodes or only fully busy ones
    _, first = job_with_batch(ledger)
    _, second = job_with_batch(ledger)
    with ledger.sessions() as s, s.begin():
        mark_sent(s, [first, second], utcnow() - timedelta(seconds=60))
    live_node(ledger, "slow", 1, [task_id_for(first)] if fast_holds else [])
    live_node(ledger, "fast", 1, [task_id_for(second)] if fast_holds else [])

    def not_read(*_: object) -> None:
        raise AssertionError("read although no backup can be sent")

    monkeypatch.setattr(tail, "queue_depths", not_read)
    monkeypatch.setattr(tail, "open_batches", not_read)
    # When the tail pass runs (the lease holder's, every half second), then it stops at the worker rows
    assert tail_pass(ledger, app, settings) == 0
