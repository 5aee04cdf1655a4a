"""Process one batch of image ids: claim, detect, and write every image's terminal state.

Images a live process is already on are left to it, except by a backup copy (sent at a queue's tail for
an idle worker to race a slow one): it runs them too, without taking their claims, and the first result
written wins. Images started before by a process that died are run one at a time, each in its own
transaction, so a poison image takes only itself down; after DETQ_MAX_ATTEMPTS such starts it ends
failed with that reason instead of looping for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.orm import Session

from db.claims_repo import Claimable, ClaimView, claim, claimable_images
from db.images_repo import ImageResult, PendingImage, finalise_results
from db.jobs_repo import JobModel, job_model, mark_started
from db.retry import in_transaction
from detq.vocabulary import ImageStatus
from worker.detect import DetectionTimedOut, detect_images
from worker.heartbeat import still_running
from worker.models.loading import ModelLoadError
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

SOFT_LIMIT_REASON = "batch exceeded the task's soft time limit"
NEVER = datetime(1970, 1, 1, tzinfo=UTC)  # seen since: any time at all


def died_reason(attempts: int) -> str:
    """The reason of an image whose process died at each of its starts."""
    return f"worker process died {attempts} times while processing this image"


class BatchTimedOut(SoftTimeLimitExceeded):
    """process_batch stopped at the soft time limit, after writing the results it had (report).

    in_flight: the images its detection was on; claimed: those this run claimed (attempts counted).
    """

    def __init__(self, report: BatchReport, in_flight: list[int], claimed: list[int], pool: str) -> None:
        super().__init__(f"soft time limit: {report.written} written, {len(in_flight)} images in flight")
        self.report = report
        self.in_flight = in_flight
        self.claimed = claimed
        self.pool = pool


class JobMissing(LookupError):
    """A message names a job the ledger does not have (deleted, or a forged message)."""


@dataclass
class BatchReport:
    """What a batch did: images newly finalised, and those left alone (already terminal, or busy)."""

    written: int = 0
    skipped: int = 0
    done: int = 0
    failed: int = 0
    rejected: int = 0
    results: list[ImageResult] = field(default_factory=list, repr=False)

    def count(self, results: Sequence[ImageResult], written: set[int]) -> None:
        """Add what one write did: the results it wrote; the others were finished first elsewhere."""
        mine = [r for r in results if r.image_id in written]
        self.written += len(mine)
        self.skipped += len(results) - len(mine)
        self.results.extend(mine)
        self.done += sum(r.status == ImageStatus.DONE for r in mine)
        self.failed += sum(r.status == ImageStatus.FAILED for r in mine)
        self.rejected += sum(r.status == ImageStatus.REJECTED for r in mine)


def _read_job(session: Session, job_id: int) -> JobModel:
    job = job_model(session, job_id)
    if job is None:
        raise JobMissing(f"job {job_id} does not exist")
    return job


def claim_view(session: Session, runtime: WorkerRuntime, job_id: int, image_ids: Sequence[int]) -> ClaimView:
    """The batch's pending images, free or held by a live process, as this process sees them now. A
    process whose own beats could not all be written within DETQ_WORKER_TIMEOUT (the ledger was away)
    takes no other process's missing beats for its death: they could not write theirs either."""
    now = runtime.clock.now()
    timeout = runtime.settings.worker_timeout
    judges = runtime.heartbeat is None or runtime.heartbeat.judges_liveness(timeout)
    return claimable_images(
        session,
        job_id,
        image_ids,
        me=runtime.worker_id,
        now=now,
        seen_since=now - timedelta(seconds=timeout) if judges else NEVER,
        still_running=still_running,
    )


@dataclass(frozen=True)
class _Start:
    job: JobModel
    view: ClaimView
    fresh: list[Claimable]  # never started before, now claimed by this process


def _start(
    session: Session, runtime: WorkerRuntime, job_id: int, image_ids: Sequence[int], batch_id: int | None
) -> _Start:
    """One transaction: the job, which images are free, and the claim of those never started before.

    The job is read once per process (runtime.jobs); read again when none of the ids is its image, in
    case it was deleted since. The first claim a process makes in a job also sets the job's started_at
    where it is not set yet (once per process and job: runtime.started_jobs).
    """
    cached = runtime.jobs.get(job_id)
    job = cached if cached is not None else _read_job(session, job_id)
    view = claim_view(session, runtime, job_id, image_ids)
    if cached is not None and view.found == 0 and image_ids:
        runtime.remember_job(job_id, None)
        job = _read_job(session, job_id)
    runtime.remember_job(job_id, job)
    fresh = [i for i in view.free if view.deaths(i) == 0]
    now = runtime.clock.now()
    won = (
        set(claim(session, fresh, me=runtime.worker_id, batch_id=batch_id, now=now, let_go=view.let_go))
        if fresh
        else set()
    )
    if won and job_id not in runtime.started_jobs:
        mark_started(session, job_id, now)  # the job's running time counts from its first claim
    return _Start(job=job, view=view, fresh=[i for i in fresh if i.id in won])


def _claim_one(
    runtime: WorkerRuntime, image: Claimable, batch_id: int | None, let_go: frozenset[int]
) -> bool:
    now = runtime.clock.now()
    won = in_transaction(
        runtime.ledger.sessions,
        lambda s: claim(s, [image], me=runtime.worker_id, batch_id=batch_id, now=now, let_go=let_go),
    )
    return bool(won)


def write_results(
    runtime: WorkerRuntime, job_id: int, model_id: int, results: Sequence[ImageResult]
) -> set[int]:
    """Finalise these results in one transaction; the ids written (the others were finished first)."""
    if not results:
        return set()
    return in_transaction(
        runtime.ledger.sessions,
        lambda s: finalise_results(
            s,
            job_id,
            model_id,
            results,
            worker=runtime.worker_name,
            device=runtime.device,
            now=runtime.clock.now(),
        ),
    )


def _pending(images: Sequence[Claimable]) -> list[PendingImage]:
    return [PendingImage(i.id, i.job_id, i.path, i.root_index, ImageStatus.PENDING) for i in images]


def process_batch(
    runtime: WorkerRuntime,
    job_id: int,
    image_ids: Sequence[int],
    batch_id: int | None = None,
    *,
    backup: bool = False,
) -> BatchReport:
    """Bring every pending image of this batch that no live process is on to a terminal state.

    backup: also those a live process is on (their claims and attempts untouched); rows still pending
    when a result comes are written, the others were finished first elsewhere.
    """
    # The batch is this process's before its claim commits: a heartbeat (another thread) between that
    # commit and the detection would otherwise write "no current batch" over the claim's, and a backup copy
    # would then take the fresh claims for a dead process's, counting one more attempt on each.
    runtime.stats.start(batch_id)
    try:
        return _run_batch(runtime, job_id, image_ids, batch_id, backup=backup)
    finally:
        runtime.stats.current_batch_id = None


def _run_batch(
    runtime: WorkerRuntime, job_id: int, image_ids: Sequence[int], batch_id: int | None, *, backup: bool
) -> BatchReport:
    start = in_transaction(runtime.ledger.sessions, lambda s: _start(s, runtime, job_id, image_ids, batch_id))
    job, view = start.job, start.view
    if start.fresh:
        runtime.remember_started(job_id)
    if view.found < len(image_ids):
        # A forged or corrupted message: ids of another job, or of no image at all. Nothing is written.
        log.warning(
            "job %d: %d of the %d ids in the message are not images of this job; ignored",
            job_id,
            len(image_ids) - view.found,
            len(image_ids),
        )
    limit = runtime.settings.max_attempts
    report = BatchReport(skipped=len(image_ids) - len(view.free))
    report.skipped += sum(1 for i in view.free if view.deaths(i) == 0) - len(start.fresh)
    exhausted = [
        ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=died_reason(view.deaths(i)))
        for i in view.free
        if view.deaths(i) >= limit
    ]
    # Fewest deaths first: batch-mates of a poison image finish before it is tried again.
    suspects = sorted(
        (i for i in view.free if 0 < view.deaths(i) < limit), key=lambda i: (view.deaths(i), i.id)
    )
    claimed = [i.id for i in start.fresh]
    unwritten = list(exhausted)  # results not yet committed: written again if the time limit cuts in

    def write(results: list[ImageResult]) -> None:
        unwritten.extend(results)
        report.count(unwritten, write_results(runtime, job_id, job.model_id, unwritten))
        unwritten.clear()

    try:
        try:
            model = runtime.model_for(job.model_sha256, job.model_path, job.settings)
        except ModelLoadError as exc:
            write(
                [
                    ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=str(exc))
                    for i in start.fresh + suspects
                ]
            )
            return report
        fast = (job.settings or runtime.own_settings).fast_decode
        write(detect_images(runtime, model, _pending(start.fresh), job.roots, fast_decode=fast))
        # Not an image that killed a process before: a backup's death is counted in no image's attempts.
        firsts = [i for i in view.held if i.attempts == 1] if backup else []
        if firsts:
            raced = detect_images(runtime, model, _pending(firsts), job.roots, fast_decode=fast)
            report.skipped -= len(raced)  # counted as taken by another process above; count() recounts
            write(raced)
        for suspect in suspects:
            # Started before by a process that died: alone, and committed alone, in case it is the cause.
            if not _claim_one(runtime, suspect, batch_id, view.let_go):
                report.skipped += 1
                continue
            claimed.append(suspect.id)
            write(detect_images(runtime, model, _pending([suspect]), job.roots, fast_decode=fast))
    except SoftTimeLimitExceeded as exc:
        # Keep what is finished; run_batch decides what becomes of the rest (worker.time_limit).
        detection = exc if isinstance(exc, DetectionTimedOut) else None
        write(detection.results if detection is not None else [])
        in_flight = detection.in_flight if detection is not None else []
        raise BatchTimedOut(report, in_flight, claimed, job.pool) from exc
    finally:
        runtime.stats.add(report.written)
    return report
