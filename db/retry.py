"""The one retry layer for the ledger: a transaction rerun on transient errors, with backoff, for a while."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.orm import Session, sessionmaker
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from db.engine import is_transient_error

log = logging.getLogger(__name__)

T = TypeVar("T")

# Long enough to ride out a PostgreSQL restart or failover (tens of seconds), short enough that a batch
# still ends well inside its soft time limit when the database stays away.
DB_RETRY_SECONDS = 120.0


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning(
        "transient database error (attempt %d, %.0f s so far), retrying: %s",
        state.attempt_number,
        state.seconds_since_start or 0.0,
        error,
    )


def in_transaction(
    sessions: sessionmaker[Session],
    work: Callable[[Session], T],
    *,
    give_up_after_s: float = DB_RETRY_SECONDS,
) -> T:
    """Run `work` in its own transaction; rerun it on lock, deadlock or lost-connection errors.

    Anything else, or a transient error that outlasts give_up_after_s, is raised to the caller.
    """
    retrying = Retrying(
        retry=retry_if_exception(is_transient_error),
        wait=wait_exponential(multiplier=0.1, max=5.0),
        stop=stop_after_delay(give_up_after_s),
        before_sleep=_log_retry,
        reraise=True,
    )
    for attempt in retrying:
        with attempt, sessions() as session, session.begin():
            result = work(session)
    return result
