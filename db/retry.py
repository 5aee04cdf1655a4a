"""The one retry layer for the ledger: a transaction rerun on transient errors, with backoff, for a while."""

from __future__ import annotations

import errno
import logging
import os
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


# errno values of a resource that is away rather than a request that is wrong: a full disk or quota, a
# device that fails reads or writes, a folder turned read-only.
_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


def unavailable_reason(error: BaseException) -> str | None:
    """One line saying which resource is away when `error` is the environment's (the ledger's disk full,
    the database down or locked past the retries, a full or failing disk elsewhere): waiting cures it, so
    nothing of the work is to blame. None for any other error (a bug, a request that is wrong)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_transient_error(current):
            return f"the ledger is unavailable: {_first_line(current)}"
        if isinstance(current, OSError) and current.errno in _ENVIRONMENT_ERRNOS:
            where = f" ({current.filename})" if current.filename else ""
            return f"{os.strerror(current.errno)}{where}"
        current = current.__cause__  # `raise ... from error` through callers' own exceptions
    return None


def _first_line(error: BaseException) -> str:
    """The database's own words: the driver error's first line, without SQLAlchemy's statement."""
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip()
    return text.splitlines()[0] if text else type(error).__name__
