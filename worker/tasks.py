"""The Celery batch task: a thin shell that validates its JSON arguments and calls process_batch."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task
from celery.exceptions import SoftTimeLimitExceeded

from db.engine import is_transient_error
from worker.app import TASK_PROCESS_BATCH
from worker.batch import fail_pending, process_batch
from worker.runtime import get_runtime

log = logging.getLogger(__name__)

MAX_BATCH_IDS = 10_000
DB_RETRIES = 8


def parse_batch_args(job_id: Any, image_ids: Any) -> tuple[int, list[int]]:
    """Messages carry ids only: a job id and a list of image ids, all plain integers."""
    if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 1:
        raise ValueError(f"job_id must be a positive integer, got {job_id!r}")
    if not isinstance(image_ids, list) or not image_ids or len(image_ids) > MAX_BATCH_IDS:
        raise ValueError(f"image_ids must be a list of 1..{MAX_BATCH_IDS} integers")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in image_ids):
        raise ValueError("image_ids must all be positive integers")
    return job_id, image_ids


def register_tasks(app: Celery) -> None:
    """Register the batch task on this app (the worker side only)."""

    @app.task(name=TASK_PROCESS_BATCH, bind=True, max_retries=DB_RETRIES, ignore_result=True)
    def process_batch_task(self: Task[Any, Any], job_id: Any, image_ids: Any) -> dict[str, int]:
        job, ids = parse_batch_args(job_id, image_ids)
        runtime = get_runtime()
        try:
            report = process_batch(runtime, job, ids)
        except SoftTimeLimitExceeded:
            failed = fail_pending(runtime, job, ids, "batch exceeded the task's soft time limit")
            log.error("job %d: batch of %d hit the soft time limit; %d images failed", job, len(ids), failed)
            return {"failed": failed}
        except Exception as exc:
            if is_transient_error(exc) and self.request.retries < DB_RETRIES:
                raise self.retry(exc=exc, countdown=min(2**self.request.retries, 60)) from exc
            log.exception("job %d: batch of %d failed", job, len(ids))
            failed = fail_pending(runtime, job, ids, f"batch error: {type(exc).__name__}: {exc}")
            return {"failed": failed}
        log.info(
            "job %d: batch of %d: %d done, %d failed, %d rejected, %d already finished",
            job,
            len(ids),
            report.done,
            report.failed,
            report.rejected,
            report.skipped,
        )
        return {"written": report.written, "skipped": report.skipped}
