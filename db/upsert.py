"""INSERT ... ON CONFLICT DO NOTHING for the two databases detq supports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert


def insert_ignoring_conflicts(
    session: Session, model: type[Any], values: dict[str, Any], conflict_columns: Sequence[str]
) -> Insert:
    """An INSERT of values that does nothing when a row with the same conflict_columns exists."""
    # Each dialect's module is imported here, for the database in use only: the PostgreSQL dialect alone
    # costs a command on SQLite about 50 ms of start-up.
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return postgresql_insert(model).values(values).on_conflict_do_nothing(index_elements=conflict_columns)
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(model).values(values).on_conflict_do_nothing(index_elements=conflict_columns)
    raise NotImplementedError(f"detq supports SQLite and PostgreSQL, not {dialect}")
