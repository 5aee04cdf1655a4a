"""Schema migrations run from code: Alembic upgrade under a cross-process lock, and the schema policy."""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, func, inspect, select, text
from sqlalchemy.engine import URL

from db.engine import normalize_url, sqlite_file
from detq.errors import DetqError

if TYPE_CHECKING:  # alembic loads only to migrate: every command and worker start checks, few migrate
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# The newest migration in MIGRATIONS_DIR; tests/db/test_migrate.py fails if a new one is added without it.
HEAD_REVISION = "0009"
ALEMBIC_VERSION_TABLE = "alembic_version"

# Key of the PostgreSQL advisory lock held while migrating; advisory locks are scoped to one database.
PG_MIGRATION_LOCK_KEY = 0x6465_7471_6D69_6772  # "detqmigr"

log = logging.getLogger(__name__)


class SchemaError(DetqError):
    """The database is not at the schema this version of detq needs."""


def make_config(url: str | URL) -> Config:
    """An Alembic config for the bundled migrations, no alembic.ini needed (also for `command.revision`)."""
    from alembic.config import Config

    parsed = normalize_url(url) if isinstance(url, str) else url
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    # Config values go through configparser interpolation, where a literal % must be doubled.
    config.set_main_option("sqlalchemy.url", parsed.render_as_string(hide_password=False).replace("%", "%%"))
    return config


def head_revision() -> str | None:
    """The newest migration shipped with this version."""
    return HEAD_REVISION


def script_head() -> str | None:
    """The newest migration as Alembic reads it from MIGRATIONS_DIR (what HEAD_REVISION must equal)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(make_config("sqlite://")).get_current_head()


def newer_than_known(current: str | None) -> bool:
    """True for a revision past this detq's head: the ledger was migrated by a newer release. detq's
    revisions are zero-padded numbers (0001, 0002, ...), so a later one compares greater."""
    head = head_revision()
    return current is not None and head is not None and current.isdigit() and int(current) > int(head)


def _refuse_newer(current: str | None) -> None:
    if newer_than_known(current):
        raise SchemaError(
            f"database schema is at {current}, newer than this detq knows ({head_revision()}): a newer"
            " release migrated it; upgrade detq here to the release the others run"
        )


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the engine's database to revision; safe to call from several processes at once."""
    config = make_config(engine.url)
    with _migration_file_lock(engine.url), engine.connect() as connection:
        if revision == "head":  # Alembic would fail on a revision it has no file for, with a traceback
            _refuse_newer(_revision_on(connection))
            connection.rollback()
        if connection.dialect.name == "postgresql":
            _upgrade_postgresql(connection, config, revision)
        else:
            _run_upgrade(connection, config, revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; None when it was never migrated."""
    with engine.connect() as connection:
        return _revision_on(connection)


def _revision_on(connection: Connection) -> str | None:
    if not inspect(connection).has_table(ALEMBIC_VERSION_TABLE):
        return None
    found = connection.execute(text(f"SELECT version_num FROM {ALEMBIC_VERSION_TABLE}")).scalars().all()
    if len(found) > 1:  # branches: not how detq's migrations are laid out; Alembic would refuse too
        raise SchemaError(f"database schema has several heads {sorted(found)}; this detq needs one")
    return found[0] if found else None


def ensure_schema(engine: Engine) -> None:
    """Upgrade the embedded SQLite default in place; on a shared server, refuse to run on an old schema.

    A cluster's PostgreSQL is migrated once, on purpose (`detq db upgrade`, the compose `migrate` service),
    not by whichever worker happens to start first with a newer release.
    """
    head, current = head_revision(), current_revision(engine)
    if current == head:  # the usual case: a read, not a migration run (its start-up costs every command)
        return
    _refuse_newer(current)
    if engine.dialect.name == "sqlite":
        if current is not None:  # an existing ledger: a table rebuilt on millions of rows takes a while
            log.warning("detq: upgrading the ledger %s from %s to %s", engine.url.database, current, head)
        upgrade(engine)
        return
    raise SchemaError(
        f"database schema is at {current or 'nothing'}, this detq needs {head}: run `detq db upgrade`"
    )


def _run_upgrade(connection: Connection, config: Config, revision: str) -> None:
    from alembic import command

    config.attributes["connection"] = connection  # env.py migrates on this connection
    command.upgrade(config, revision)
    if connection.in_transaction():
        connection.commit()


def _upgrade_postgresql(connection: Connection, config: Config, revision: str) -> None:
    # A session-level advisory lock outlives the commits below; other migrators queue on it, then see
    # the version this one committed.
    connection.execute(select(func.pg_advisory_lock(PG_MIGRATION_LOCK_KEY)))
    connection.commit()
    try:
        _run_upgrade(connection, config, revision)
    finally:
        if connection.in_transaction():
            connection.rollback()
        connection.execute(select(func.pg_advisory_unlock(PG_MIGRATION_LOCK_KEY)))
        connection.commit()


@contextmanager
def _migration_file_lock(url: URL) -> Iterator[None]:
    """For an SQLite file, hold an exclusive flock on <file>.migrate.lock; a no-op for other databases."""
    path = sqlite_file(url)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.migrate.lock", "a") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
