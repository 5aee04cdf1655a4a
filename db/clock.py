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


def ledger_now(session: Session) -> datetime:
    """The time liveness is stamped and judged by: the database server's on PostgreSQL, the one clock every
    machine of a fleet shares (its transaction's start, one round trip); this machine's on SQLite, whose
    every user runs here.

    A producer or a scheduler whose clock is off by more than DETQ_WORKER_TIMEOUT otherwise had its live
    enqueue taken for a dead one's by a reconciler elsewhere (a 100,000-file job closed at 10,000), and a
    lease expired or renewed by the wrong clock.
    """
    if session.get_bind().dialect.name != "postgresql":
        return local_now()
    server = session.scalar(select(func.now()))
    if not isinstance(server, datetime):
        raise TypeError(f"the database server's now() read as {server!r}")
    return server.astimezone(UTC)


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
