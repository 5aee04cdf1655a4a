"""How a job's images stand: their counts by status and detections, the job read with them in one
statement for a progress poll, the commonest reasons of its failures; what one run over jobs did."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Label, RowMapping, Select, func, select, true
from sqlalchemy.orm import Session

from db.models import Detection, Image, Job, ModelRecord, as_utc
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


def _counts(job_id: int) -> Select[int, int, int, int, int, int]:
    """One row: the job's images in all and by status, an index-only scan of ix_images_job_status."""

    def of(status: ImageStatus) -> Label[int]:
        return func.count().filter(Image.status == status.value).label(status.value)

    return select(
        func.count().label("total"),
        of(ImageStatus.PENDING),
        of(ImageStatus.DONE),
        of(ImageStatus.FAILED),
        of(ImageStatus.REJECTED),
        of(ImageStatus.CANCELLED),
    ).where(Image.job_id == job_id)


def _detections(session: Session, job_id: int) -> int:
    """The detections of the job's images (on a job of 100,000 images with 10 boxes each, counting them
    takes a progress poll from ~13 ms of PostgreSQL's time to ~100: a poll leaves them out)."""
    boxes = session.scalar(
        select(func.count())
        .select_from(Detection)
        .join(Image, Detection.image_id == Image.id)
        .where(Image.job_id == job_id)
    )
    return boxes or 0


def _job_counts(row: RowMapping, detections: int) -> JobCounts:
    """The counts of a row holding _counts' columns, by their labels."""
    return JobCounts(
        total=row["total"],
        pending=row[ImageStatus.PENDING.value],
        done=row[ImageStatus.DONE.value],
        failed=row[ImageStatus.FAILED.value],
        rejected=row[ImageStatus.REJECTED.value],
        cancelled=row[ImageStatus.CANCELLED.value],
        detections=detections,
    )


def job_counts(session: Session, job_id: int, *, detections: bool = True) -> JobCounts:
    """Images of the job by status and their detections (detections=False: not counted, 0)."""
    row = session.execute(_counts(job_id)).mappings().one()
    return _job_counts(row, _detections(session, job_id) if detections else 0)


@dataclass(frozen=True)
class JobSnapshot:
    """A job, its model's sha256 and its counts, as `detq status` and a progress poll read them."""

    job: Job
    model_sha256: str
    counts: JobCounts
    model_path: str = ""  # where its model file was when first recorded


def job_snapshot(session: Session, job_id: int, *, detections: bool = True) -> JobSnapshot | None:
    """The job, its model's sha256 and its images by status in one statement (a `--wait` poll's one
    round trip; three before: the job, its model, the counts); its detections in a second where asked.
    None if there is no such job."""
    counts = _counts(job_id).subquery("counts")
    row = session.execute(
        select(Job, ModelRecord.sha256, ModelRecord.path, *counts.c)
        .join(ModelRecord, Job.model_id == ModelRecord.id)
        .join(counts, true())
        .where(Job.id == job_id)
    ).one_or_none()
    if row is None:
        return None
    boxes = _detections(session, job_id) if detections else 0
    return JobSnapshot(
        job=row[0], model_sha256=row[1], counts=_job_counts(row._mapping, boxes), model_path=row[2]
    )


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
