"""Repository functions for a job's enqueue: kept open while its producer beats and records chunks, closed
by the producer, by a reconciler that found it gone, or by a cancel."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, and_, func, select, update
from sqlalchemy.orm import Session

from db.jobs_repo import close_job_if_complete, lock_to_close
from db.models import Image, Job

PRODUCER_GONE_REASON = "enqueue interrupted (its producer stopped); closed with the images recorded"


def lock_open_enqueue(session: Session, job_id: int) -> bool:
    """Whether the job is still enqueuing, kept so until this transaction ends; False once it was closed
    (the producer must then add nothing more to it).

    On PostgreSQL a FOR KEY SHARE lock, the one the images' foreign key takes anyway: workers finishing
    the job's batches (FOR NO KEY UPDATE) pass it, while a closing transaction (`lock_to_close`) waits
    for the chunk to commit and then counts it; a chunk that comes second finds the job closed.
    SQLite runs one writer at a time.
    """
    query = (
        select(Job.id)
        .where(Job.id == job_id, Job.enqueued_complete.is_(False))
        .with_for_update(read=True, key_share=True)
    )
    return session.scalar(query) is not None


def open_enqueue(session: Session, job_id: int, now: datetime) -> None:
    """A new job's first moment, by the clock liveness is judged by (db.clock.ledger_now): created then,
    and its producer seen then (its row's default is the creating machine's clock)."""
    session.execute(update(Job).where(Job.id == job_id).values(created_at=now, enqueue_seen_at=now))


def touch_enqueue(session: Session, job_id: int, now: datetime) -> bool:
    """The producer is still scanning this job; False if the job was closed meanwhile (it must stop)."""
    outcome = cast(
        "CursorResult[Any]",
        session.execute(
            update(Job).where(Job.id == job_id, Job.enqueued_complete.is_(False)).values(enqueue_seen_at=now)
        ),
    )
    return outcome.rowcount == 1


def _stale(seen_before: datetime) -> ColumnElement[bool]:
    """Still enqueuing, its producer not seen since seen_before."""
    last_seen = func.coalesce(Job.enqueue_seen_at, Job.created_at)
    return and_(Job.enqueued_complete.is_(False), last_seen < seen_before)


def stale_enqueues(session: Session, seen_before: datetime) -> list[int]:
    """Jobs still enqueuing whose producer has not been seen since seen_before (died mid-scan)."""
    return list(session.scalars(select(Job.id).where(_stale(seen_before)).order_by(Job.id)))


def close_stale_enqueue(
    session: Session, job_id: int, seen_before: datetime, reason: str, now: datetime
) -> int | None:
    """close_enqueue, if the job is still stale once locked (its producer may have beaten or finished
    since it was found); the images recorded, or None."""
    locked = session.scalar(select(Job.id).where(Job.id == job_id, _stale(seen_before)).with_for_update())
    return None if locked is None else _close_locked(session, job_id, reason, now)


def take_back_producer_gone(session: Session, job_id: int) -> bool:
    """Clear PRODUCER_GONE_REASON from a job whose producer turns out to have recorded every file (closed
    by a reconciler after its last chunk, in a stall past DETQ_WORKER_TIMEOUT); False if it was closed
    for another reason, or deleted."""
    outcome = cast(
        "CursorResult[Any]",
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.closed_reason == PRODUCER_GONE_REASON)
            .values(closed_reason=None)
        ),
    )
    return outcome.rowcount == 1


def close_enqueue(session: Session, job_id: int, reason: str, now: datetime) -> int:
    """End a job's enqueue with the images recorded so far, and say why; returns that count."""
    lock_to_close(session, job_id)
    return _close_locked(session, job_id, reason, now)


def _close_locked(session: Session, job_id: int, reason: str, now: datetime) -> int:
    """close_enqueue's work, the job row locked FOR UPDATE by the caller."""
    recorded = session.scalar(select(func.count()).select_from(Image).where(Image.job_id == job_id)) or 0
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(total=recorded, enqueued_complete=True, enqueued_at=now, closed_reason=reason)
    )
    close_job_if_complete(session, job_id, now)
    return recorded
