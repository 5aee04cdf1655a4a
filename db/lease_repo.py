"""Repository functions for the scheduler lease: one owner at a time, renewed, taken over once expired."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, or_, select, update
from sqlalchemy.orm import Session

from db.models import Lease
from db.upsert import insert_ignoring_conflicts


def acquire_lease(session: Session, name: str, owner: str, now: datetime, ttl: timedelta) -> bool:
    """Take or renew the lease for ttl; True when owner holds it afterwards.

    One conditional UPDATE decides (owner already holds it, or it expired), so two candidates never both
    win: PostgreSQL re-checks the WHERE clause after the row lock, SQLite serialises writers. now is
    the database's clock (db.clock.ledger_now), so the candidates' own clocks do not matter.
    """
    session.execute(
        insert_ignoring_conflicts(
            session,
            Lease,
            {"name": name, "owner": owner, "acquired_at": now, "expires_at": now + ttl},
            ["name"],
        )
    )
    current = session.scalar(select(Lease.owner).where(Lease.name == name))
    values: dict[str, Any] = {"owner": owner, "expires_at": now + ttl}
    if current != owner:
        values["acquired_at"] = now
    outcome = cast(
        "CursorResult[Any]",
        session.execute(
            update(Lease)
            .where(
                Lease.name == name,
                or_(Lease.owner == owner, Lease.expires_at <= now),
            )
            .values(values)
        ),
    )
    return outcome.rowcount == 1


def release_lease(session: Session, name: str, owner: str, now: datetime) -> bool:
    """Let the lease expire now if owner holds it, so a standby takes over at its next poll."""
    outcome = cast(
        "CursorResult[Any]",
        session.execute(update(Lease).where(Lease.name == name, Lease.owner == owner).values(expires_at=now)),
    )
    return outcome.rowcount == 1
