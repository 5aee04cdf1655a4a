"""A worker's clock against the database server's: refused past a third of the timeout, warned past 2 s."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from db.engine import make_engine, make_session_factory
from worker.clock import check_clock


def _shifted(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def test_a_clock_a_third_of_the_timeout_off_is_refused_and_a_few_seconds_warned(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(postgres_url)
    sessions = make_session_factory(engine)
    try:
        # A clock in step starts quietly
        with caplog.at_level(logging.WARNING, logger="worker.clock"):
            assert check_clock(sessions, 30.0) is None
        assert caplog.records == []
        # One 60 s behind, with DETQ_WORKER_TIMEOUT at 30 s, is refused with why and what to do
        refused = check_clock(sessions, 30.0, lambda: _shifted(-60))
        assert refused is not None
        assert refused.startswith("this machine's clock is 60.0 s behind the database")
        assert "DETQ_WORKER_TIMEOUT is 30 s" in refused and "NTP" in refused
        # One 5 s ahead starts, with a warning in the log
        with caplog.at_level(logging.WARNING, logger="worker.clock"):
            assert check_clock(sessions, 30.0, lambda: _shifted(5)) is None
        assert [r.getMessage()[:52] for r in caplog.records] == [
            "detq worker: this machine's clock is 5.0 s ahead of "
        ]
    finally:
        engine.dispose()


def test_sqlite_is_this_machines_own_clock(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    try:
        sessions = make_session_factory(engine)
        assert check_clock(sessions, 30.0, lambda: _shifted(-600)) is None
    finally:
        engine.dispose()
