"""The fleet as the heartbeats tell it: each worker node and pool process, alive, stale, stopped or lost."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from db.jobs_repo import model_paths
from db.models import WorkerRecord, as_utc
from db.workers_repo import ROLE_PROCESS, list_workers, live_workers
from detq.contract import queues_of_worker_pool


@dataclass(frozen=True)
class WorkerView:
    """One row of `detq workers`."""

    id: int
    role: str
    node: str
    host: str
    pid: int
    pool: str
    device: str | None
    model_sha256: str | None
    state: str  # alive, stale (not seen for a timeout, not yet closed), stopped, lost
    started_at: str
    last_seen_s: float  # seconds since its last heartbeat
    batches_done: int
    images_done: int
    images_per_s: float
    model_name: str = ""  # its model file's name, where the ledger knows the model

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _state(record: WorkerRecord, now: datetime, timeout: timedelta) -> str:
    if record.stopped_at is not None:
        return record.stop_reason or "stopped"
    return "alive" if now - as_utc(record.last_seen_at) <= timeout else "stale"


RECENT_S = 3600.0


def fleet(
    session: Session, now: datetime, *, timeout_s: float, include_stopped: bool = False
) -> list[WorkerView]:
    """Open rows, with include_stopped those closed in the last hour too; each node before its processes."""
    stopped_since = now - timedelta(seconds=RECENT_S) if include_stopped else None
    timeout = timedelta(seconds=timeout_s)
    records = list_workers(session, stopped_since=stopped_since)
    paths = model_paths(session, [r.model_sha256 for r in records if r.model_sha256])
    return [
        WorkerView(
            id=r.id,
            role=r.role,
            node=r.node,
            host=r.host,
            pid=r.pid,
            pool=r.pool,
            device=r.device,
            model_sha256=r.model_sha256,
            state=_state(r, now, timeout),
            started_at=as_utc(r.started_at).isoformat(),
            last_seen_s=round((now - as_utc(r.last_seen_at)).total_seconds(), 1),
            batches_done=r.batches_done,
            images_done=r.images_done,
            images_per_s=r.images_per_s,
            model_name=Path(paths[r.model_sha256]).name if r.model_sha256 in paths else "",
        )
        for r in records
    ]


def listening_pools(views: list[WorkerView]) -> set[str]:
    """The pools with at least one live node consuming them."""
    return {v.pool for v in views if v.role == "node" and v.state == "alive"}


def processes_on_queue(session: Session, queue: str, now: datetime, *, timeout_s: float) -> int:
    """Live pool processes (heard from within timeout_s) whose node consumes this queue."""
    workers = live_workers(session, now - timedelta(seconds=timeout_s))
    return sum(w.role == ROLE_PROCESS and queue in queues_of_worker_pool(w.pool) for w in workers)
