"""One batch in a pool process, from its message to every image's terminal state, read top to bottom.

A `Batch` is one delivery of a batch message (worker.tasks hands it over):

1. **Claim** (`_start`, one transaction): the job (read once per process), which of its images are
   pending and free, and a claim on those never started before. Images a live process is already on are
   left to it, except by a backup copy (sent at a queue's tail for an idle worker to race a slow one): it
   runs them too, without taking their claims, and the first result written wins.
2. **Detect** (worker.pipeline): decode, forward, rows, for the claimed images together; then, one at a
   time and each claimed and committed alone, the images started before by a process that died, so a
   poison image takes only itself down. After DETQ_MAX_ATTEMPTS such starts an image ends failed with that
   reason instead of looping for ever.
3. **Write** (`_write`): each group's results in one transaction; a row finished first elsewhere is left.
4. **At the soft time limit** (`_after_time_limit`): what finished is written; each image the detection
   was on goes again in a batch of its own, so it has a task's whole time to itself and, if it still does
   not finish, fails alone (ALONE_REASON) instead of sinking its batch-mates; the images not started go
   again as one batch. Their claims are given back first, the start not counted as an attempt (attempts
   count processes that died). The new batches are in the ledger before they are sent, so one whose send
   fails is sent by the reconciler, as any batch no message delivers. Where nothing says which image held
   the batch up, what is left fails with SOFT_LIMIT_REASON.
5. **On a bug**, what is left pending fails with the error's first line; **a ledger or a disk that stays
   away** (full, down, locked) leaves the images pending for a later delivery, never failed for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.orm import Session

from db.batches_repo import mark_sent, regroup
from db.claims_repo import Claimable, ClaimView, claim, claimable_images, release
from db.images_repo import ImageResult, PendingImage, finalise_results
from db.jobs_repo import JobSpec, job_spec, mark_started
from db.retry import in_transaction, unavailable_reason
from detq.contract import BatchMessage
from detq.vocabulary import ImageStatus
from worker.heartbeat import still_running
from worker.metrics import reason_kind
from worker.models.loading import ModelLoadError
from worker.pipeline import Progress, detect_images, short_reason
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

SOFT_LIMIT_REASON = "batch exceeded the task's soft time limit"
ALONE_REASON = "processing this image alone exceeded the task's soft time limit"
NEVER = datetime(1970, 1, 1, tzinfo=UTC)  # seen since: any time at all

BatchSender = Callable[[int, int, Sequence[int], str], None]
"""Publish a batch: job id, batch id, image ids, pool (dispatch.send.send_batch, bound to an app)."""


def died_reason(attempts: int) -> str:
    """The reason of an image whose process died at each of its starts."""
    return f"worker process died {attempts} times while processing this image"


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


def run_batch(
    runtime: WorkerRuntime,
    message: BatchMessage,
    batch_id: int | None = None,
    *,
    backup: bool = False,
    send: BatchSender | None = None,
) -> BatchReport:
    """The batch task's body (module docstring): process the batch, and whatever stops it. send publishes
    the batches a soft time limit makes (None: they wait in the ledger for the reconciler)."""
    batch = Batch(runtime, message.job_id, message.image_ids, batch_id, backup=backup, send=send)
    return batch.run()


def process_batch(
    runtime: WorkerRuntime,
    job_id: int,
    image_ids: Sequence[int],
    batch_id: int | None = None,
    *,
    backup: bool = False,
) -> BatchReport:
    """Steps 1 to 3 alone: every pending image of this batch that no live process is on (with backup,
    those too) to a terminal state; a time limit or a bug propagates."""
    return Batch(runtime, job_id, image_ids, batch_id, backup=backup).process()


class Batch:
    """One delivery of a batch message in this process: it claims, detects, writes, and handles its time
    limit and its failures (module docstring). Its fields are where it stands, so the time-limit path reads
    them instead of having them relayed."""

    def __init__(
        self,
        runtime: WorkerRuntime,
        job_id: int,
        image_ids: Sequence[int],
        batch_id: int | None = None,
        *,
        backup: bool = False,
        send: BatchSender | None = None,
    ) -> None:
        self.runtime = runtime
        self.job_id = job_id
        self.image_ids = list(image_ids)
        self.batch_id = batch_id
        self.backup = backup
        self.send = send
        self.report = BatchReport()
        self.job: JobSpec | None = None  # set once the claim has committed
        self.claimed: list[int] = []  # the images this delivery claimed (attempts counted)
        self.unwritten: list[ImageResult] = []  # results not yet committed: written again at the time limit
        self.progress = Progress()  # the detection under way: what finished, what it is on

    # -- the task's body ---------------------------------------------------------------------------

    def run(self) -> BatchReport:
        """Process the batch (steps 1 to 3); at the soft time limit, on a bug, or with the ledger away,
        steps 4 and 5 of the module docstring."""
        job, ids = self.job_id, self.image_ids
        started = time.perf_counter()
        try:
            self.process()
        except SoftTimeLimitExceeded:
            return self._after_time_limit()
        except JobMissing as exc:
            log.error("job %d: batch of %d refused: %s", job, len(ids), exc)
            return BatchReport()
        except Exception as exc:
            away = unavailable_reason(exc)
            if away is not None:
                # The ledger or a disk stayed away past the retries: nothing is failed for that; the images
                # stay pending and are delivered again. Their claims are this live process's: the next
                # claim takes them over without counting an attempt (db.claims_repo).
                log.error("job %d: batch of %d left pending: %s", job, len(ids), away)
                raise
            log.exception("job %d: batch of %d failed", job, len(ids))
            # One line: a database error's text goes on with its statement and every parameter of it.
            failed = fail_pending(self.runtime, job, ids, f"batch error: {short_reason(exc)}")
            return BatchReport(written=failed, skipped=len(ids) - failed, failed=failed)
        report = self.report
        if self.runtime.metrics is not None:
            self.runtime.metrics.record(report.results, time.perf_counter() - started)
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

    # -- 1 to 3: claim, detect, write ----------------------------------------------------------------

    def process(self) -> BatchReport:
        """Bring every pending image of this batch that no live process is on to a terminal state (a
        backup: also those a live process is on, their claims and attempts untouched)."""
        runtime = self.runtime
        # The batch is this process's before its claim commits: a heartbeat (another thread) between that
        # commit and the detection would otherwise write "no current batch" over the claim's, and a backup
        # copy would then take the fresh claims for a dead process's, counting one more attempt on each.
        runtime.stats.start(self.batch_id)
        try:
            self._claim_and_detect()
        except SoftTimeLimitExceeded:
            if self.job is not None:  # past its claim: keep what is finished
                self._write(list(self.progress.results.values()))
            raise
        finally:
            runtime.stats.current_batch_id = None
            if self.job is not None:
                runtime.stats.add(self.report.written)
        return self.report

    def _claim_and_detect(self) -> None:
        runtime, job_id, image_ids = self.runtime, self.job_id, self.image_ids
        start = in_transaction(runtime.ledger.sessions, self._start)
        self.job = job = start.job  # claimed: from here on, a time limit keeps what finished
        view = start.view
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
        self.report.skipped = len(image_ids) - len(view.free)
        self.report.skipped += sum(1 for i in view.free if view.deaths(i) == 0) - len(start.fresh)
        self.unwritten.extend(
            ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=died_reason(view.deaths(i)))
            for i in view.free
            if view.deaths(i) >= limit
        )
        # Fewest deaths first: batch-mates of a poison image finish before it is tried again.
        suspects = sorted(
            (i for i in view.free if 0 < view.deaths(i) < limit), key=lambda i: (view.deaths(i), i.id)
        )
        self.claimed = [i.id for i in start.fresh]
        try:
            model = runtime.model_for(job.model_sha256, job.model_path, job.settings)
        except ModelLoadError as exc:
            reason = str(exc)
            self._write(
                [
                    ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=reason)
                    for i in start.fresh + suspects
                ]
            )
            return
        fast = (job.settings or runtime.own_settings).fast_decode

        def detect(images: Sequence[Claimable]) -> list[ImageResult]:
            found = detect_images(
                runtime, model, _pending(images), job.roots, fast_decode=fast, progress=self.progress
            )
            # Handed to _write, which owns them from here (a time limit in the write finds them there).
            self.progress = Progress()
            return found

        self._write(detect(start.fresh))
        # Not an image that killed a process before: a backup's death is counted in no image's attempts.
        firsts = [i for i in view.held if i.attempts == 1] if self.backup else []
        if firsts:
            raced = detect(firsts)
            self.report.skipped -= len(raced)  # counted as taken by another process above; count() recounts
            self._write(raced)
        for suspect in suspects:
            # Started before by a process that died: alone, and committed alone, in case it is the cause.
            if not self._claim_one(suspect, view.let_go):
                self.report.skipped += 1
                continue
            self.claimed.append(suspect.id)
            self._write(detect([suspect]))

    def _start(self, session: Session) -> _Start:
        """One transaction: the job, which images are free, and the claim of those never started before.

        The job is read once per process (runtime.jobs); read again when none of the ids is its image, in
        case it was deleted since. The first claim a process makes in a job also sets the job's started_at
        where it is not set yet (once per process and job: runtime.started_jobs).
        """
        runtime, job_id, image_ids = self.runtime, self.job_id, self.image_ids
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
            set(
                claim(
                    session, fresh, me=runtime.worker_id, batch_id=self.batch_id, now=now, let_go=view.let_go
                )
            )
            if fresh
            else set()
        )
        if won and job_id not in runtime.started_jobs:
            mark_started(session, job_id, now)  # the job's running time counts from its first claim
        return _Start(job=job, view=view, fresh=[i for i in fresh if i.id in won])

    def _claim_one(self, image: Claimable, let_go: frozenset[int]) -> bool:
        runtime = self.runtime
        now = runtime.clock.now()
        won = in_transaction(
            runtime.ledger.sessions,
            lambda s: claim(s, [image], me=runtime.worker_id, batch_id=self.batch_id, now=now, let_go=let_go),
        )
        return bool(won)

    def _write(self, results: list[ImageResult]) -> None:
        """These results, and any a time limit cut off before, in one transaction; counted in the report."""
        assert self.job is not None
        self.unwritten.extend(results)
        written = write_results(self.runtime, self.job_id, self.job.model_id, self.unwritten)
        self.report.count(self.unwritten, written)
        self.unwritten.clear()

    # -- 4: the soft time limit ----------------------------------------------------------------------

    def _after_time_limit(self) -> BatchReport:
        """The batch stopped at its soft time limit, its finished results written (process): each image
        it was on goes again in a batch of its own, the others again together. An image that was alone in
        its batch fails (ALONE_REASON); so does the rest when nothing says which image held it up (the
        limit fired before any image started: reading the job, claiming, loading the model)."""
        runtime, job, ids, report = self.runtime, self.job_id, self.image_ids, self.report
        in_flight = self.progress.in_flight
        if len(ids) > 1 and in_flight and self.job is not None:
            view = in_transaction(runtime.ledger.sessions, lambda s: claim_view(s, runtime, job, ids))
            again = self._send_again(view.free, in_flight)
            if again.alone:
                if runtime.metrics is not None:
                    runtime.metrics.time_limits.labels(outcome="sent_again").inc()
                log.warning(
                    "job %d: batch of %d hit the soft time limit, %d results written; sent again: the %d"
                    " images it was on one a batch, %d others together",
                    job,
                    len(ids),
                    report.written,
                    len(again.alone),
                    len(again.together),
                )
                return report
        reason = ALONE_REASON if in_flight and len(ids) == 1 else SOFT_LIMIT_REASON
        failed = fail_pending(runtime, job, ids, reason)
        log.error("job %d: batch of %d hit the soft time limit; %d failed: %s", job, len(ids), failed, reason)
        if runtime.metrics is not None:
            runtime.metrics.time_limits.labels(outcome="failed").inc()
            runtime.metrics.images.labels(status="failed", reason=reason_kind(reason)).inc(failed)
        if self.job is None:  # stopped before its claim: nothing else was counted
            report.skipped = len(ids) - failed
        report.written += failed
        report.failed += failed
        return report

    def _send_again(self, free: Sequence[Claimable], in_flight: Collection[int]) -> SentAgain:
        """Regroup the free images (split_unfinished) into new batches and send them to the job's pool's
        queue, this delivery's claims on them given back. Without send, or where a send fails, the new
        batches wait in the ledger for the reconciler."""
        assert self.job is not None
        runtime, job_id, pool = self.runtime, self.job_id, self.job.pool
        split = split_unfinished(free, in_flight)
        groups = split.groups
        if not groups:
            return split
        now = runtime.clock.now()
        mine = [i.id for i in free if i.id in self.claimed]

        def regroup_released(session: Session) -> list[int]:
            release(session, mine, me=runtime.worker_id)
            return regroup(session, job_id, groups, now)

        batch_ids = in_transaction(runtime.ledger.sessions, regroup_released)
        sent: list[int] = []
        if self.send is not None:
            try:
                for batch_id, group in zip(batch_ids, groups, strict=True):
                    self.send(job_id, batch_id, group, pool)
                    sent.append(batch_id)
            except Exception as exc:  # noqa: BLE001 - any broker failure: the reconciler sends the rest
                left = len(groups) - len(sent)
                log.warning("job %d: %d batches left to the reconciler: %s", job_id, left, exc)
            in_transaction(runtime.ledger.sessions, lambda s: mark_sent(s, sent, now))
        return split


@dataclass(frozen=True)
class _Start:
    job: JobSpec
    view: ClaimView
    fresh: list[Claimable]  # never started before, now claimed by this process


@dataclass(frozen=True)
class SentAgain:
    """How a timed-out batch's unfinished images were sent again: alone (one batch each), or together."""

    alone: list[int] = field(default_factory=list)
    together: list[int] = field(default_factory=list)

    @property
    def groups(self) -> list[list[int]]:
        """The new batches' image ids: one a lone image, then the others (if any)."""
        return [[i] for i in self.alone] + ([self.together] if self.together else [])


def split_unfinished(free: Sequence[Claimable], in_flight: Collection[int]) -> SentAgain:
    """The images in flight alone, the others together; nothing when none was in flight, as nothing
    then says which image held the batch up (and a batch sent again whole might never shrink)."""
    alone = [i.id for i in free if i.id in in_flight]
    if not alone:
        return SentAgain()
    return SentAgain(alone, [i.id for i in free if i.id not in in_flight])


# -- the ledger's side, shared by the steps above ------------------------------------------------------


def _read_job(session: Session, job_id: int) -> JobSpec:
    job = job_spec(session, job_id)
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


def fail_pending(runtime: WorkerRuntime, job_id: int, image_ids: Sequence[int], reason: str) -> int:
    """Last resort when a batch cannot finish: its pending images no live process is on fail with reason."""
    view = in_transaction(runtime.ledger.sessions, lambda s: claim_view(s, runtime, job_id, image_ids))
    results = [ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=reason) for i in view.free]
    job = in_transaction(runtime.ledger.sessions, lambda s: job_spec(s, job_id))
    if job is None:
        return 0
    return len(write_results(runtime, job_id, job.model_id, results))


def _pending(images: Sequence[Claimable]) -> list[PendingImage]:
    return [PendingImage(i.id, i.job_id, i.path, i.root_index, ImageStatus.PENDING) for i in images]
