"""A named lease seen from one process: take it, renew it, notice losing it, give it back."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from datetime import timedelta

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db.clock import ledger_now
from db.lease_repo import acquire_lease, release_lease

log = logging.getLogger(__name__)

SCHEDULER_LEASE = "scheduler"  # one active `detq scheduler`
RECONCILER_LEASE = "reconciler"  # one reconciler among every worker and scheduler


def make_owner_id() -> str:
    """A name unique to this process, readable in the lease row: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Leadership:
    """Whether this process holds a named lease (is the active scheduler, or the reconciler).

    check() renews or takes the lease and should run every ttl/3; a standby's check() takes over once the
    holder stopped renewing for ttl. When the database cannot be reached the process keeps leading only
    until its last renewal runs out, which is when a standby could take over.
    """

    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        ttl_s: float,
        owner: str | None = None,
        name: str = SCHEDULER_LEASE,
    ) -> None:
        self.factory = factory
        self.name = name
        self.ttl = timedelta(seconds=ttl_s)
        self.owner = owner or make_owner_id()
        self._held_until = 0.0  # time.monotonic() when the last successful renewal runs out
        self.reachable = True  # whether the last check reached the database

    @property
    def renew_interval_s(self) -> float:
        """How often check() should run."""
        return self.ttl.total_seconds() / 3

    @property
    def is_leader(self) -> bool:
        """True while the last successful renewal has not run out."""
        return time.monotonic() < self._held_until

    def check(self) -> bool:
        """Take or renew the lease; True while this process holds it."""
        started = time.monotonic()
        try:
            with self.factory() as session, session.begin():
                held = acquire_lease(session, self.name, self.owner, ledger_now(session), self.ttl)
        except SQLAlchemyError as exc:
            self.reachable = False
            log.warning(
                "detq: cannot renew the %s lease (%s); still held: %s", self.name, exc, self.is_leader
            )
            return self.is_leader
        self.reachable = True
        # Measured from before the call: the row's expiry is never earlier than what this process assumes.
        self._held_until = started + self.ttl.total_seconds() if held else 0.0
        return held

    def release(self) -> None:
        """Give the lease back (on a clean shutdown) so that a standby takes over at its next check."""
        if not self.is_leader:
            return
        self._held_until = 0.0
        try:
            with self.factory() as session, session.begin():
                release_lease(session, self.name, self.owner, ledger_now(session))
        except SQLAlchemyError as exc:
            log.warning("detq: could not release the %s lease (%s); it expires by itself", self.name, exc)
