"""Process one batch of image ids: read it, detect, and write every image's terminal state in one go."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.orm import Session

from db.engine import is_transient_error
from db.images_repo import ImageResult, PendingImage, load_images, record_results
from db.jobs_repo import get_job
from db.retry import in_transaction
from detq.contract import BatchMessage
from detq.vocabulary import ImageStatus
from worker.detect import detect_images
from worker.models.loading import ModelLoadError
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchReport:
    """What a batch did: images newly finalised, and those already terminal (a redelivery)."""

    written: int
    skipped: int
    done: int = 0
    failed: int = 0
    rejected: int = 0


class JobMissing(LookupError):
    """A message names a job the ledger does not have (deleted, or a forged message)."""


@dataclass(frozen=True)
class _JobView:
    roots: list[str]
    model_id: int
    model_sha256: str
    model_path: str


def _read_batch(
    session: Session, job_id: int, image_ids: Sequence[int]
) -> tuple[_JobView, list[PendingImage]]:
    job = get_job(session, job_id)
    if job is None:
        raise JobMissing(f"job {job_id} does not exist")
    view = _JobView(
        roots=list(job.roots), model_id=job.model_id, model_sha256=job.model.sha256, model_path=job.model.path
    )
    return view, load_images(session, job_id, image_ids)


def _write(runtime: WorkerRuntime, job_id: int, model_id: int, results: Sequence[ImageResult]) -> int:
    return in_transaction(
        runtime.ledger.sessions,
        lambda s: record_results(
            s, job_id, model_id, results, worker=runtime.worker_name, device=runtime.device
        ),
    )


def process_batch(runtime: WorkerRuntime, job_id: int, image_ids: Sequence[int]) -> BatchReport:
    """Bring every pending image of this batch to a terminal state; already-terminal images are skipped."""
    job, images = in_transaction(runtime.ledger.sessions, lambda s: _read_batch(s, job_id, image_ids))
    pending = [image for image in images if image.status == ImageStatus.PENDING]
    skipped = len(images) - len(pending)
    if not pending:
        return BatchReport(written=0, skipped=skipped)
    try:
        model = runtime.model_for(job.model_sha256, job.model_path)
        results = detect_images(runtime, model, pending, job.roots)
    except ModelLoadError as exc:
        results = [ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=str(exc)) for i in pending]
    written = _write(runtime, job_id, job.model_id, results)
    return BatchReport(
        written=written,
        skipped=skipped,
        done=sum(r.status == ImageStatus.DONE for r in results),
        failed=sum(r.status == ImageStatus.FAILED for r in results),
        rejected=sum(r.status == ImageStatus.REJECTED for r in results),
    )


def fail_pending(runtime: WorkerRuntime, job_id: int, image_ids: Sequence[int], reason: str) -> int:
    """Last resort when a batch cannot finish: give its still-pending images a terminal state and reason."""

    def work(session: Session) -> int:
        job = get_job(session, job_id)
        if job is None:
            return 0
        results = [
            ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=reason)
            for i in load_images(session, job_id, image_ids)
            if i.status == ImageStatus.PENDING
        ]
        return record_results(
            session, job_id, job.model_id, results, worker=runtime.worker_name, device=runtime.device
        )

    return in_transaction(runtime.ledger.sessions, work)


def run_batch(runtime: WorkerRuntime, message: BatchMessage) -> BatchReport:
    """The batch task's body: process the batch; on a soft time limit or a bug, fail what is left pending.

    Transient database errors are retried inside (db.retry); one that outlasts the retries leaves the
    images pending, for a later delivery.
    """
    job, ids = message.job_id, message.image_ids
    try:
        report = process_batch(runtime, job, ids)
    except SoftTimeLimitExceeded:
        failed = fail_pending(runtime, job, ids, "batch exceeded the task's soft time limit")
        log.error("job %d: batch of %d hit the soft time limit; %d images failed", job, len(ids), failed)
        return BatchReport(written=failed, skipped=len(ids) - failed, failed=failed)
    except JobMissing as exc:
        log.error("job %d: batch of %d refused: %s", job, len(ids), exc)
        return BatchReport(written=0, skipped=0)
    except Exception as exc:
        if is_transient_error(exc):
            # The database stayed away past the retries: nothing is failed for that; the images stay
            # pending and are delivered again.
            log.error("job %d: batch of %d left pending, the database is unavailable: %s", job, len(ids), exc)
            raise
        log.exception("job %d: batch of %d failed", job, len(ids))
        failed = fail_pending(runtime, job, ids, f"batch error: {type(exc).__name__}: {exc}")
        return BatchReport(written=failed, skipped=len(ids) - failed, failed=failed)
    log.info(
        "job %d: batch of %d: %d done, %d failed, %d rejected, %d already finished",
        job,
        len(ids),
        report.done,
        report.failed,
        report.rejected,
        report.skipped,
    )
    return report
