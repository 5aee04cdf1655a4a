"""This machine's clock against the database server's: times written here are judged by other machines."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

WARN_OFFSET_S = 2.0  # a skew NTP would not leave: said in the log


def local_now() -> datetime:
    """This machine's time."""
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


def unexplained_skew_s(offset_s: float, round_trip_s: float) -> float:
    """How far a measured offset is beyond what the measurement's round trip can explain (>= 0)."""
    return max(0.0, abs(offset_s) - round_trip_s / 2)


def offset_words(offset_s: float) -> str:
    """The offset said in words: "this machine's clock is 60.0 s behind the database server's"."""
    side = "ahead of" if offset_s > 0 else "behind"
    return f"this machine's clock is {abs(offset_s):.1f} s {side} the database server's"


class LedgerClock:
    """The database server's time read off this machine's clock, corrected by the offset last measured:
    for a process that stamps times all along (a worker's heartbeats, claims and finish times) or acts at
    given times (the scheduler's fire times), without a round trip at each reading; measured again at each
    heartbeat or lease renewal, so a clock that drifts is followed. Until measured, and on SQLite, it is
    this machine's clock.
    """

    def __init__(self, local: Clock = local_now) -> None:
        self._local = local
        self.offset_s = 0.0  # this clock minus the server's

    def now(self) -> datetime:
        """The server's time now, as last measured against this clock."""
        return self._local() - timedelta(seconds=self.offset_s)

    def measure(self, session: Session) -> tuple[float, float] | None:
        """Measure the offset again (clock_offset_s), keep it, and return it; None on SQLite."""
        measured = clock_offset_s(session, self._local)
        if measured is not None:
            self.offset_s = measured[0]
        return measured


def measured_clock(sessions: sessionmaker[Session], who: str, local: Clock = local_now) -> LedgerClock:
    """A LedgerClock measured now, for a process that starts (who: "detq worker"); a warning in the log
    when this machine's clock is more than WARN_OFFSET_S off the server's (it is corrected, but a clock
    that far off is one that nothing synchronises)."""
    clock = LedgerClock(local)
    try:
        with sessions() as session:
            measured = clock.measure(session)
    except SQLAlchemyError as exc:  # measured again at the process's next heartbeat or lease renewal
        log.warning("%s: could not read the database server's clock (%s)", who, exc)
        return clock
    if measured is not None and unexplained_skew_s(*measured) > WARN_OFFSET_S:
        log.warning(
            "%s: %s; the times it writes are corrected to the server's; synchronise the clocks (NTP, chrony)",
            who,
            offset_words(measured[0]),
        )
    return clock
