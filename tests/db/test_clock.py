"""This machine's clock against the database server's, measured on a real PostgreSQL; the clock liveness is
judged by, on both databases."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db.clock import (
    LedgerClock,
    clock_offset_s,
    ledger_now,
    measured_clock,
    offset_words,
    unexplained_skew_s,
)
from db.engine import make_engine, make_session_factory


def _shifted(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def test_the_offset_is_measured_against_the_servers_clock(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    try:
        with make_session_factory(engine)() as session:
            same = clock_offset_s(session)
            behind = clock_offset_s(session, lambda: _shifted(-60))
    finally:
        engine.dispose()
    # The server runs on this machine here: the same clock, within the round trip and a little
    assert same is not None and behind is not None
    assert abs(same[0]) < 0.5 and 0 < same[1] < 0.5
    assert -60.5 < behind[0] < -59.5


def test_liveness_is_stamped_by_the_servers_clock_on_postgresql(factory: sessionmaker[Session]) -> None:
    with factory() as session, session.begin():
        before = datetime.now(UTC)
        now = ledger_now(session)
        after = datetime.now(UTC)
        server = (
            session.scalar(select(func.now())) if session.get_bind().dialect.name == "postgresql" else None
        )
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    if server is None:
        # SQLite: every user of the file runs on this machine, whose clock it is
        assert before <= now <= after
    else:
        # PostgreSQL: the server's (its transaction's start), the clock every machine of a fleet shares
        assert now == server


def test_a_ledger_clock_reads_the_servers_time_off_a_skewed_clock(postgres_url: str) -> None:
    # Given a machine whose clock is an hour behind the database server's
    clock = LedgerClock(lambda: _shifted(-3600))
    assert abs((clock.now() - datetime.now(UTC)).total_seconds() + 3600) < 1  # its own, until measured
    engine = make_engine(postgres_url)
    try:
        # When the clock is measured against the server
        with make_session_factory(engine)() as session:
            measured = clock.measure(session)
    finally:
        engine.dispose()
    # Then it reads the server's time (here the same machine's) without asking it again
    assert measured is not None and -3600.5 < measured[0] < -3599.5
    assert abs((clock.now() - datetime.now(UTC)).total_seconds()) < 0.5
    assert offset_words(measured[0]).startswith("this machine's clock is 3600.")
    assert unexplained_skew_s(-3.0, 0.5) == 2.75 and unexplained_skew_s(0.1, 0.4) == 0.0


def test_a_ledger_clock_on_sqlite_is_this_machines(sqlite_url: str) -> None:
    clock = LedgerClock(lambda: _shifted(-3600))
    engine = make_engine(sqlite_url)
    try:
        with make_session_factory(engine)() as session:
            assert clock.measure(session) is None
    finally:
        engine.dispose()
    assert clock.offset_s == 0.0


def test_a_process_starting_on_a_clock_seconds_off_is_warned_and_corrected(
    postgres_url: str, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine, local_engine = make_engine(postgres_url), make_engine(sqlite_url)
    try:
        sessions = make_session_factory(engine)
        # A clock in step starts quietly
        with caplog.at_level(logging.WARNING, logger="db.clock"):
            measured_clock(sessions, "detq worker")
        assert caplog.records == []
        # One 5 s ahead is said in the log, and its readings are the server's
        with caplog.at_level(logging.WARNING, logger="db.clock"):
            clock = measured_clock(sessions, "detq worker", lambda: _shifted(5))
        assert [r.getMessage()[:52] for r in caplog.records] == [
            "detq worker: this machine's clock is 5.0 s ahead of "
        ]
        assert abs((clock.now() - datetime.now(UTC)).total_seconds()) < 0.5
        # SQLite is this machine's own clock: nothing to measure, nothing said
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="db.clock"):
            assert measured_clock(make_session_factory(local_engine), "detq worker").offset_s == 0.0
        assert caplog.records == []
    finally:
        engine.dispose()
        local_engine.dispose()
