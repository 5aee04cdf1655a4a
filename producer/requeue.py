"""Send tasks again for a job's still-pending images (a lost message, a purged queue, a dead broker)."""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from db.images_repo import pending_image_ids
from db.jobs_repo import get_job
from detq.contract import TASK_PROCESS_BATCH, BatchMessage, batches_of, queue_for_pool
from producer.status import JobNotFound


@dataclass(frozen=True)
class Requeued:
    """How much was sent again."""

    images: int
    batches: int


def requeue_pending(factory: sessionmaker[Session], app: Celery, job_id: int) -> Requeued:
    """Re-send every pending image of the job; safe to repeat, as workers skip finished images."""
    with factory() as session:
        job = get_job(session, job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id}")
        pool, batch_size = job.pool, job.batch_size
        ids = pending_image_ids(session, job_id)
    queue = queue_for_pool(pool)
    batches = 0
    with app.producer_or_acquire() as producer:
        for batch in batches_of(ids, batch_size):
            app.send_task(
                TASK_PROCESS_BATCH,
                args=BatchMessage(job_id, batch).args(),
                queue=queue,
                routing_key=queue,
                producer=producer,
            )
            batches += 1
    return Requeued(images=len(ids), batches=batches)
