"""Test helpers for the ledger by URL: migrate a database, read its revision."""

from __future__ import annotations

from db.engine import make_engine
from db.migrate import current_revision, upgrade


def migrate(url: str) -> None:
    """Upgrade the database at url to the newest schema."""
    engine = make_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()


def revision_of(url: str) -> str | None:
    """The schema revision of the database at url."""
    engine = make_engine(url)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()
