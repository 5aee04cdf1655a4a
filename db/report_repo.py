"""Repository functions for a job's report: boxes per class, a score histogram, finish times, failures."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from sqlalchemy import ColumnElement, Integer, and_, case, cast, func, select
from sqlalchemy.orm import Session

from db.models import Detection, Image, Job, ModelRecord, as_utc
from detq.vocabulary import ImageStatus


def label_counts(session: Session, job_id: int) -> list[tuple[int, str, int]]:
    """(label id, label, boxes) of the job's detections, most boxes first."""
    rows = session.execute(
        select(Detection.label_id, func.min(Detection.label), func.count())
        .join(Image, Detection.image_id == Image.id)
        .where(Image.job_id == job_id)
        .group_by(Detection.label_id)
        .order_by(func.count().desc(), Detection.label_id)
    ).tuples()
    return [(int(label_id), str(label), int(count)) for label_id, label, count in rows]


def score_histogram(session: Session, job_id: int, bins: int = 20) -> list[int]:
    """How many of the job's boxes have a score in each of `bins` equal bins over [0, 1], counted in SQL."""
    # CAST truncates, which is floor for scores >= 0; a score of exactly 1 joins the top bin.
    raw = cast(Detection.score * bins, Integer)
    bucket = case((raw >= bins, bins - 1), else_=raw)
    rows = session.execute(
        select(bucket, func.count())
        .join(Image, Detection.image_id == Image.id)
        .where(Image.job_id == job_id)
        .group_by(bucket)
    ).tuples()
    counts = [0] * bins
    for index, count in rows:
        if index is not None:
            counts[max(0, min(bins - 1, int(index)))] += int(count)
    return counts


def _finished(job_id: int) -> ColumnElement[bool]:
    return and_(Image.job_id == job_id, Image.finished_at.is_not(None), Image.worker.is_not(None))


def finish_span(session: Session, job_id: int) -> tuple[datetime, datetime] | None:
    """When the first and the last of the job's images that a worker ended finished; None if none did."""
    first, last = session.execute(
        select(func.min(Image.finished_at), func.max(Image.finished_at)).where(_finished(job_id))
    ).one()
    return (as_utc(first), as_utc(last)) if first is not None and last is not None else None


def finish_times(session: Session, job_id: int) -> Iterator[tuple[str, datetime]]:
    """(worker and device, when) of each image of the job that a worker ended, streamed in chunks (a job
    of a million images is not held in memory)."""
    rows = session.execute(
        select(Image.worker, Image.device, Image.finished_at)
        .where(_finished(job_id))
        .execution_options(yield_per=10_000)
    ).tuples()
    for worker, device, when in rows:
        if when is not None:
            yield f"{worker} {device or ''}".strip(), as_utc(when)


def failed_images(session: Session, job_id: int, limit: int = 50) -> list[tuple[str, str, str]]:
    """(path, status, reason) of the job's images that failed or were rejected, the first `limit`."""
    rows = session.execute(
        select(Image.path, Image.status, Image.reason)
        .where(
            Image.job_id == job_id, Image.status.in_([ImageStatus.FAILED.value, ImageStatus.REJECTED.value])
        )
        .order_by(Image.id)
        .limit(limit)
    ).tuples()
    return [(str(path), str(status), str(reason or "")) for path, status, reason in rows]


def job_model_file(session: Session, job_id: int) -> tuple[str, list[str]] | None:
    """The path the job's model was recorded at and the classes its metadata names (None: no such job)."""
    row = session.execute(
        select(ModelRecord.path, ModelRecord.meta)
        .join(Job, Job.model_id == ModelRecord.id)
        .where(Job.id == job_id)
    ).first()
    if row is None:
        return None
    classes = (row.meta or {}).get("classes") or []
    return str(row.path), [str(c) for c in classes] if isinstance(classes, list) else []
