"""This machine's clock against the database server's, measured on a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from db.clock import clock_offset_s
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
