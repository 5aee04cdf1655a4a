"""Tests of db.engine: SQLite pragmas, BEGIN IMMEDIATE, URL handling and transient-error classification."""

from __future__ import annotations

import errno
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import make_url

from db.engine import (
    is_transient_error,
    make_engine,
    make_session_factory,
    read_only,
)
from db.models import ModelRecord
from db.retry import unavailable_reason
from tests.ledger_support import migrate


@pytest.fixture()
def sqlite_engine(sqlite_url: str) -> Iterator[sa.Engine]:
    """An engine on a fresh SQLite file."""
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def test_sqlite_connections_get_wal_and_pragmas(sqlite_engine: sa.Engine) -> None:
    with sqlite_engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL


def test_switching_a_locked_file_to_wal_waits_for_the_lock(tmp_path: Path) -> None:
    # Given a fresh rollback-journal file whose write lock another connection holds for a moment: the case
    # of two processes opening the same fresh ledger at once, where SQLite fails the switch at once
    path = tmp_path / "detq.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (a INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    release = threading.Timer(0.3, holder.execute, args=("COMMIT",))
    engine = make_engine(f"sqlite:///{path}")
    try:
        started = time.monotonic()
        release.start()
        # When detq connects, Then it waits for the lock instead of failing, and the file is in WAL
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("SELECT a FROM t").scalars().all() == [1]
        assert time.monotonic() - started >= 0.25
    finally:
        release.join()
        engine.dispose()
        holder.close()


def test_sqlite_parent_folder_is_created(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "data" / "detq.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("select 1")
    finally:
        engine.dispose()
    assert path.exists()


def test_sqlite_transactions_begin_immediate(sqlite_engine: sa.Engine, sqlite_url: str) -> None:
    # Given a session whose transaction has only read so far
    factory = make_session_factory(sqlite_engine)
    database = sqlite_url.removeprefix("sqlite:///")
    other = sqlite3.connect(database, timeout=0, isolation_level=None)
    try:
        with factory() as session, session.begin():
            session.execute(sa.text("select 1"))
            # When another connection asks for the write lock, Then it is already taken (BEGIN IMMEDIATE)
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        # And once the session ended, the lock is free again
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_sqlite_read_only_transactions_hold_no_lock_refuse_writes_and_leave_the_next_free(
    sqlite_url: str,
) -> None:
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    writes, reads = make_session_factory(engine), make_session_factory(read_only(engine))
    other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
    try:
        # Given a read-only session in the middle of a read (an export streaming its rows)
        with reads() as session:
            assert session.scalar(sa.select(sa.func.count()).select_from(ModelRecord)) == 0
            # When another process writes, without waiting at all (busy timeout 0)
            other.execute("BEGIN IMMEDIATE")
            other.execute(
                "INSERT INTO models (sha256, path, size_bytes, meta, created_at)"
                " VALUES ('a', '/m', 1, '{}', '2024-01-01')"
            )
            other.execute("COMMIT")  # Then it commits: the reader holds no lock (it fails for `writes`)
            # And a write in the read-only session is refused by SQLite itself
            with pytest.raises(exc.OperationalError, match="readonly"):
                session.add(ModelRecord(sha256="b", path="/m", size_bytes=1, meta={}))
                session.flush()
        # And the next session on the same pooled connection writes as before
        assert engine.pool.checkedin() == 1
        with writes() as session, session.begin():
            session.add(ModelRecord(sha256="c", path="/m", size_bytes=1, meta={}))
        with reads() as session:
            assert sorted(session.scalars(sa.select(ModelRecord.sha256))) == ["a", "c"]
    finally:
        other.close()
        engine.dispose()


def test_read_only_sessions_refuse_writes_on_both_databases(database_url: str) -> None:
    migrate(database_url)
    engine = make_engine(database_url)
    try:
        reads, writes = make_session_factory(read_only(engine)), make_session_factory(engine)
        with reads() as session, pytest.raises(exc.DBAPIError, match="read-?only"):
            session.add(ModelRecord(sha256="b", path="/m", size_bytes=1, meta={}))
            session.flush()
        with writes() as session, session.begin():
            session.add(ModelRecord(sha256="c", path="/m", size_bytes=1, meta={}))
        with reads() as session:
            assert session.scalars(sa.select(ModelRecord.sha256)).all() == ["c"]
    finally:
        engine.dispose()


def test_sqlite_foreign_keys_are_enforced(sqlite_url: str) -> None:
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    try:
        with pytest.raises(exc.IntegrityError), engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO jobs (model_id, roots, pool, batch_size, total, enqueued_complete, created_at)"
                " VALUES (999, '[]', 'any', 1, 0, 0, '2024-01-01')"
            )
    finally:
        engine.dispose()


def test_postgresql_urls_use_psycopg3_with_pre_ping() -> None:
    engine = make_engine("postgresql://postgres@127.0.0.1:5432/test")
    try:
        assert engine.dialect.name == "postgresql"
        assert engine.dialect.driver == "psycopg"
        assert engine.pool._pre_ping
    finally:
        engine.dispose()


def test_postgresql_connections_are_named_for_their_process_unless_the_url_names_them(
    postgres_url: str,
) -> None:
    named = make_url(postgres_url).update_query_dict({"application_name": "nightly"})
    for url, expected in (
        (postgres_url, f"detq {socket.gethostname()[:40]} pid {os.getpid()}"),
        (named, "nightly"),
    ):
        engine = make_engine(url)
        try:
            with engine.connect() as connection:
                shown = connection.execute(sa.text("SELECT current_setting('application_name')")).scalar_one()
                # And no statement is prepared on the server, which a pooler in transaction mode breaks
                assert connection.connection.dbapi_connection.prepare_threshold is None  # type: ignore[union-attr]
        finally:
            engine.dispose()
        assert shown == expected


def test_an_engine_keeps_what_it_is_told_and_opens_more_for_the_moment(postgres_url: str) -> None:
    engine = make_engine(postgres_url, kept=1)
    try:
        # Given two connections in use at once (a batch's transaction and a heartbeat)
        with engine.connect() as first, engine.connect() as second:
            pids = {c.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() for c in (first, second)}
        # Then both ran, and once given back one stays open
        assert len(pids) == 2
        assert (engine.pool.size(), engine.pool.checkedin()) == (1, 1)  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_sessions_keep_objects_readable_after_commit(sqlite_url: str) -> None:
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    try:
        factory = make_session_factory(engine)
        with factory() as session, session.begin():
            record = ModelRecord(sha256="a" * 64, path="m.pt", size_bytes=1, meta={})
            session.add(record)
        engine.dispose()  # no connection left to refresh from: the attributes must not be expired
        assert record.sha256 == "a" * 64
        assert record.id is not None
    finally:
        engine.dispose()


def _wrap(error: Exception, kind: type[exc.DBAPIError] = exc.OperationalError) -> exc.DBAPIError:
    return kind("SELECT 1", {}, error)


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (_wrap(sqlite3.OperationalError("database is locked")), True),
        (_wrap(sqlite3.OperationalError("database table is locked")), True),
        (sqlite3.OperationalError("database is locked"), True),
        (_wrap(sqlite3.OperationalError("no such table: images")), False),
        (_wrap(sqlite3.IntegrityError("UNIQUE constraint failed: models.sha256"), exc.IntegrityError), False),
        (_wrap(psycopg.errors.SerializationFailure("could not serialize access")), True),
        (_wrap(psycopg.errors.DeadlockDetected("deadlock detected")), True),
        (psycopg.errors.DeadlockDetected("deadlock detected"), True),
        (_wrap(psycopg.errors.AdminShutdown("terminating connection")), True),
        (_wrap(psycopg.OperationalError("server closed the connection unexpectedly")), True),
        (_wrap(psycopg.errors.UniqueViolation("duplicate key"), exc.IntegrityError), False),
        (_wrap(psycopg.errors.UndefinedTable("relation does not exist"), exc.ProgrammingError), False),
        # A full disk is the environment's: waiting cures it, and no image is failed for it (issue 40)
        (_wrap(psycopg.errors.DiskFull("no space left"), exc.OperationalError), True),
        (_wrap(psycopg.errors.OutOfMemory("out of memory"), exc.OperationalError), True),
        (_wrap(sqlite3.OperationalError("database or disk is full")), True),
        (_wrap(sqlite3.OperationalError("disk I/O error")), True),
        (exc.DBAPIError("SELECT 1", {}, Exception("gone"), connection_invalidated=True), True),
        (exc.DisconnectionError("connection lost"), True),
        (ValueError("not a database error"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_is_transient_error_classifies(error: BaseException, transient: bool) -> None:
    assert is_transient_error(error) is transient


def test_is_transient_error_follows_explicit_cause() -> None:
    try:
        try:
            raise _wrap(sqlite3.OperationalError("database is locked"))
        except exc.OperationalError as db_error:
            raise RuntimeError("batch failed") from db_error
    except RuntimeError as error:
        assert is_transient_error(error)


def test_real_sqlite_lock_is_transient(sqlite_url: str) -> None:
    # Given one connection holding the write lock and an engine that does not wait for it
    migrate(sqlite_url)
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    impatient = sa.create_engine(sqlite_url, connect_args={"timeout": 0})
    try:
        holder.execute("BEGIN IMMEDIATE")
        # When the engine writes, Then it fails with an error classified as transient
        with pytest.raises(exc.OperationalError) as caught, impatient.begin() as conn:
            conn.exec_driver_sql("DELETE FROM models")
        assert is_transient_error(caught.value)
    finally:
        holder.close()
        impatient.dispose()


def test_a_real_full_sqlite_ledger_is_transient_and_said_in_one_line(sqlite_url: str) -> None:
    # Given a ledger that may not grow (SQLite's max_page_count, as a full disk stops it)
    migrate(sqlite_url)
    engine = sa.create_engine(sqlite_url)
    try:
        with pytest.raises(exc.OperationalError) as caught, engine.begin() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
            conn.exec_driver_sql(f"PRAGMA max_page_count = {pages}")
            conn.exec_driver_sql("CREATE TABLE filler (x BLOB)")
            conn.exec_driver_sql("INSERT INTO filler VALUES (zeroblob(1000000))")
        # When a write meets it, Then it is transient, and what a command prints is one line
        assert is_transient_error(caught.value)
        assert unavailable_reason(caught.value) == "the ledger is unavailable: database or disk is full"
        assert unavailable_reason(ValueError("a bug")) is None
        full = OSError(errno.ENOSPC, "No space left on device", "/data/broker/x.msg")
        assert unavailable_reason(RuntimeError("send failed").with_traceback(None)) is None
        try:
            raise RuntimeError("send failed") from full
        except RuntimeError as wrapped:
            assert unavailable_reason(wrapped) == "No space left on device (/data/broker/x.msg)"
    finally:
        engine.dispose()


def test_real_postgresql_errors_are_classified(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1, 0)")

        with pytest.raises(exc.IntegrityError) as integrity, engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (1, 0)")
        assert not is_transient_error(integrity.value)

        with pytest.raises(exc.ProgrammingError) as programming, engine.begin() as conn:
            conn.exec_driver_sql("SELECT * FROM missing_table")
        assert not is_transient_error(programming.value)

        # Given a REPEATABLE READ transaction that read a row another transaction then changed
        with pytest.raises(exc.OperationalError) as serialization:
            with engine.connect().execution_options(isolation_level="REPEATABLE READ") as first:
                first.exec_driver_sql("SELECT v FROM t WHERE id = 1")
                with engine.begin() as second:
                    second.exec_driver_sql("UPDATE t SET v = 1 WHERE id = 1")
                # When it updates the row too, Then PostgreSQL fails it with 40001, a transient error
                first.exec_driver_sql("UPDATE t SET v = 2 WHERE id = 1")
        assert is_transient_error(serialization.value)

        # Given a connection the server terminates
        with engine.connect() as victim:
            pid = victim.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            with engine.begin() as killer:
                killer.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            # When it is used again, Then the lost connection is transient
            with pytest.raises(exc.DBAPIError) as lost:
                victim.exec_driver_sql("SELECT 1")
        assert is_transient_error(lost.value)
    finally:
        engine.dispose()
