"""This machine's clock against the database server's: times written here are judged by other machines."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

Clock = Callable[[], datetime]


def local_now() -> datetime:
    """This machine's time, as heartbeats carry it."""
    return datetime.now(UTC)


def clock_offset_s(session: Session, local: Clock = local_now) -> tuple[float, float] | None:
    """(this clock minus the server's, in seconds; the measurement's round trip) on PostgreSQL, None on
    SQLite (the server is this machine). The server's time is taken as read halfway through the round trip.
    """
    if session.get_bind().dialect.name != "postgresql":
        return None
    began, before = time.perf_counter(), local()
    server = session.scalar(select(func.clock_timestamp()))
    round_trip = time.perf_counter() - began
    if not isinstance(server, datetime):
        return None
    halfway = before.timestamp() + round_trip / 2
    return halfway - server.timestamp(), round_trip
