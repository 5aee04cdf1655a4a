"""Make sure a database is at the newest schema: migrate SQLite automatically, ask for it on PostgreSQL."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from db.engine import normalize_url
from db.migrate import current_revision, make_config, upgrade


class SchemaError(RuntimeError):
    """The database is not at the schema this version of detq needs."""


def head_revision(url: str) -> str | None:
    """The newest migration shipped with this version."""
    return ScriptDirectory.from_config(make_config(url)).get_current_head()


def ensure_schema(url: str) -> None:
    """Upgrade the embedded SQLite default in place; on a shared server, refuse to run on an old schema.

    A cluster's PostgreSQL is migrated once, on purpose (`detq db upgrade`, the compose `migrate` service),
    not by whichever worker happens to start first with a newer release.
    """
    if normalize_url(url).get_backend_name() == "sqlite":
        upgrade(url)
        return
    head = head_revision(url)
    current = current_revision(url)
    if current != head:
        raise SchemaError(
            f"database schema is at {current or 'nothing'}, this detq needs {head}: run `detq db upgrade`"
        )
