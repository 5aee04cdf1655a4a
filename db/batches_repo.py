"""Repository functions for batches: recording them, marking them sent, and finding open ones to reconcile."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from db.models import Batch, Image, Job
from detq.vocabulary import ImageStatus


@dataclass(frozen=True)
class OpenBatch:
    """A batch of an unfinished, fully enqueued job that still has pending images."""

    batch_id: int | None  # None: images recorded before batches existed (an older detq)
    job_id: int
    pool: str
    batch_size: int
    pending: int
    missing_since: datetime | None
    sent_at: datetime | None = None  # its last send (first, again, or a backup copy)


def create_batches(session: Session, job_id: int, sizes: Sequence[int], now: datetime) -> list[int]:
    """One row per batch of these sizes; their ids, in the order of sizes.

    New batches of one size are interchangeable, so each size is one multi-row INSERT ... RETURNING in any
    order (an ordered RETURNING makes SQLite insert row by row). Sizes are inserted in the order they first
    appear, so where each size's batches are contiguous (full ones, then a job's tapered tail) the ids
    ascend in the order of sizes, the order they are sent in.
    """
    fresh: dict[int, list[int]] = {}
    for size in dict.fromkeys(sizes):
        rows = [{"job_id": job_id, "size": size, "created_at": now, "sends": 0} for s in sizes if s == size]
        fresh[size] = sorted(session.scalars(insert(Batch).returning(Batch.id), rows), reverse=True)
    return [fresh[size].pop() for size in sizes]


def mark_sent(session: Session, batch_ids: Sequence[int], now: datetime) -> None:
    """These batches were (re)sent now: one more send, and no longer missing."""
    if batch_ids:
        session.execute(
            update(Batch)
            .where(Batch.id.in_(list(batch_ids)))
            .values(sends=Batch.sends + 1, sent_at=now, missing_since=None)
        )


def set_missing(session: Session, batch_ids: Sequence[int], since: datetime | None) -> None:
    """Note when these batches were first found with no copy queued or held (None: found again)."""
    if batch_ids:
        session.execute(update(Batch).where(Batch.id.in_(list(batch_ids))).values(missing_since=since))


def open_batches(session: Session, job_id: int | None = None) -> list[OpenBatch]:
    """Batches with pending images, of jobs fully enqueued and not finished (of one job, if given)."""
    query = (
        select(
            Image.batch_id,
            Image.job_id,
            Job.pool,
            Job.batch_size,
            func.count(),
            Batch.missing_since,
            Batch.sent_at,
        )
        .join(Job, Job.id == Image.job_id)
        .outerjoin(Batch, Batch.id == Image.batch_id)
        .where(
            Image.status == ImageStatus.PENDING.value,
            Job.finished_at.is_(None),
            Job.enqueued_complete.is_(True),
        )
        .group_by(Image.batch_id, Image.job_id, Job.pool, Job.batch_size, Batch.missing_since, Batch.sent_at)
        .order_by(Image.job_id, Image.batch_id)
    )
    if job_id is not None:
        query = query.where(Image.job_id == job_id)
    return [OpenBatch(*row) for row in session.execute(query).tuples()]


def pending_ids_of_batch(session: Session, job_id: int, batch_id: int | None) -> list[int]:
    """Pending image ids of a batch (batch_id None: the job's images recorded without a batch)."""
    where = Image.batch_id.is_(None) if batch_id is None else Image.batch_id == batch_id
    return list(
        session.scalars(
            select(Image.id)
            .where(Image.job_id == job_id, where, Image.status == ImageStatus.PENDING.value)
            .order_by(Image.id)
        )
    )


def assign_batch(session: Session, job_id: int, image_ids: Sequence[int], now: datetime) -> int:
    """Put images recorded without a batch into a new one (not sent yet); its id."""
    (batch_id,) = create_batches(session, job_id, [len(image_ids)], now)
    session.execute(update(Image).where(Image.id.in_(list(image_ids))).values(batch_id=batch_id))
    return batch_id
