"""Test helpers for the ledger: migrate a database by URL, read its revision, record the SQL sent."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event

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


@contextmanager
def sql_sent(engine: Engine) -> Iterator[list[str]]:
    """The SQL the engine sends while the block runs, statement by statement."""
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)
