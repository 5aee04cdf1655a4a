"""The reconciler over a real SQLite ledger and the real embedded broker: what it sends again, what not."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from sqlalchemy import select

from db.batches_repo import mark_sent
from db.enqueue_repo import touch_enqueue
from db.jobs_repo import cancel_job, get_job
from db.ledger import Ledger
from db.models import Image, WorkerRecord, utcnow
from db.workers_repo import ROLE_NODE, Beat, WorkerIdentity, beat, register_worker
from detq.contract import task_id_for
from detq.settings import Settings
from dispatch.broker import read_broker
from dispatch.reconcile import reconcile
from dispatch.send import send_batch
from tests.dispatch.conftest import job_with_batch


def _queued(app: Celery, settings: Settings) -> set[str]:
    return read_broker(app, settings).queued


def test_a_batch_with_no_copy_anywhere_is_sent_again_after_its_grace(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given a batch recorded but whose message never reached the broker
    job_id, batch_id = job_with_batch(ledger)
    now = utcnow()
    # When the reconciler passes twice, the grace period apart
    first = reconcile(ledger, app, settings, now=now)
    assert (first.resent_batches, first.waiting) == (0, 1)
    assert _queued(app, settings) == set()
    second = reconcile(ledger, app, settings, now=now + timedelta(seconds=settings.missing_grace_s))
    # Then it is sent again, under its own task id, with its pending images
    assert (second.resent_batches, second.resent_images) == (1, 3)
    assert _queued(app, settings) == {task_id_for(batch_id)}
    # And a third pass leaves the queued copy alone
    third = reconcile(ledger, app, settings, now=now + timedelta(seconds=3 * settings.missing_grace_s))
    assert (third.resent_batches, third.waiting) == (0, 0)


def test_a_batch_still_queued_behind_a_backlog_is_never_sent_twice(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    job_id, batch_id = job_with_batch(ledger)
    send_batch(app, job_id=job_id, batch_id=batch_id, image_ids=[1, 2, 3], pool="cpu")
    with ledger.sessions() as s, s.begin():
        mark_sent(s, [batch_id], utcnow())
    later = utcnow() + timedelta(hours=5)
    for offset in range(3):
        report = reconcile(ledger, app, settings, now=later + timedelta(minutes=offset))
        assert (report.resent_batches, report.waiting) == (0, 0)
    assert len(list((settings.broker_dir / "queue").glob("*.msg"))) == 1


def test_a_batch_a_live_node_holds_is_left_alone_and_a_dead_ones_is_sent_again(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given a node that reported holding the batch, whose message left the broker
    job_id, batch_id = job_with_batch(ledger)
    now = utcnow()
    identity = WorkerIdentity(ROLE_NODE, "cpu@h", "h", "h/1", 10, "cpu")
    with ledger.sessions() as s, s.begin():
        node = register_worker(s, identity, now)
        beat(s, node, now, Beat(held=[task_id_for(batch_id)]))
    # Then while it beats, nothing is sent
    for offset in (0, 5, 10):
        assert reconcile(ledger, app, settings, now=now + timedelta(seconds=offset)).resent_batches == 0
    # When it stops beating past the timeout, it is closed as lost and its batch sent again at once (a
    # batch a lost worker held is in transit to no one: no grace)
    dead = now + timedelta(seconds=settings.worker_timeout + 1)
    report = reconcile(ledger, app, settings, now=dead)
    assert report.lost_workers == [node]
    assert (report.resent_batches, report.waiting) == (1, 0)
    assert task_id_for(batch_id) in _queued(app, settings)
    report = reconcile(ledger, app, settings, now=dead + timedelta(seconds=settings.missing_grace_s))
    assert report.resent_batches == 0
    with ledger.sessions() as s:
        assert s.get_one(WorkerRecord, node).stop_reason == "lost"


def test_a_job_whose_producer_stopped_mid_scan_is_closed_with_what_was_recorded(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given a job still enqueuing, its producer last seen long ago
    job_id, _ = job_with_batch(ledger, images=2, enqueued=False)
    with ledger.sessions() as s, s.begin():
        touch_enqueue(s, job_id, utcnow())
    report = reconcile(ledger, app, settings, now=utcnow() + timedelta(seconds=settings.worker_timeout + 1))
    # Then it is closed with its two recorded images, and the reason says so
    assert report.closed_jobs == [job_id]
    with ledger.sessions() as s:
        job = get_job(s, job_id)
        assert job is not None and job.enqueued_complete and job.total == 2
        assert "producer stopped" in (job.closed_reason or "")


def _job_behind_three_messages(ledger: Ledger, app: Celery) -> tuple[int, int]:
    """A recorded batch whose message never reached the broker, on a cpu queue holding three others."""
    job_id, batch_id = job_with_batch(ledger)
    for n in range(3):
        send_batch(app, job_id=job_id + 100, batch_id=batch_id + 100 + n, image_ids=[1], pool="cpu")
    return job_id, batch_id


def test_a_lost_batch_behind_a_deep_queue_waits_until_the_queue_falls_under_the_read_limit(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given a batch whose message never reached the broker, on a queue holding three other messages
    job_id, batch_id = _job_behind_three_messages(ledger, app)
    now = utcnow()
    # When the periodic pass looks with a read limit of two messages, long after the grace
    for offset in (0, 60, 120):
        report = reconcile(ledger, app, settings, now=now + timedelta(seconds=offset), read_limit=2)
        # Then the deep queue's batches are not looked at, nor its messages read
        assert report.deep_queues == ["cpu"]
        assert (report.resent_batches, report.waiting) == (0, 0)
    # When the queue falls to the limit (two taken by consumers)
    with app.connection_for_read() as connection:
        for _ in range(2):
            assert connection.default_channel.basic_get("cpu", no_ack=True) is not None
    # Then the lost batch is found missing, and sent after its grace
    later = now + timedelta(seconds=180)
    report = reconcile(ledger, app, settings, now=later, read_limit=2)
    assert (report.deep_queues, report.resent_batches, report.waiting) == ([], 0, 1)
    report = reconcile(
        ledger, app, settings, now=later + timedelta(seconds=settings.missing_grace_s), read_limit=2
    )
    assert (report.resent_batches, report.resent_images) == (1, 3)
    assert task_id_for(batch_id) in _queued(app, settings)
    # And `detq requeue` (no read limit) would have found it at once, however deep the queue
    assert reconcile(ledger, app, settings, now=later, grace_s=0).deep_queues == []


def test_a_batch_a_lost_node_held_is_sent_again_however_deep_its_queue(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given a node holding a batch whose message left the broker, on a queue deeper than the read limit
    job_id, batch_id = _job_behind_three_messages(ledger, app)
    now = utcnow()
    with ledger.sessions() as s, s.begin():
        node = register_worker(s, WorkerIdentity(ROLE_NODE, "cpu@h", "h", "h/1", 10, "cpu"), now)
        beat(s, node, now, Beat(held=[task_id_for(batch_id)]))
    # When it stops beating (hung, or gone) past the timeout
    dead = now + timedelta(seconds=settings.worker_timeout + 1)
    report = reconcile(ledger, app, settings, now=dead, read_limit=2)
    # Then it is closed as lost and its batch sent again at once, though the queue is not read: ahead of
    # the backlog, not once the backlog has drained
    assert (report.lost_workers, report.deep_queues) == ([node], ["cpu"])
    assert (report.resent_batches, report.resent_images) == (1, 3)
    assert task_id_for(batch_id) in _queued(app, settings)
    # And once sent, the next pass (which cannot see it queued) leaves it alone
    later = dead + timedelta(seconds=3 * settings.missing_grace_s)
    assert reconcile(ledger, app, settings, now=later, read_limit=2).resent_batches == 0


def test_a_cancelled_jobs_batch_is_never_sent_again_and_its_rows_are_written_cancelled(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given a batch whose message never reached the broker, of a job then cancelled
    job_id, batch_id = job_with_batch(ledger)
    with ledger.sessions() as s, s.begin():
        assert cancel_job(s, job_id, utcnow()) == 3
    # When the reconciler passes, past the batch's grace
    report = reconcile(ledger, app, settings, now=utcnow() + timedelta(hours=1))
    # Then nothing is sent, and the job's rows the cancel left pending are written cancelled
    assert (report.resent_batches, report.waiting, report.cancelled_rows) == (0, 0, 3)
    assert _queued(app, settings) == set()
    with ledger.reads() as s:
        statuses = s.scalars(select(Image.status).where(Image.job_id == job_id)).all()
    assert statuses == ["cancelled"] * 3
