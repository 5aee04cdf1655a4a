"""INSERT ... ON CONFLICT DO NOTHING for the two databases detq supports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert


def insert_ignoring_conflicts(
    session: Session, model: type[Any], values: dict[str, Any], conflict_columns: Sequence[str]
) -> Insert:
    """An INSERT of values that does nothing when a row with the same conflict_columns exists."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(model).values(values).on_conflict_do_nothing(index_elements=conflict_columns)
    if dialect == "sqlite":
        return sqlite.insert(model).values(values).on_conflict_do_nothing(index_elements=conflict_columns)
    raise NotImplementedError(f"detq supports SQLite and PostgreSQL, not {dialect}")
