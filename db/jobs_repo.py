"""Repository functions for models and jobs: registering a model, creating, starting, finishing, cancelling
and deleting jobs (an enqueue's opening and closing: db/enqueue_repo.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, bindparam, delete, func, select, update
from sqlalchemy.orm import Session

from db.job_counts_repo import job_counts, move_to_status
from db.models import CANCELLED_REASON, Detection, Image, Job, ModelRecord, table_of, utcnow
from db.upsert import insert_ignoring_conflicts
from detq.inference_settings import DEFAULTS, InferenceSettings
from detq.vocabulary import ImageStatus


def get_or_create_model(
    session: Session, *, sha256: str, path: str, size_bytes: int, meta: dict[str, Any]
) -> ModelRecord:
    """The model row of this sha256, inserted if missing; race-safe across processes on both databases."""
    values = {"sha256": sha256, "path": path, "size_bytes": size_bytes, "meta": meta, "created_at": utcnow()}
    session.execute(insert_ignoring_conflicts(session, ModelRecord, values, ["sha256"]))
    return session.scalars(select(ModelRecord).where(ModelRecord.sha256 == sha256)).one()


def latest_model_at(session: Session, path: str) -> ModelRecord | None:
    """The newest model row first recorded at this path (its file since moved or replaced), or None."""
    query = select(ModelRecord).where(ModelRecord.path == path).order_by(ModelRecord.id.desc()).limit(1)
    return session.scalars(query).first()


def model_paths(session: Session, sha256s: Sequence[str]) -> dict[str, str]:
    """Where each of these models' files was first recorded, by sha256 (those the ledger knows)."""
    wanted = sorted(set(sha256s))
    if not wanted:
        return {}
    rows = session.execute(select(ModelRecord.sha256, ModelRecord.path).where(ModelRecord.sha256.in_(wanted)))
    return {str(sha): str(path) for sha, path in rows}


def create_job(
    session: Session,
    *,
    model_id: int,
    roots: list[str],
    pool: str,
    batch_size: int,
    settings: InferenceSettings = DEFAULTS,
) -> Job:
    """A new job with no images yet, run with these inference settings; its id is assigned (flushed) on
    return."""
    job = Job(
        model_id=model_id,
        roots=list(roots),
        pool=pool,
        batch_size=batch_size,
        settings=settings.to_json(),
        settings_key=settings.key,
    )
    session.add(job)
    session.flush()
    return job


def finish_enqueue(session: Session, job_id: int, total: int, now: datetime | None = None) -> None:
    """Mark the job fully enqueued with total images, at now (this machine's clock by default); finishes
    it at once if workers already did them all."""
    now = now or utcnow()
    session.execute(
        update(Job).where(Job.id == job_id).values(total=total, enqueued_complete=True, enqueued_at=now)
    )
    close_job_if_complete(session, job_id, now)


def set_unreadable_folders(
    session: Session, job_id: int, count: int, folders: Sequence[tuple[str, str]]
) -> None:
    """Record the folders the job's scan could not list: how many, and the first ones with their reasons."""
    named = [{"folder": folder, "reason": reason} for folder, reason in folders]
    session.execute(
        update(Job).where(Job.id == job_id).values(unreadable_count=count, unreadable_folders=named)
    )


def cancel_job(session: Session, job_id: int, now: datetime) -> int:
    """Cancel a job: its pending images end cancelled (queued copies then find nothing to do), a scan in
    progress stops adding to it, and it finishes; returns how many images were cancelled.

    Two statements on the job row whatever its size: its pending images are moved to cancelled in its
    counters, and their rows are left pending, read as cancelled by every reader (db.models.status_as_read)
    until the reconciler writes them, a chunk a pass (write_cancelled_rows). Updating a million rows took
    16 s on PostgreSQL, 5 s of it with no index at all. A batch being written when the cancel comes is
    waited for and counted; one written after it writes nothing (finalise_results reads the job under a
    lock the cancel's conflicts with).
    """
    lock_to_close(session, job_id)
    counts = job_counts(session, job_id)
    move_to_status(session, job_id, ImageStatus.CANCELLED, counts.pending)
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(
            closed_reason=CANCELLED_REASON,
            enqueued_complete=True,
            total=counts.total,
            enqueued_at=func.coalesce(Job.enqueued_at, now),
            finished_at=func.coalesce(Job.finished_at, now),
        )
    )
    return counts.pending


CANCELLED_ROWS_AT_ONCE = 10_000  # rows write_cancelled_rows updates in one statement (0.15 s on PostgreSQL)


def write_cancelled_rows(session: Session, limit: int = CANCELLED_ROWS_AT_ONCE) -> int:
    """Write up to limit pending rows of cancelled jobs as what they read (status_as_read): cancelled,
    finished when their job was; their counters moved at the cancel. Returns how many were written.

    The reconciler runs it each pass, so the rows catch up with a cancel in bounded steps. No worker writes
    them meanwhile: finalise_results writes nothing for a cancelled job, and claims pass its images over.
    """
    jobs = session.execute(
        select(Job.id, Job.finished_at).where(
            Job.closed_reason == CANCELLED_REASON,
            select(_IMAGES.c.id)
            .where(_IMAGES.c.job_id == Job.id, _IMAGES.c.status == ImageStatus.PENDING.value)
            .exists(),
        )
    ).all()
    written = 0
    for job_id, finished_at in jobs:
        if written >= limit:
            break
        chunk = (
            select(_IMAGES.c.id)
            .where(_IMAGES.c.job_id == job_id, _IMAGES.c.status == ImageStatus.PENDING.value)
            .limit(limit - written)
            .scalar_subquery()
        )
        outcome = cast(
            "CursorResult[Any]",
            session.execute(
                update(_IMAGES)
                .where(_IMAGES.c.id.in_(chunk), _IMAGES.c.status == ImageStatus.PENDING.value)
                .values(status=ImageStatus.CANCELLED.value, reason=CANCELLED_REASON, finished_at=finished_at)
            ),
        )
        written += outcome.rowcount
    return written


def end_pending_images(session: Session, job_id: int, status: ImageStatus, reason: str, now: datetime) -> int:
    """Every pending image of the job ends with this status and reason; returns how many."""
    outcome = cast(
        "CursorResult[Any]",
        session.execute(
            update(Image)
            .where(Image.job_id == job_id, Image.status == ImageStatus.PENDING.value)
            .values(status=status.value, reason=reason, finished_at=now)
            .execution_options(synchronize_session=False)  # no key of each row fetched back
        ),
    )
    move_to_status(session, job_id, status, outcome.rowcount)
    return outcome.rowcount


def delete_job(session: Session, job_id: int) -> bool:
    """Delete a job with its images, batches and detections; False if none.

    Detections have no foreign key to cascade (migration 0004), so they are deleted here, after the
    job's pending images are ended: that statement waits for any worker holding some of them locked to
    commit, and no worker writes for an image no longer pending, so the next statement sees every
    detection of the job. Images and batches go with the job (their keys cascade).
    """
    job = session.get(Job, job_id)
    if job is None:
        return False
    lock_to_close(session, job_id)  # the job first, then its images: the order finalise_results takes
    end_pending_images(session, job_id, ImageStatus.CANCELLED, "job deleted", utcnow())
    # synchronize_session=False: the session holds none of these rows, and the default had SQLite return
    # the key of every row deleted (1,000,000 detections: 330 MB in Python for nothing).
    session.execute(
        delete(Detection)
        .where(Detection.image_id.in_(select(Image.id).where(Image.job_id == job_id)))
        .execution_options(synchronize_session=False)
    )
    session.delete(job)
    return True


def lock_to_close(session: Session, job_id: int) -> None:
    """Lock the job row FOR UPDATE before its images are counted to close it: a producer's chunk being
    recorded (`lock_open_enqueue`) commits first and is counted, and no chunk is recorded after."""
    session.execute(select(Job.id).where(Job.id == job_id).with_for_update())


_JOBS, _IMAGES, _MODELS = table_of(Job), table_of(Image), table_of(ModelRecord)
# Every batch runs these: built once (db/claims_repo.py).
_LOCK_JOB = (
    select(_JOBS.c.enqueued_complete, _JOBS.c.finished_at, _JOBS.c.started_at)
    .where(_JOBS.c.id == bindparam("job_id"))
    .with_for_update(key_share=True)
)
_ANY_PENDING = (
    select(_IMAGES.c.id)
    .where(_IMAGES.c.job_id == bindparam("job_id"), _IMAGES.c.status == ImageStatus.PENDING.value)
    .limit(1)
)
_JOB_SPEC = (
    select(_JOBS.c.roots, _JOBS.c.model_id, _MODELS.c.sha256, _MODELS.c.path, _JOBS.c.pool, _JOBS.c.settings)
    .join(_MODELS, _MODELS.c.id == _JOBS.c.model_id)
    .where(_JOBS.c.id == bindparam("job_id"))
)


_START_JOB = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"), _JOBS.c.started_at.is_(None))
    .values(started_at=bindparam("now"))
)


def mark_started(session: Session, job_id: int, now: datetime) -> None:
    """Set the job's started_at to now unless it is set: its first claim (a pool process calls this once
    per job, so a long queue wait before it is not counted as the job's running time)."""
    session.execute(_START_JOB, {"job_id": job_id, "now": now})


def close_job_if_complete(session: Session, job_id: int, now: datetime, *, started: bool = False) -> bool:
    """Set finished_at (once) when the job is fully enqueued and none of its images is pending.

    On PostgreSQL the job row is locked first (FOR NO KEY UPDATE, which leaves the KEY SHARE locks of
    concurrent image inserts alone). Whoever finalises the last images, or finishes the enqueue, thereby
    queues behind every other such transaction of the job, and its pending check, a new statement under
    READ COMMITTED, sees their commits: two transactions cannot each see the other's image still pending.
    started: results were just written, so set started_at too if it is not set yet (read under the same
    lock: the row is written once, not at every batch). A job's first claim sets it first (mark_started);
    this covers results written with no claim (images already out of attempts).
    """
    job = session.execute(_LOCK_JOB, {"job_id": job_id}).one_or_none()
    if job is None:
        return False
    if started and job.started_at is None:
        mark_started(session, job_id, now)
    if not job.enqueued_complete or job.finished_at is not None:
        return False
    pending = session.scalar(_ANY_PENDING, {"job_id": job_id})
    if pending is not None:
        return False
    session.execute(update(Job).where(Job.id == job_id, Job.finished_at.is_(None)).values(finished_at=now))
    return True


@dataclass(frozen=True)
class JobSpec:
    """What a worker needs of a job: the folders it may read, the model to run and its settings."""

    roots: list[str]
    model_id: int
    model_sha256: str
    model_path: str
    pool: str  # the pool whose queue its batches go to (a batch sent again too)
    settings: InferenceSettings | None = None  # None: a job made before jobs had settings (migration 0008)


def job_spec(session: Session, job_id: int) -> JobSpec | None:
    """The job's roots, model, pool and settings, in one statement; None if there is no such job."""
    row = session.execute(_JOB_SPEC, {"job_id": job_id}).one_or_none()
    if row is None:
        return None
    settings = InferenceSettings.from_json(row.settings) if row.settings is not None else None
    return JobSpec(list(row.roots), row.model_id, row.sha256, row.path, row.pool, settings)


def get_job(session: Session, job_id: int) -> Job | None:
    """The job with this id, or None."""
    return session.get(Job, job_id)


def latest_job_id(session: Session) -> int | None:
    """The id of the most recently created job, or None when there is none."""
    return session.scalar(select(func.max(Job.id)))


def list_jobs(session: Session, limit: int = 20, *, hide_empty_runs: bool = False) -> list[Job]:
    """The newest jobs first; hide_empty_runs leaves out scheduled runs that found nothing new (not those
    closed early: a run whose folder was missing queued nothing too, and is worth a look)."""
    query = select(Job)
    if hide_empty_runs:
        empty_run = (
            Job.schedule_name.is_not(None)
            & Job.enqueued_complete.is_(True)
            & (Job.total == 0)
            & Job.closed_reason.is_(None)
        )
        query = query.where(~empty_run)
    return list(session.scalars(query.order_by(Job.id.desc()).limit(limit)))
