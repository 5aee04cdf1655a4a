"""Alembic environment of the detq ledger: migrates the connection db.migrate passes, or sqlalchemy.url."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from alembic import context
from sqlalchemy import Connection

from db.engine import make_engine
from db.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    """Write the migration SQL for the configured URL instead of running it."""
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=url is not None and url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


@contextmanager
def sqlite_foreign_keys_off(connection: Connection) -> Iterator[None]:
    """Suspend foreign key enforcement on this SQLite connection while migrating.

    Batch migrations rebuild a table (copy, DROP, rename); with enforcement on, the DROP of a referenced
    table cascades and deletes its children's rows. SQLite's procedure for schema changes
    (https://www.sqlite.org/lang_altertable.html#otheralter) turns enforcement off, which only works outside
    a transaction, and runs PRAGMA foreign_key_check before committing instead (see run_migrations).
    """
    dbapi_connection = connection.connection.driver_connection
    if dbapi_connection is None or connection.in_transaction():
        yield
        return
    dbapi_connection.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        dbapi_connection.execute("PRAGMA foreign_keys=ON")


def run_migrations(connection: Connection) -> None:
    """Run the migrations on one connection, in one transaction."""
    is_sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite can only ALTER a little: batch mode rebuilds the table instead.
        render_as_batch=is_sqlite,
        # db.engine makes SQLAlchemy emit BEGIN on SQLite, so DDL is transactional there too: all or nothing.
        transactional_ddl=True if is_sqlite else None,
    )
    if not is_sqlite:
        with context.begin_transaction():
            context.run_migrations()
        return
    with sqlite_foreign_keys_off(connection), context.begin_transaction():
        context.run_migrations()
        violations = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if violations:
            raise RuntimeError(f"migration left rows violating foreign keys: {violations[:10]}")


def run_migrations_online() -> None:
    """Migrate the connection handed over in config.attributes, else a fresh engine on sqlalchemy.url."""
    connection = config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("no connection in config.attributes and no sqlalchemy.url set")
    engine = make_engine(url)
    try:
        with engine.connect() as new_connection:
            run_migrations(new_connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
