"""The batch task's body: run a batch, and what becomes of one that cannot finish.

A soft time limit keeps what finished and sends the rest again (worker.time_limit); a bug fails what is
left with its reason; a ledger or a disk that stays away (full, down, locked) leaves the images pending
for a later delivery, never failed for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from celery.exceptions import SoftTimeLimitExceeded

from db.images_repo import ImageResult
from db.jobs_repo import job_model
from db.retry import in_transaction, unavailable_reason
from detq.contract import BatchMessage
from detq.vocabulary import ImageStatus
from worker.batch import (
    SOFT_LIMIT_REASON,
    BatchReport,
    BatchTimedOut,
    JobMissing,
    claim_view,
    process_batch,
    write_results,
)
from worker.inference import short_reason
from worker.metrics import reason_kind
from worker.runtime import WorkerRuntime
from worker.time_limit import ALONE_REASON, BatchSender, send_again

log = logging.getLogger(__name__)


def fail_pending(runtime: WorkerRuntime, job_id: int, image_ids: Sequence[int], reason: str) -> int:
    """Last resort when a batch cannot finish: its pending images no live process is on fail with reason."""
    view = in_transaction(runtime.ledger.sessions, lambda s: claim_view(s, runtime, job_id, image_ids))
    results = [ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=reason) for i in view.free]
    job = in_transaction(runtime.ledger.sessions, lambda s: job_model(s, job_id))
    if job is None:
        return 0
    return len(write_results(runtime, job_id, job.model_id, results))


def _after_time_limit(
    runtime: WorkerRuntime, message: BatchMessage, timed_out: BatchTimedOut, send: BatchSender | None
) -> BatchReport:
    """A batch stopped at its soft time limit, its finished results written: each image it was on goes
    again in a batch of its own, the others again together (worker.time_limit). An image that was alone
    in its batch fails (ALONE_REASON); so does the rest when nothing says which image held it up."""
    job, ids = message.job_id, message.image_ids
    report = timed_out.report
    in_flight = timed_out.in_flight
    if len(ids) > 1 and in_flight:
        view = in_transaction(runtime.ledger.sessions, lambda s: claim_view(s, runtime, job, ids))
        again = send_again(runtime, job, timed_out.pool, view.free, in_flight, timed_out.claimed, send)
        if again.alone:
            if runtime.metrics is not None:
                runtime.metrics.time_limits.labels(outcome="sent_again").inc()
            log.warning(
                "job %d: batch of %d hit the soft time limit, %d results written; sent again: the %d images"
                " it was on one a batch, %d others together",
                job,
                len(ids),
                report.written,
                len(again.alone),
                len(again.together),
            )
            return report
    failed = _fail_at_time_limit(
        runtime, message, ALONE_REASON if in_flight and len(ids) == 1 else SOFT_LIMIT_REASON
    )
    report.written += failed
    report.failed += failed
    return report


def _fail_at_time_limit(runtime: WorkerRuntime, message: BatchMessage, reason: str) -> int:
    """Fail what the batch left pending for its time limit; how many failed."""
    job, ids = message.job_id, message.image_ids
    failed = fail_pending(runtime, job, ids, reason)
    log.error("job %d: batch of %d hit the soft time limit; %d failed: %s", job, len(ids), failed, reason)
    if runtime.metrics is not None:
        runtime.metrics.time_limits.labels(outcome="failed").inc()
        runtime.metrics.images.labels(status="failed", reason=reason_kind(reason)).inc(failed)
    return failed


def run_batch(
    runtime: WorkerRuntime,
    message: BatchMessage,
    batch_id: int | None = None,
    *,
    backup: bool = False,
    send: BatchSender | None = None,
) -> BatchReport:
    """The batch task's body: process the batch; on a bug, fail what is left pending.

    At the soft time limit, what finished is kept and the rest sent again with `send` (None: left in the
    ledger for the reconciler to send), each image in flight alone (_after_time_limit). Transient
    database errors are retried inside (db.retry); one that outlasts the retries leaves the images
    pending, for a later delivery.
    """
    job, ids = message.job_id, message.image_ids
    started = time.perf_counter()
    try:
        report = process_batch(runtime, job, ids, batch_id, backup=backup)
    except BatchTimedOut as timed_out:
        report = _after_time_limit(runtime, message, timed_out, send)
    except SoftTimeLimitExceeded:
        # Before any image started (reading the job, claiming): nothing says which image is to blame.
        failed = _fail_at_time_limit(runtime, message, SOFT_LIMIT_REASON)
        return BatchReport(written=failed, skipped=len(ids) - failed, failed=failed)
    except JobMissing as exc:
        log.error("job %d: batch of %d refused: %s", job, len(ids), exc)
        return BatchReport()
    except Exception as exc:
        away = unavailable_reason(exc)
        if away is not None:
            # The ledger or a disk stayed away past the retries: nothing is failed for that; the images
            # stay pending and are delivered again. Their claims are this live process's: the next claim
            # takes them over without counting an attempt (db.claims_repo).
            log.error("job %d: batch of %d left pending: %s", job, len(ids), away)
            raise
        log.exception("job %d: batch of %d failed", job, len(ids))
        # One line: a database error's text goes on with its statement and every parameter of it.
        failed = fail_pending(runtime, job, ids, f"batch error: {short_reason(exc)}")
        return BatchReport(written=failed, skipped=len(ids) - failed, failed=failed)
    if runtime.metrics is not None:
        runtime.metrics.record(report.results, time.perf_counter() - started)
    log.info(
        "job %d: batch of %d: %d done, %d failed, %d rejected, %d already finished or taken",
        job,
        len(ids),
        report.done,
        report.failed,
        report.rejected,
        report.skipped,
    )
    return report
