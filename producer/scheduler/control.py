"""The control task `detq scheduler` consumes: a thin shell that runs one scheduled run by name."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from detq.contract import TASK_SCHEDULED_RUN
from producer.enqueue import EnqueueError
from producer.scheduler.runs import RunDefaults, RunOutcome, run_schedule
from producer.scheduler.schedules import Schedule

log = logging.getLogger(__name__)

RunHandler = Callable[[str, datetime], RunOutcome | None]


def make_run_handler(
    factory: sessionmaker[Session], app: Celery, schedules: Sequence[Schedule], defaults: RunDefaults
) -> RunHandler:
    """Run the named schedule for a scheduled time; unknown names and unusable folders are logged."""
    by_name = {schedule.name: schedule for schedule in schedules}

    def handle(schedule_name: str, scheduled_for: datetime) -> RunOutcome | None:
        schedule = by_name.get(schedule_name)
        if schedule is None:
            # Sent by a scheduler with another configuration; this one cannot know the folders.
            log.error("detq scheduler: no schedule %r here; run for %s dropped", schedule_name, scheduled_for)
            return None
        try:
            return run_schedule(factory, app, schedule, scheduled_for, defaults)
        except EnqueueError as exc:
            log.error("detq scheduler: %s for %s failed: %s", schedule_name, scheduled_for, exc)
            return None

    return handle


def register_control_task(app: Celery, handle: RunHandler) -> None:
    """Register the scheduled-run task on the scheduler's app (inference workers never register it)."""

    @app.task(name=TASK_SCHEDULED_RUN, ignore_result=True)
    def scheduled_run(schedule_name: str, scheduled_for: str) -> None:
        handle(schedule_name, datetime.fromisoformat(scheduled_for))
