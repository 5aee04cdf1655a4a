"""A worker's clock checked against the database server's at start: its heartbeats are judged elsewhere."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session, sessionmaker

from db.clock import WARN_OFFSET_S, Clock, clock_offset_s, local_now, offset_words, unexplained_skew_s

log = logging.getLogger(__name__)


def check_clock(
    sessions: sessionmaker[Session], worker_timeout_s: float, local: Clock = local_now
) -> str | None:
    """Why this machine's clock is too far from the database server's to run a worker, or None.

    The heartbeats written here carry this clock, and the reconciler on another machine judges them by its
    own: a worker a timeout's worth behind looks lost at every pass, and its batches are taken from it.
    Past a third of DETQ_WORKER_TIMEOUT (the reconciler's interval) it refuses; past WARN_OFFSET_S it warns.
    """
    with sessions() as session:
        measured = clock_offset_s(session, local)
    if measured is None:
        return None
    offset, round_trip = measured
    skew = unexplained_skew_s(offset, round_trip)
    if skew <= WARN_OFFSET_S:
        return None
    where = offset_words(offset)
    if skew >= worker_timeout_s / 3:
        return (
            f"{where}: other machines judge this worker's heartbeats by their clocks, and would take it for"
            f" lost (DETQ_WORKER_TIMEOUT is {worker_timeout_s:g} s); synchronise the clocks (NTP, chrony)"
        )
    log.warning(
        "detq worker: %s; synchronise the clocks (NTP, chrony) before it nears DETQ_WORKER_TIMEOUT", where
    )
    return None
