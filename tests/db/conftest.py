"""Fixtures of the repository tests: a session factory on a freshly migrated database of each kind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory
from tests.ledger_support import migrate


@pytest.fixture()
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    """Sessions on a migrated SQLite or PostgreSQL database (database_url runs each test on both)."""
    migrate(database_url)
    engine = make_engine(database_url)
    yield make_session_factory(engine)
    engine.dispose()
