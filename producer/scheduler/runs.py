"""One scheduled run: an incremental enqueue of a schedule's folders under its unique run key."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from db.schedules_repo import RunCounts, RunKey
from detq.inference_settings import DEFAULTS, InferenceSettings
from producer.enqueue import enqueue_folders
from producer.scheduler.schedules import Schedule
from producer.unqueued_run import RunAlreadyClaimed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunDefaults:
    """What a schedule does not say itself, from settings."""

    model: Path
    batch_size: int
    max_retries: int
    allowed_roots: Sequence[Path] = ()
    heartbeat_s: float = 5.0
    worker_timeout_s: float | None = None  # the live fleet the last batches taper for (None: no taper)
    settings: InferenceSettings = DEFAULTS  # what its runs' results are made with (the scheduler's DETQ_*)


@dataclass(frozen=True)
class RunOutcome:
    """What a scheduled run did: its job, or None when that run already existed."""

    key: RunKey
    job_id: int | None
    total: int = 0
    counts: RunCounts | None = None


def run_schedule(
    factory: sessionmaker[Session],
    app: Celery,
    schedule: Schedule,
    scheduled_for: datetime,
    defaults: RunDefaults,
) -> RunOutcome:
    """Create the run's job and queue what is new since the model last ran; a no-op if the run exists."""
    key = RunKey(schedule.name, scheduled_for).normalized()
    try:
        result = enqueue_folders(
            factory,
            app,
            roots=schedule.folders,
            model_path=schedule.model or defaults.model,
            pool=schedule.pool,
            batch_size=schedule.batch_size or defaults.batch_size,
            recursive=schedule.recursive,
            allowed_roots=defaults.allowed_roots,
            only_new=True,
            max_retries=defaults.max_retries,
            run_key=key,
            heartbeat_s=defaults.heartbeat_s,
            worker_timeout_s=defaults.worker_timeout_s,
            settings=defaults.settings,
        )
    except RunAlreadyClaimed:
        log.info("detq scheduler: %s for %s already ran; nothing sent", key.schedule_name, key.scheduled_for)
        return RunOutcome(key=key, job_id=None)
    counts = result.counts or RunCounts()
    for line in result.notes.warnings(result.job_id):
        log.warning("detq scheduler: %s for %s: %s", key.schedule_name, key.scheduled_for, line)
    if result.total == 0:
        log.info(
            "detq scheduler: %s for %s: job %d, nothing new (%d skipped); finished at once",
            key.schedule_name,
            key.scheduled_for,
            result.job_id,
            counts.skipped,
        )
    else:
        log.info(
            "detq scheduler: %s for %s: job %d queued %d images (new %d, changed %d, retried %d, skipped %d)",
            key.schedule_name,
            key.scheduled_for,
            result.job_id,
            result.total,
            counts.new,
            counts.changed,
            counts.retried,
            counts.skipped,
        )
    return RunOutcome(key=key, job_id=result.job_id, total=result.total, counts=counts)
