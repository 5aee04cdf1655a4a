"""The beat side of `detq scheduler`: due once after missed times, state from the database, leader only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.clock import LedgerClock
from db.engine import make_engine, make_session_factory
from db.models import ScheduleState
from detq.celery_app import make_celery_app
from detq.contract import QUEUE_CONTROL, TASK_SCHEDULED_RUN
from detq.settings import Settings
from dispatch.leadership import Leadership
from producer.scheduler.beat import BeatContext, CronSchedule, LeaderScheduler
from producer.scheduler.cron import CronSpec
from producer.scheduler.schedules import Schedule
from tests.ledger_support import migrate

EVERY_MINUTE = CronSpec("* * * * *")
HOURLY = CronSpec("0 * * * *")


def test_cron_schedule_is_due_once_however_many_times_were_missed() -> None:
    now = datetime.now(UTC)
    schedule = CronSchedule(EVERY_MINUTE)
    due, next_in = schedule.is_due(now - timedelta(days=3))
    assert due and 0 <= next_in <= 60  # then the next fire time from now, not the missed ones
    due, next_in = schedule.is_due(now)
    assert not due and 0 < next_in <= 60
    assert schedule.is_due(now.replace(tzinfo=None) - timedelta(hours=1)).is_due  # naive = UTC (SQLite)


@pytest.fixture()
def factory(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path / 'detq.db'}"
    migrate(url)
    engine = make_engine(url)
    yield make_session_factory(engine)
    engine.dispose()


def _scheduler(
    factory: sessionmaker[Session],
    tmp_path: Path,
    owner: str,
    sent: list[dict[str, Any]],
    *,
    clock: LedgerClock | None = None,
    cron: CronSpec = EVERY_MINUTE,
) -> LeaderScheduler:
    app = make_celery_app(Settings(_env_file=None, data_dir=tmp_path / "data"))
    app.send_task = lambda name, **kwargs: sent.append({"name": name, **kwargs})  # type: ignore[method-assign]
    schedule = Schedule(name="cams", folders=(tmp_path,), cron=cron)
    context = BeatContext(
        schedules=[schedule],
        factory=factory,
        leadership=Leadership(factory, ttl_s=30, owner=owner),
        clock=clock or LedgerClock(),
    )
    return LeaderScheduler.bound_to(context)(app=app, max_interval=1)


def test_missed_run_is_sent_once_for_the_latest_time(factory: sessionmaker[Session], tmp_path: Path) -> None:
    # Given a schedule whose last run was three days ago
    three_days_ago = datetime.now(UTC) - timedelta(days=3)
    with factory() as session, session.begin():
        session.add(
            ScheduleState(name="cams", first_seen_at=three_days_ago, last_scheduled_for=three_days_ago)
        )
    sent: list[dict[str, Any]] = []
    scheduler = _scheduler(factory, tmp_path, "a", sent)
    # When beat ticks a few times
    for _ in range(5):
        scheduler.tick()
    # Then one run is sent, to the control queue, for the latest minute passed
    assert len(sent) == 1
    (message,) = sent
    assert (message["name"], message["queue"]) == (TASK_SCHEDULED_RUN, QUEUE_CONTROL)
    name, scheduled_for = message["args"]
    assert name == "cams"
    assert datetime.fromisoformat(scheduled_for) == EVERY_MINUTE.latest_at_or_before(datetime.now(UTC))


def test_a_new_schedule_waits_for_its_first_time(factory: sessionmaker[Session], tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []
    scheduler = _scheduler(factory, tmp_path, "a", sent)
    for _ in range(3):
        scheduler.tick()
    assert sent == []
    assert "cams" in scheduler.schedule


def test_only_the_lease_holder_sends(factory: sessionmaker[Session], tmp_path: Path) -> None:
    with factory() as session, session.begin():
        long_ago = datetime.now(UTC) - timedelta(days=1)
        session.add(ScheduleState(name="cams", first_seen_at=long_ago, last_scheduled_for=long_ago))
    leader_sent: list[dict[str, Any]] = []
    standby_sent: list[dict[str, Any]] = []
    leader = _scheduler(factory, tmp_path, "leader", leader_sent)
    leader.tick()
    standby = _scheduler(factory, tmp_path, "standby", standby_sent)
    for _ in range(3):
        standby.tick()
        leader.tick()
    assert (len(leader_sent), standby_sent, standby.schedule) == (1, [], {})


def test_a_scheduler_whose_clock_is_off_fires_by_the_servers(postgres_url: str, tmp_path: Path) -> None:
    # Given a scheduler on a machine two hours behind the database server, an hourly schedule last run
    # three days ago
    migrate(postgres_url)
    engine = make_engine(postgres_url)
    factory = make_session_factory(engine)
    try:
        three_days_ago = datetime.now(UTC) - timedelta(days=3)
        with factory() as session, session.begin():
            session.add(
                ScheduleState(name="cams", first_seen_at=three_days_ago, last_scheduled_for=three_days_ago)
            )
        sent: list[dict[str, Any]] = []
        clock = LedgerClock(lambda: datetime.now(UTC) - timedelta(hours=2))
        scheduler = _scheduler(factory, tmp_path, "a", sent, clock=clock, cron=HOURLY)
        # When beat ticks
        for _ in range(3):
            scheduler.tick()
    finally:
        engine.dispose()
    # Then the run it sends is for the server's latest hour, not for the one its clock shows
    ((_, scheduled_for),) = [message["args"] for message in sent]
    assert datetime.fromisoformat(scheduled_for) == HOURLY.latest_at_or_before(datetime.now(UTC))
