"""Repository functions for worker heartbeats: register, beat, close, find the lost and the live."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, bindparam, or_, select, update
from sqlalchemy.orm import Session

from db.models import WorkerRecord, table_of
from detq.contract import task_id_for

ROLE_NODE = "node"  # a `detq worker` parent: consumes the queues, holds reserved messages
ROLE_PROCESS = "process"  # one pool process: loads the model, runs batches
STOPPED = "stopped"  # closed its row on a clean exit
LOST = "lost"  # stopped beating; found by the reconciler or by a claim


@dataclass(frozen=True)
class WorkerIdentity:
    """What a worker row says of who it is."""

    role: str
    node: str
    host: str
    host_key: str
    pid: int
    pool: str
    device: str | None = None
    model_sha256: str | None = None


@dataclass(frozen=True)
class Beat:
    """What a heartbeat refreshes besides the time."""

    held: Sequence[str] | None = None
    current_batch_id: int | None = None
    batches_done: int | None = None
    images_done: int | None = None
    images_per_s: float | None = None


def register_worker(session: Session, identity: WorkerIdentity, now: datetime) -> int:
    """A new worker row, alive now; returns its id."""
    record = WorkerRecord(
        **asdict(identity),
        started_at=now,
        last_seen_at=now,
        held=[],
        batches_done=0,
        images_done=0,
        images_per_s=0.0,
    )
    session.add(record)
    session.flush()
    return record.id


def beat(session: Session, worker_id: int, now: datetime, state: Beat) -> None:
    """Refresh a worker's last-seen time and state; a worker wrongly declared lost comes back alive."""
    values: dict[str, Any] = {
        "last_seen_at": now,
        "stopped_at": None,
        "stop_reason": None,
        "current_batch_id": state.current_batch_id,
    }
    for name in ("held", "batches_done", "images_done", "images_per_s"):
        value = getattr(state, name)
        if value is not None:
            values[name] = list(value) if name == "held" else value
    session.execute(update(WorkerRecord).where(WorkerRecord.id == worker_id).values(values))


_WORKERS = table_of(WorkerRecord)
_SET_CURRENT_BATCH = (  # every batch runs it: built once (db/claims_repo.py)
    update(_WORKERS)
    .where(_WORKERS.c.id == bindparam("worker_id"))
    .values(current_batch_id=bindparam("batch"), last_seen_at=bindparam("now"))
)


def set_current_batch(session: Session, worker_id: int, batch_id: int | None, now: datetime) -> None:
    """Say which batch this process runs now (in the claim's transaction), and that it is alive."""
    session.execute(_SET_CURRENT_BATCH, {"worker_id": worker_id, "batch": batch_id, "now": now})


def close_worker(session: Session, worker_ids: Sequence[int], now: datetime, reason: str = STOPPED) -> int:
    """Close rows (a clean exit, or a death found); returns how many were open."""
    if not worker_ids:
        return 0
    outcome = cast(
        "CursorResult[Any]",
        session.execute(
            update(WorkerRecord)
            .where(WorkerRecord.id.in_(list(worker_ids)), WorkerRecord.stopped_at.is_(None))
            .values(stopped_at=now, stop_reason=reason, current_batch_id=None, held=[])
        ),
    )
    return outcome.rowcount


def close_lost_workers(session: Session, seen_before: datetime, now: datetime) -> list[int]:
    """Close the open rows not seen since seen_before as lost; their ids."""
    lost = list(
        session.scalars(
            select(WorkerRecord.id).where(
                WorkerRecord.stopped_at.is_(None), WorkerRecord.last_seen_at < seen_before
            )
        )
    )
    close_worker(session, lost, now, LOST)
    return lost


def held_by_unseen(session: Session, seen_before: datetime) -> set[str]:
    """Task ids the open rows not seen since seen_before held (nodes' held lists, processes' batches): what
    close_lost_workers is about to forget."""
    held: set[str] = set()
    rows = session.execute(
        select(WorkerRecord.role, WorkerRecord.held, WorkerRecord.current_batch_id).where(
            WorkerRecord.stopped_at.is_(None), WorkerRecord.last_seen_at < seen_before
        )
    )
    for role, task_ids, batch_id in rows.tuples():
        if role == ROLE_NODE:
            held.update(task_ids or [])
        elif batch_id is not None:
            held.add(task_id_for(batch_id))
    return held


def live_workers(session: Session, seen_since: datetime) -> list[WorkerRecord]:
    """Open rows seen since seen_since."""
    return list(
        session.scalars(
            select(WorkerRecord).where(
                WorkerRecord.stopped_at.is_(None), WorkerRecord.last_seen_at >= seen_since
            )
        )
    )


def workers_by_id(session: Session, worker_ids: Sequence[int]) -> dict[int, WorkerRecord]:
    """The rows of these ids."""
    if not worker_ids:
        return {}
    rows = session.scalars(select(WorkerRecord).where(WorkerRecord.id.in_(list(worker_ids))))
    return {row.id: row for row in rows}


def list_workers(session: Session, stopped_since: datetime | None = None) -> list[WorkerRecord]:
    """Open rows (and rows closed since stopped_since, if given), by node, each node before its processes."""
    query = select(WorkerRecord)
    if stopped_since is None:
        query = query.where(WorkerRecord.stopped_at.is_(None))
    else:
        query = query.where(or_(WorkerRecord.stopped_at.is_(None), WorkerRecord.stopped_at >= stopped_since))
    return list(session.scalars(query.order_by(WorkerRecord.node, WorkerRecord.role, WorkerRecord.id)))
