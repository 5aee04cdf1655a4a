"""The schedules configured for this deployment: DETQ_SCHEDULES_FILE and the DETQ_SCHEDULE_* variables."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from detq.settings import Settings
from producer.scheduler.schedules import (
    Schedule,
    combine_schedules,
    load_schedules_file,
    schedule_from_environment,
)


def configured_schedules(settings: Settings) -> list[Schedule]:
    """Every configured schedule; raises ScheduleConfigError with all the problems found."""
    from_file = load_schedules_file(settings.schedules_file) if settings.schedules_file else []
    from_env = schedule_from_environment(
        name=settings.schedule_name,
        folder=settings.schedule_folder,
        cron=settings.schedule_cron,
        timezone=settings.schedule_timezone,
        pool=settings.schedule_pool,
    )
    return combine_schedules(from_file, from_env)


@dataclass(frozen=True)
class ScheduleView:
    """What `detq schedule list` shows of one schedule."""

    name: str
    cron: str
    timezone: str
    next_run: str  # in the schedule's time zone
    next_run_utc: str
    folders: list[str]
    model: str
    pool: str
    batch_size: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def describe_schedules(schedules: list[Schedule], settings: Settings, now: datetime) -> list[ScheduleView]:
    """Each schedule with its next run after now, defaults filled in from settings."""
    views = []
    for schedule in schedules:
        upcoming = schedule.cron.next_after(now)
        views.append(
            ScheduleView(
                name=schedule.name,
                cron=schedule.cron.expression,
                timezone=schedule.cron.timezone,
                next_run=upcoming.astimezone(schedule.cron.zone).isoformat(),
                next_run_utc=upcoming.isoformat(),
                folders=[str(f) for f in schedule.folders],
                model=str(schedule.model or settings.model),
                pool=schedule.pool,
                batch_size=schedule.batch_size or settings.batch_size,
            )
        )
    return views
