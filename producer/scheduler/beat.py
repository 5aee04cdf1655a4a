"""Celery beat for detq: cron schedules with seconds and time zones, state in the database, one leader."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

from celery import Celery
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import BaseSchedule, schedstate
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db.clock import LedgerClock
from db.models import as_utc, utcnow
from db.schedules_repo import note_schedules_seen, schedule_states
from detq.contract import QUEUE_CONTROL, TASK_SCHEDULED_RUN
from dispatch.leadership import Leadership
from producer.scheduler.cron import CronSpec
from producer.scheduler.schedules import Schedule

log = logging.getLogger(__name__)


class CronSchedule(BaseSchedule):
    """A beat schedule over a CronSpec; due when a fire time passed since the last run, by nowfun's clock."""

    def __init__(
        self, spec: CronSpec, app: Celery | None = None, nowfun: Callable[[], datetime] = utcnow
    ) -> None:
        super().__init__(nowfun=nowfun, app=app)
        self.spec = spec

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time left until the first fire time after last_run_at (negative when overdue)."""
        return self.spec.next_after(as_utc(last_run_at)) - self.now()

    def is_due(self, last_run_at: datetime) -> schedstate:
        """Due once however many fire times passed: a scheduler down for three nights runs one night."""
        now = self.now()
        due_at = self.spec.next_after(as_utc(last_run_at))
        if due_at <= now:
            return schedstate(True, max((self.spec.next_after(now) - now).total_seconds(), 0.0))
        return schedstate(False, (due_at - now).total_seconds())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CronSchedule) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)

    def __repr__(self) -> str:
        return f"<cron {self.spec.expression!r} {self.spec.timezone}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self.spec,)


@dataclass(frozen=True)
class BeatContext:
    """What the leader scheduler needs: the schedules, the database, the lease, and the clock it fires by
    (the database server's, so that a machine whose clock is off fires its schedules on time)."""

    schedules: Sequence[Schedule]
    factory: sessionmaker[Session]
    leadership: Leadership
    clock: LedgerClock = field(default_factory=LedgerClock)


class LeaderScheduler(Scheduler):
    """Beat's scheduler with entries from the schedules config and last runs from the database.

    It fires only while this process holds the scheduler lease; on taking the lease (at start-up or from a
    dead leader) it reloads each schedule's last run from the database, so a run missed meanwhile fires
    once. Each due entry sends the control task with the run's scheduled time, its unique key.
    """

    context: ClassVar[BeatContext]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._leading = False
        self._standby_logged = False
        self._next_check = 0.0
        super().__init__(*args, **kwargs)

    @classmethod
    def bound_to(cls, context: BeatContext) -> type[LeaderScheduler]:
        """A subclass carrying context, for beat.Service, which builds its scheduler from a class."""
        return type("BoundLeaderScheduler", (cls,), {"context": context})

    def setup_schedule(self) -> None:
        """No entries until the lease is held; no shelve file ever."""
        self.data: dict[str, ScheduleEntry] = {}

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Check the lease when due, then let beat fire what is due if this process leads."""
        leadership = self.context.leadership
        if time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + leadership.renew_interval_s
            held = leadership.check()
            if held:
                self._measure_clock()
            self._on_lease(held)
        until_check = max(self._next_check - time.monotonic(), 0.0)
        if not self._leading:
            return min(until_check, float(self.max_interval or 1))
        return min(float(super().tick(*args, **kwargs)), until_check)

    def _measure_clock(self) -> None:
        """Measure the server's clock again, as often as the lease is renewed; a failure keeps the last."""
        try:
            with self.context.factory() as session:
                self.context.clock.measure(session)
        except SQLAlchemyError as exc:
            log.debug("detq scheduler: clock not measured (%s); firing by the last offset", exc)

    def _on_lease(self, held: bool) -> None:
        if held and not self._leading:
            log.info("detq scheduler: active (holds the lease as %s)", self.context.leadership.owner)
            self._load_entries()
        elif not held and (self._leading or not self._standby_logged):
            log.warning("detq scheduler: standby (another scheduler holds the lease)")
            self.data = {}
        self._standby_logged = not held
        self._leading = held

    def _load_entries(self) -> None:
        """Entries whose last run is the latest run in the database, or when the schedule was first seen."""
        names = [s.name for s in self.context.schedules]
        with self.context.factory() as session, session.begin():
            note_schedules_seen(session, names, self.context.clock.now())
            states = schedule_states(session, names)
        entries = {}
        for schedule in self.context.schedules:
            state = states[schedule.name]
            last = as_utc(state.first_seen_at)
            if state.last_scheduled_for is not None:
                last = max(last, as_utc(state.last_scheduled_for))
            entries[schedule.name] = self.Entry(
                name=schedule.name,
                task=TASK_SCHEDULED_RUN,
                schedule=CronSchedule(schedule.cron, app=self.app, nowfun=self.context.clock.now),
                last_run_at=as_utc(last),
                options={"queue": QUEUE_CONTROL, "routing_key": QUEUE_CONTROL},
                app=self.app,
            )
            log.info(
                "detq scheduler: %s (%s) last ran for %s, next at %s",
                schedule.name,
                schedule.cron.expression,
                as_utc(last).isoformat(),
                schedule.cron.next_after(as_utc(last)).isoformat(),
            )
        self.data = entries

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Send the control task for the latest fire time now due: (schedule, scheduled time) is the key."""
        entry = self.reserve(entry) if advance else entry  # type: ignore[assignment]
        schedule = entry.schedule
        if not isinstance(schedule, CronSchedule) or entry.name is None:
            return super().apply_async(entry, producer=producer, advance=False, **kwargs)
        scheduled_for = schedule.spec.latest_at_or_before(schedule.now())
        log.info("detq scheduler: %s due for %s; sent to the control queue", entry.name, scheduled_for)
        return self.app.send_task(
            TASK_SCHEDULED_RUN,
            args=[entry.name, scheduled_for.isoformat()],
            queue=QUEUE_CONTROL,
            routing_key=QUEUE_CONTROL,
            producer=producer,
        )

    def close(self) -> None:
        """Give the lease back on a clean stop, so a standby need not wait for it to expire."""
        self.context.leadership.release()
        super().close()
