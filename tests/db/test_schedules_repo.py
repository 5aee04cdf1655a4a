"""Scheduled runs and the scheduler lease, over SQLite and PostgreSQL: claimed once, held by one owner."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.jobs_repo import create_job, get_or_create_model
from db.lease_repo import acquire_lease, release_lease
from db.models import Lease
from db.schedules_repo import RunKey, claim_run, find_run, list_runs, schedule_states

TICK = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
TTL = timedelta(seconds=10)


def _model(factory: sessionmaker[Session]) -> int:
    with factory() as session, session.begin():
        return get_or_create_model(session, sha256="f" * 64, path="/m.pt", size_bytes=1, meta={}).id


def _claim(factory: sessionmaker[Session], model_id: int, key: RunKey) -> int | None:
    with factory() as session, session.begin():
        return claim_run(session, key, model_id=model_id, roots=["/d"], pool="any", batch_size=8)


def test_a_run_key_is_claimed_once(factory: sessionmaker[Session]) -> None:
    model_id = _model(factory)
    job_id = _claim(factory, model_id, RunKey("cams", TICK))
    assert job_id is not None
    # The same key, even written in another zone or with microseconds, is the same run
    paris = TICK.astimezone(datetime.now().astimezone().tzinfo).replace(microsecond=250)
    assert _claim(factory, model_id, RunKey("cams", paris)) is None
    assert _claim(factory, model_id, RunKey("cams", TICK + timedelta(days=1))) is not None
    assert _claim(factory, model_id, RunKey("other", TICK)) is not None
    with factory() as session, session.begin():
        # Hand-made jobs (no key) never collide with each other
        create_job(session, model_id=model_id, roots=["/d"], pool="any", batch_size=8)
        create_job(session, model_id=model_id, roots=["/d"], pool="any", batch_size=8)
    with factory() as session:
        run = find_run(session, RunKey("cams", TICK))
        assert run is not None and run.id == job_id
        assert [job.schedule_name for job in list_runs(session)] == ["other", "cams", "cams"]
        assert len(list_runs(session, "cams")) == 2
        state = schedule_states(session, ["cams"])["cams"]
        last = state.last_scheduled_for
        assert last is not None and last.replace(tzinfo=UTC) == TICK + timedelta(days=1)


def test_racing_claims_make_one_job(factory: sessionmaker[Session]) -> None:
    model_id = _model(factory)
    barrier = threading.Barrier(4)
    results: list[int | None] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(_claim(factory, model_id, RunKey("cams", TICK)))
        except BaseException as error:  # noqa: B036 - reported to the main thread below
            errors.append(error)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert len([r for r in results if r is not None]) == 1
    with factory() as session:
        assert len(list_runs(session, "cams")) == 1


def _acquire(factory: sessionmaker[Session], owner: str, now: datetime) -> bool:
    with factory() as session, session.begin():
        return acquire_lease(session, "scheduler", owner, now, TTL)


def test_lease_has_one_owner_until_it_expires(factory: sessionmaker[Session]) -> None:
    assert _acquire(factory, "a", TICK)
    assert not _acquire(factory, "b", TICK + timedelta(seconds=1))
    assert _acquire(factory, "a", TICK + timedelta(seconds=5))  # renewed until +15 s
    assert not _acquire(factory, "b", TICK + timedelta(seconds=14))
    assert _acquire(factory, "b", TICK + timedelta(seconds=15))  # a stopped renewing: b takes over
    assert not _acquire(factory, "a", TICK + timedelta(seconds=16))
    with factory() as session, session.begin():
        holder = session.scalar(select(Lease.owner).where(Lease.name == "scheduler"))
        assert holder == "b"
        assert not release_lease(session, "scheduler", "a", TICK + timedelta(seconds=17))
        assert release_lease(session, "scheduler", "b", TICK + timedelta(seconds=17))
    assert _acquire(factory, "a", TICK + timedelta(seconds=17))  # released: no wait for expiry


def test_racing_candidates_get_one_lease(factory: sessionmaker[Session]) -> None:
    barrier = threading.Barrier(4)
    won: list[str] = []

    def candidate(owner: str) -> None:
        barrier.wait(timeout=10)
        if _acquire(factory, owner, TICK):
            won.append(owner)

    threads = [threading.Thread(target=candidate, args=(f"c{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(won) == 1
