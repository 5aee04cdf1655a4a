"""One pass of the reconciler: close what died, give back what it held, send again what no copy delivers;
and write a chunk of the rows a cancel left (db/jobs_repo.py, write_cancelled_rows)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from celery import Celery

from db.batches_repo import (
    OpenBatch,
    assign_batch,
    mark_sent,
    missing_batch_ids,
    open_batches,
    pending_ids_of_batch,
    set_missing,
)
from db.clock import ledger_now
from db.enqueue_repo import PRODUCER_GONE_REASON, close_stale_enqueue, stale_enqueues
from db.jobs_repo import CANCELLED_ROWS_AT_ONCE, write_cancelled_rows
from db.ledger import Ledger
from db.models import WorkerRecord, as_utc
from db.retry import in_transaction
from db.workers_repo import ROLE_NODE, close_lost_workers, held_by_unseen, live_workers
from detq.contract import batch_id_of, batches_of, is_backup, queue_for_pool, task_id_for
from detq.settings import Settings
from dispatch.backups import node_loads
from dispatch.broker import BrokerView, read_broker, restore_unacked, unread_queues
from dispatch.send import send_batch
from dispatch.tail import send_backups

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    """What a pass did."""

    lost_workers: list[int] = field(default_factory=list)
    closed_jobs: list[int] = field(default_factory=list)
    restored: int = 0
    resent_batches: int = 0
    resent_images: int = 0
    waiting: int = 0  # batches missing, within their grace period
    backups: int = 0  # copies sent at a queue's tail for idle workers
    deep_queues: list[str] = field(default_factory=list)  # over the read limit: their batches not looked at
    cancelled_rows: int = 0  # pending rows of cancelled jobs written cancelled (db/jobs_repo.py)

    @property
    def acted(self) -> bool:
        """True when the pass changed anything."""
        return bool(self.lost_workers or self.closed_jobs or self.restored or self.resent_batches)


def held_task_ids(workers: Sequence[WorkerRecord]) -> set[str]:
    """Task ids live workers hold: reserved or running in a node, or being processed by a pool process."""
    held: set[str] = set()
    for worker in workers:
        if worker.role == ROLE_NODE:
            held.update(worker.held or [])
        elif worker.current_batch_id is not None:
            held.add(task_id_for(worker.current_batch_id))
    return held


def _close_dead(ledger: Ledger, settings: Settings, now: datetime, report: ReconcileReport) -> set[str]:
    """Close the workers not seen for a timeout, and the jobs whose producer went; the task ids the closed
    workers held."""
    seen_before = now - timedelta(seconds=settings.worker_timeout)
    lost_held = in_transaction(ledger.reads, lambda s: held_by_unseen(s, seen_before))
    report.lost_workers = in_transaction(ledger.sessions, lambda s: close_lost_workers(s, seen_before, now))
    for job_id in in_transaction(ledger.sessions, lambda s: stale_enqueues(s, seen_before)):
        recorded = in_transaction(
            ledger.sessions,
            partial(
                close_stale_enqueue,
                job_id=job_id,
                seen_before=seen_before,
                reason=PRODUCER_GONE_REASON,
                now=now,
            ),
        )
        if recorded is None:
            continue  # its producer beat, or finished, since
        log.warning(
            "detq reconciler: job %d: producer gone mid-scan; closed with %d images", job_id, recorded
        )
        report.closed_jobs.append(job_id)
    return lost_held


CANCELLED_ROWS_S = 1.0  # a pass writes cancelled jobs' rows for about this long at most


def _write_cancelled_rows(ledger: Ledger) -> int:
    """Write the rows cancels left pending, a chunk a transaction, for about CANCELLED_ROWS_S: a million
    take a few minutes of passes, and no pass is held up by them for long."""
    began, written = time.monotonic(), 0
    while time.monotonic() - began < CANCELLED_ROWS_S:
        chunk = in_transaction(ledger.sessions, write_cancelled_rows)
        written += chunk
        if chunk < CANCELLED_ROWS_AT_ONCE:
            break
    return written


def _batch_unbatched(ledger: Ledger, batch: OpenBatch, now: datetime) -> list[OpenBatch]:
    """Images recorded by a detq without batches: put them in batches so they can be tracked and sent."""
    ids = in_transaction(ledger.sessions, partial(pending_ids_of_batch, job_id=batch.job_id, batch_id=None))
    made = []
    for chunk in batches_of(ids, batch.batch_size):  # at most what a worker accepts, whatever was asked
        new_id = in_transaction(
            ledger.sessions, partial(assign_batch, job_id=batch.job_id, image_ids=chunk, now=now)
        )
        made.append(OpenBatch(new_id, batch.job_id, batch.pool, batch.batch_size, len(chunk), None))
    return made


def _restore_orphans(
    app: Celery, view: BrokerView, held: set[str], grace_s: float, now: datetime
) -> set[str]:
    """Unacked Redis messages of detq batches that no live worker holds: back to the queue, now."""
    cutoff = now.timestamp() - grace_s
    orphans = [
        u
        for u in view.unacked
        if u.task_id is not None
        and batch_id_of(u.task_id) is not None
        and u.task_id not in held
        and u.delivered_at < cutoff
    ]
    if orphans:
        restore_unacked(app, [u.tag for u in orphans])
        log.warning("detq reconciler: gave back %d batches held by workers that died", len(orphans))
    return {u.task_id for u in orphans if u.task_id is not None}


def _resend(ledger: Ledger, app: Celery, batch: OpenBatch, batch_id: int, now: datetime) -> int:
    ids = in_transaction(
        ledger.sessions, partial(pending_ids_of_batch, job_id=batch.job_id, batch_id=batch_id)
    )
    if ids:
        send_batch(app, job_id=batch.job_id, batch_id=batch_id, image_ids=ids, pool=batch.pool, again=True)
    in_transaction(ledger.sessions, lambda s: mark_sent(s, [batch_id], now))
    return len(ids)


def reconcile(
    ledger: Ledger,
    app: Celery,
    settings: Settings,
    *,
    job_id: int | None = None,
    grace_s: float | None = None,
    now: datetime | None = None,
    read_limit: int | None = None,
) -> ReconcileReport:
    """One pass over the ledger and the broker (all unfinished jobs, or one). Safe to run at any time.

    A batch with pending images is left alone while a copy of its message is queued or a live worker
    holds it; one with no copy anywhere for grace_s (two heartbeats, so a message in transit to a node
    shows in its held list) is sent again, with the same task id.

    read_limit: a queue holding more messages is not read, and of its batches only those a lost worker
    held (or already found missing) are looked at: such a queue has work for every consumer, and a batch
    lost otherwise (its message never sent) is sent once the queue falls under the limit. A given-back
    Redis message is put back all the same. So the periodic pass costs the same with a million images
    queued as with thirty thousand; None reads everything (`detq requeue`).
    """
    now = now or in_transaction(ledger.reads, ledger_now)  # the database's clock (db/clock.py)
    grace = settings.missing_grace_s if grace_s is None else grace_s
    report = ReconcileReport()
    lost_held = _close_dead(ledger, settings, now, report)
    report.cancelled_rows = _write_cancelled_rows(ledger)
    deep, empty = (
        unread_queues(app, settings, read_limit) if read_limit is not None else (frozenset(), frozenset())
    )
    report.deep_queues = sorted(deep)
    batches = in_transaction(ledger.reads, lambda s: open_batches(s, job_id, skip_pools=deep))
    if deep:  # a deep queue's batches that a lost worker held, or that were found missing before
        suspects = {b for t in lost_held if (b := batch_id_of(t)) is not None}
        suspects |= in_transaction(ledger.reads, missing_batch_ids)
        if suspects:
            found = in_transaction(ledger.reads, lambda s: open_batches(s, job_id, batch_ids=suspects))
            batches += [batch for batch in found if queue_for_pool(batch.pool) in deep]
    if not batches and not deep:  # (a deep queue's job may still have a message to put back, below)
        return report
    for batch in [b for b in batches if b.batch_id is None]:
        batches.extend(_batch_unbatched(ledger, batch, now))
    with ledger.reads() as session:
        workers = live_workers(session, now - timedelta(seconds=settings.worker_timeout))
    held = held_task_ids(workers)
    view = read_broker(app, settings, skip=deep, empty=empty)
    if not view.visible:
        return report  # RabbitMQ and others redeliver a dead consumer's messages themselves
    restored = _restore_orphans(app, view, held, grace, now)
    report.restored = len(restored)
    present = view.queued | held | restored
    # A backup copy that is queued or held also delivers its batch.
    present |= {task_id_for(b) for t in present if is_backup(t) and (b := batch_id_of(t)) is not None}
    found_again: list[int] = []
    newly_missing: list[int] = []
    for batch in batches:
        if batch.batch_id is None:
            continue
        task_id = task_id_for(batch.batch_id)
        if task_id in present:
            if batch.missing_since is not None:
                found_again.append(batch.batch_id)
        elif batch.missing_since is None and grace > 0 and task_id not in lost_held:
            # (A batch a worker just found lost held is in transit to no one: sent at once, no grace.)
            newly_missing.append(batch.batch_id)
        elif batch.missing_since is None or (now - as_utc(batch.missing_since)).total_seconds() >= grace:
            report.resent_images += _resend(ledger, app, batch, batch.batch_id, now)
            report.resent_batches += 1
        else:
            report.waiting += 1
    in_transaction(ledger.sessions, lambda s: set_missing(s, found_again, None))
    in_transaction(ledger.sessions, lambda s: set_missing(s, newly_missing, now))
    report.waiting += len(newly_missing)
    if settings.backups:
        report.backups = send_backups(ledger, app, batches, node_loads(workers), view.queued, now, grace)
    if report.resent_batches:
        log.warning(
            "detq reconciler: sent again %d batches (%d images) that no message would deliver",
            report.resent_batches,
            report.resent_images,
        )
    return report
