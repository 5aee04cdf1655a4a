"""Repository functions for scheduled runs: claiming a run key once, the schedules' state, listing runs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from db.models import Job, ScheduleState, utcnow
from db.upsert import insert_ignoring_conflicts
from detq.inference_settings import DEFAULTS, InferenceSettings


@dataclass(frozen=True)
class RunKey:
    """What makes a scheduled run unique: its schedule and the cron time it is for."""

    schedule_name: str
    scheduled_for: datetime

    def normalized(self) -> RunKey:
        """The same key in UTC to the second, the form stored (SQLite keeps naive text: one form only)."""
        moment = self.scheduled_for
        if moment.tzinfo is None:
            raise ValueError("scheduled_for must be timezone-aware")
        return RunKey(self.schedule_name, moment.astimezone(UTC).replace(microsecond=0))


@dataclass(frozen=True)
class RunCounts:
    """What an incremental scan found: files new, changed, failed before and retried, and skipped."""

    new: int = 0
    changed: int = 0
    retried: int = 0
    skipped: int = 0


def claim_run(
    session: Session,
    key: RunKey,
    *,
    model_id: int,
    roots: list[str],
    pool: str,
    batch_size: int,
    settings: InferenceSettings = DEFAULTS,
) -> int | None:
    """Create the job of this scheduled run and return its id; None when the run already exists.

    The insert does nothing on a conflict with uq_jobs_schedule_run, so of two schedulers racing on the
    same tick exactly one gets a job: on PostgreSQL the second insert waits on the first's uncommitted
    index entry and then skips; on SQLite BEGIN IMMEDIATE serialises them. The schedule's
    last_scheduled_for moves forward in the same transaction.
    """
    key = key.normalized()
    now = utcnow()
    values = {
        "model_id": model_id,
        "roots": list(roots),
        "pool": pool,
        "batch_size": batch_size,
        "settings": settings.to_json(),
        "settings_key": settings.key,
        "schedule_name": key.schedule_name,
        "scheduled_for": key.scheduled_for,
        "total": 0,
        "enqueued_complete": False,
        "created_at": now,
    }
    job_id = session.scalar(
        insert_ignoring_conflicts(session, Job, values, ["schedule_name", "scheduled_for"]).returning(Job.id)
    )
    if job_id is None:
        return None
    note_schedules_seen(session, [key.schedule_name], now)
    session.execute(
        update(ScheduleState)
        .where(
            ScheduleState.name == key.schedule_name,
            or_(
                ScheduleState.last_scheduled_for.is_(None),
                ScheduleState.last_scheduled_for < key.scheduled_for,
            ),
        )
        .values(last_scheduled_for=key.scheduled_for)
    )
    return int(job_id)


def set_run_counts(session: Session, job_id: int, counts: RunCounts) -> None:
    """Record what the incremental scan of a job found."""
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(
            new_images=counts.new,
            changed_images=counts.changed,
            retried_images=counts.retried,
            skipped_images=counts.skipped,
        )
    )


def note_schedules_seen(session: Session, names: Iterable[str], now: datetime) -> None:
    """Give each schedule not seen before a state row, first seen now."""
    for name in names:
        session.execute(
            insert_ignoring_conflicts(session, ScheduleState, {"name": name, "first_seen_at": now}, ["name"])
        )


def schedule_states(session: Session, names: Iterable[str]) -> dict[str, ScheduleState]:
    """The state rows of these schedules, by name (schedules never seen are absent)."""
    wanted = list(names)
    if not wanted:
        return {}
    rows = session.scalars(select(ScheduleState).where(ScheduleState.name.in_(wanted)))
    return {row.name: row for row in rows}


def find_run(session: Session, key: RunKey) -> Job | None:
    """The job of this scheduled run, or None."""
    key = key.normalized()
    return session.scalars(
        select(Job).where(Job.schedule_name == key.schedule_name, Job.scheduled_for == key.scheduled_for)
    ).one_or_none()


def list_runs(session: Session, schedule_name: str | None = None, limit: int = 20) -> list[Job]:
    """Scheduled runs, newest first, of one schedule or of all."""
    query = select(Job).where(Job.schedule_name.is_not(None))
    if schedule_name is not None:
        query = query.where(Job.schedule_name == schedule_name)
    return list(session.scalars(query.order_by(Job.id.desc()).limit(limit)))
