"""Repository functions for batches: recording them, marking them sent, and finding open ones to reconcile."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from db.bulk import insert_rows, next_ids
from db.models import Batch, Image, Job, table_of
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
    sends: int = 0  # 1 after its first send; more once sent again or backed up


def create_batches(session: Session, job_id: int, sizes: Sequence[int], now: datetime) -> list[int]:
    """One row per batch of these sizes; their ids, ascending in the order of sizes (the order they are
    sent in).

    The ids are taken first (next_ids) and the rows written in one bulk write (COPY on PostgreSQL): an
    INSERT ... RETURNING of a chunk's 125 batches took 11 ms of an enqueue's main thread on PostgreSQL.
    """
    if not sizes:
        return []
    table = table_of(Batch)
    ids = next_ids(session, table, len(sizes))
    insert_rows(
        session,
        table,
        ("id", "job_id", "size", "created_at", "sends"),
        [(batch_id, job_id, size, now, 0) for batch_id, size in zip(ids, sizes, strict=True)],
    )
    return ids


def mark_sent(session: Session, batch_ids: Sequence[int], now: datetime) -> None:
    """These batches were (re)sent now: one more send, and no longer missing."""
    if batch_ids:
        session.execute(update(Batch).where(Batch.id.in_(list(batch_ids))).values(_one_more_send(now)))


def _one_more_send(now: datetime) -> dict[str, Any]:
    """What a send of a batch writes on its row: its count, when, and that it is no longer missing."""
    return {"sends": Batch.sends + 1, "sent_at": now, "missing_since": None}


def claim_send(session: Session, batch_id: int, seen_sends: int, now: datetime) -> bool:
    """Count one more send of this batch now, if no one has sent it since it was read with seen_sends
    sends: whether this caller won it (two passes that read the same batch send one copy, not two)."""
    result = session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.sends == seen_sends)
        .values(_one_more_send(now))
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def set_missing(session: Session, batch_ids: Sequence[int], since: datetime | None) -> None:
    """Note when these batches were first found with no copy queued or held (None: found again)."""
    if batch_ids:
        session.execute(update(Batch).where(Batch.id.in_(list(batch_ids))).values(missing_since=since))


def open_batches(
    session: Session,
    job_id: int | None = None,
    skip_pools: Collection[str] = (),
    batch_ids: Collection[int] | None = None,
) -> list[OpenBatch]:
    """Batches with pending images, of jobs fully enqueued and not finished (of one job, if given; none of
    a job whose pool is in skip_pools; only these batches, if batch_ids is given)."""
    query = (
        select(
            Image.batch_id,
            Image.job_id,
            Job.pool,
            Job.batch_size,
            func.count(),
            Batch.missing_since,
            Batch.sent_at,
            func.coalesce(Batch.sends, 0),
        )
        .join(Job, Job.id == Image.job_id)
        .outerjoin(Batch, Batch.id == Image.batch_id)
        .where(
            Image.status == ImageStatus.PENDING.value,
            Job.finished_at.is_(None),
            Job.enqueued_complete.is_(True),
        )
        .group_by(
            Image.batch_id,
            Image.job_id,
            Job.pool,
            Job.batch_size,
            Batch.missing_since,
            Batch.sent_at,
            Batch.sends,
        )
        .order_by(Image.job_id, Image.batch_id)
    )
    if job_id is not None:
        query = query.where(Image.job_id == job_id)
    if skip_pools:
        # The jobs first, then their pending images: filtered on the job's pool after the join, the pending
        # images of every job were read (0.2 s a pass at a million queued).
        jobs = select(Job.id).where(
            Job.finished_at.is_(None), Job.enqueued_complete.is_(True), Job.pool.not_in(sorted(skip_pools))
        )
        kept = list(session.scalars(jobs if job_id is None else jobs.where(Job.id == job_id)))
        if not kept:
            return []
        query = query.where(Image.job_id.in_(kept))
    if batch_ids is not None:
        query = query.where(Image.batch_id.in_(sorted(batch_ids)))
    return [OpenBatch(*row) for row in session.execute(query).tuples()]


def missing_batch_ids(session: Session) -> set[int]:
    """Batches of unfinished jobs the reconciler found with no copy anywhere and has not seen again
    (missing_since set; a finished job's batch may keep it, and is no one's concern)."""
    query = (
        select(Batch.id)
        .join(Job, Job.id == Batch.job_id)
        .where(Batch.missing_since.is_not(None), Job.finished_at.is_(None))
    )
    return set(session.scalars(query))


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
    (batch_id,) = regroup(session, job_id, [image_ids], now)
    return batch_id


def regroup(session: Session, job_id: int, groups: Sequence[Sequence[int]], now: datetime) -> list[int]:
    """Move each group of the job's images into a new batch of its own (not sent yet); their ids, in the
    order of the groups."""
    batch_ids = create_batches(session, job_id, [len(group) for group in groups], now)
    for batch_id, group in zip(batch_ids, groups, strict=True):
        session.execute(
            update(Image).where(Image.job_id == job_id, Image.id.in_(list(group))).values(batch_id=batch_id)
        )
    return batch_ids
