"""Send again the batches of a job that no message will deliver (a purged queue, a lost embedded broker)."""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery

from db.jobs_repo import get_job
from db.ledger import Ledger
from detq.settings import Settings
from dispatch.reconcile import reconcile
from producer.status import JobNotFound


@dataclass(frozen=True)
class Requeued:
    """How much was sent again, and how many batches still had a live copy."""

    images: int
    batches: int
    restored: int


def requeue_missing(ledger: Ledger, app: Celery, settings: Settings, job_id: int) -> Requeued:
    """Send again, now, each batch of the job with pending images and no copy queued or held by a live
    worker; a batch still queued behind a backlog is left alone. Safe to repeat: workers skip finished
    images, and the reconciler does the same by itself after DETQ_WORKER_TIMEOUT."""
    with ledger.reads() as session:
        if get_job(session, job_id) is None:
            raise JobNotFound(f"no job {job_id}")
    report = reconcile(ledger, app, settings, job_id=job_id, grace_s=0)
    return Requeued(images=report.resent_images, batches=report.resent_batches, restored=report.restored)
