"""How a job's images stand: the counters every write that moves images keeps on the job row (by status,
and detections), the job read with them for a progress poll, the commonest reasons of its failures; what
one run over jobs did."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Label, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from db.models import Image, Job, ModelRecord, RecordedCount, as_utc, table_of
from detq.vocabulary import ImageStatus


@dataclass(frozen=True)
class JobCounts:
    """How many images of a job are in each state, and how many detections they have."""

    total: int
    pending: int
    done: int
    failed: int
    rejected: int
    detections: int
    cancelled: int = 0


_JOBS = table_of(Job)
# Every batch's write runs it (db/images_repo.py): built once, one shape whatever moved.
_MOVE = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"))
    .values(
        pending_count=_JOBS.c.pending_count + bindparam("pending"),
        done_count=_JOBS.c.done_count + bindparam("done"),
        failed_count=_JOBS.c.failed_count + bindparam("failed"),
        rejected_count=_JOBS.c.rejected_count + bindparam("rejected"),
        cancelled_count=_JOBS.c.cancelled_count + bindparam("cancelled"),
        detection_count=_JOBS.c.detection_count + bindparam("detections"),
    )
)


def move_counts(
    session: Session,
    job_id: int,
    *,
    pending: int = 0,
    done: int = 0,
    failed: int = 0,
    rejected: int = 0,
    cancelled: int = 0,
    detections: int = 0,
) -> None:
    """Add to the job's counters, in the transaction that moved its images (negative: images that left a
    state). Every write that inserts images or changes their status calls it; a status reads them."""
    moved = {
        "pending": pending,
        "done": done,
        "failed": failed,
        "rejected": rejected,
        "cancelled": cancelled,
        "detections": detections,
    }
    if any(moved.values()):
        session.execute(_MOVE, {"job_id": job_id, **moved})


def count_recorded(session: Session, job_id: int, pending: int, rejected: int) -> None:
    """A producer recorded these images (pending, and refused at the scan): a row of their own, so the
    producer's transaction never locks the job row that workers finishing batches write through."""
    if pending or rejected:
        session.execute(insert(RecordedCount).values(job_id=job_id, pending=pending, rejected=rejected))


def move_to_status(
    session: Session, job_id: int, status: ImageStatus, count: int, detections: int = 0
) -> None:
    """count pending images of the job ended with this status (with their detections)."""
    move_counts(session, job_id, pending=-count, detections=detections, **{status.value: count})


# What the job's producers recorded: a few hundred rows a million images, by the job's index.
_RECORDED = select(
    func.coalesce(func.sum(RecordedCount.pending), 0), func.coalesce(func.sum(RecordedCount.rejected), 0)
).where(RecordedCount.job_id == bindparam("job_id"))


def _counts_of(session: Session, job: Job) -> JobCounts:
    recorded_pending, recorded_rejected = session.execute(_RECORDED, {"job_id": job.id}).one()
    pending = job.pending_count + int(recorded_pending)
    rejected = job.rejected_count + int(recorded_rejected)
    return JobCounts(
        total=pending + job.done_count + job.failed_count + rejected + job.cancelled_count,
        pending=pending,
        done=job.done_count,
        failed=job.failed_count,
        rejected=rejected,
        cancelled=job.cancelled_count,
        detections=job.detection_count,
    )


def job_counts(session: Session, job_id: int) -> JobCounts:
    """Images of the job by status and their detections, from its counters (zeros for no such job)."""
    job = session.get(Job, job_id, populate_existing=True)  # its counters as the database has them now
    return _counts_of(session, job) if job is not None else JobCounts(0, 0, 0, 0, 0, 0)


@dataclass(frozen=True)
class JobSnapshot:
    """A job, its model's sha256 and its counts, as `detq status` and a progress poll read them."""

    job: Job
    model_sha256: str
    counts: JobCounts
    model_path: str = ""  # where its model file was when first recorded


def job_snapshot(session: Session, job_id: int) -> JobSnapshot | None:
    """The job with its counters, and its model's sha256 and path (a `--wait` poll's two round trips,
    whatever the job's size). None if there is no such job."""
    row = session.execute(
        select(Job, ModelRecord.sha256, ModelRecord.path)
        .join(ModelRecord, Job.model_id == ModelRecord.id)
        .where(Job.id == job_id)
        .execution_options(populate_existing=True)
    ).one_or_none()
    if row is None:
        return None
    return JobSnapshot(job=row[0], model_sha256=row[1], counts=_counts_of(session, row[0]), model_path=row[2])


def top_reasons(session: Session, job_id: int, limit: int = 3) -> list[tuple[str, int]]:
    """The most common reasons the job's images failed or were rejected, with how many each."""
    rows = session.execute(
        select(Image.reason, func.count())
        .where(
            Image.job_id == job_id,
            Image.status.in_([ImageStatus.FAILED.value, ImageStatus.REJECTED.value]),
            Image.reason.is_not(None),
        )
        .group_by(Image.reason)
        .order_by(func.count().desc(), Image.reason)
        .limit(limit)
    ).tuples()
    return [(str(reason), int(count)) for reason, count in rows]


@dataclass(frozen=True)
class RunActivity:
    """What one run did over its jobs: the images it finished, by status, and when its first of them was
    claimed and its last finished (the span images were being processed in)."""

    done: int = 0
    failed: int = 0
    rejected: int = 0
    first_claim: datetime | None = None
    last_finish: datetime | None = None

    @property
    def finished(self) -> int:
        """Images the run brought to an end."""
        return self.done + self.failed + self.rejected

    @property
    def processing_s(self) -> float | None:
        """Seconds from its first claim to its last finish; None where it claimed nothing."""
        if self.first_claim is None or self.last_finish is None:
            return None
        return max(0.0, (as_utc(self.last_finish) - as_utc(self.first_claim)).total_seconds())


def run_activity(session: Session, job_ids: Sequence[int], since: datetime) -> RunActivity:
    """The images of these jobs finished at or after `since` (the run's start, by the ledger's clock), by
    status, and the span they were processed in (claims before `since`, a previous run's, count from it)."""
    if not job_ids:
        return RunActivity()

    def of(status: ImageStatus) -> Label[int]:
        return func.count().filter(Image.status == status.value).label(status.value)

    row = (
        session.execute(
            select(
                of(ImageStatus.DONE),
                of(ImageStatus.FAILED),
                of(ImageStatus.REJECTED),
                func.min(Image.claimed_at).label("first_claim"),
                func.max(Image.finished_at).label("last_finish"),
            ).where(Image.job_id.in_(list(job_ids)), Image.finished_at >= since)
        )
        .mappings()
        .one()
    )
    first = row["first_claim"]
    if first is not None and as_utc(first) < as_utc(since):
        first = since
    return RunActivity(
        done=row[ImageStatus.DONE.value],
        failed=row[ImageStatus.FAILED.value],
        rejected=row[ImageStatus.REJECTED.value],
        first_claim=first,
        last_finish=row["last_finish"],
    )
