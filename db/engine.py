"""Engine and session factory for SQLite and PostgreSQL, and the transient-error test callers retry on."""

from __future__ import annotations

import os
import socket
import sqlite3
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

SQLITE_BUSY_TIMEOUT_MS = 30_000

# Execution option of read_only(engine): its transactions read and never write.
READ_ONLY_OPTION = "detq_read_only"
_QUERY_ONLY = "detq_query_only"  # in a pooled SQLite connection's info: PRAGMA query_only is on

# PostgreSQL SQLSTATEs worth retrying: serialization failure, deadlock, lock not available, the server out
# of disk, memory or connections (class 53), an I/O error on its side, and the server shutting down or
# starting up. Class 08 (connection exception) is matched apart. None of them says anything of an image:
# the work waits for the resource, it does not fail (issue 40).
_TRANSIENT_SQLSTATES = frozenset(
    {
        "40001",
        "40P01",
        "55P03",
        "53000",
        "53100",
        "53200",
        "53300",
        "53400",
        "58030",
        "57P01",
        "57P02",
        "57P03",
    }
)
_SQLITE_TRANSIENT_MESSAGES = (
    "database is locked",
    "database table is locked",
    "database is busy",
    "database or disk is full",
    "disk i/o error",
)
# SQLite's primary result codes: BUSY, LOCKED, IOERR (a read or write the OS refused), FULL (the disk, or
# max_page_count), CANTOPEN (its journal could not be made: a full or read-only folder).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_IOERR, _SQLITE_FULL, _SQLITE_CANTOPEN = 5, 6, 10, 13, 14
_SQLITE_TRANSIENT_CODES = (_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_IOERR, _SQLITE_FULL, _SQLITE_CANTOPEN)


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL, pointing bare PostgreSQL URLs at psycopg 3, the only driver installed."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def sqlite_file(url: URL) -> Path | None:
    """The database file of an SQLite URL; None for in-memory databases and other backends."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:") or url.query.get("mode") == "memory":
        return None
    return Path(database)


def make_engine(url: str | URL, *, kept: int | None = None) -> Engine:
    """An engine tuned for many worker processes writing at once: WAL + BEGIN IMMEDIATE on SQLite.

    kept: on PostgreSQL, the connections kept open between uses (SQLAlchemy's default: 5); more at once
    are opened, and closed when given back.
    """
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        return _server_engine(parsed, kept)
    path = sqlite_file(parsed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
    event.listen(engine, "connect", _on_sqlite_connect)
    event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def _server_engine(url: URL, kept: int | None) -> Engine:
    """A PostgreSQL engine that works behind a pooler in transaction mode, each connection named."""
    connect_args: dict[str, Any] = {}
    if url.get_driver_name() == "psycopg":
        # psycopg prepares a statement on the server after 5 runs of it on a connection. Behind PgBouncer in
        # transaction mode (before 1.21, or without max_prepared_statements), the way to serve many
        # machines from one server, the next transaction may run on another server connection: "prepared
        # statement _pg3_0 already exists" or "does not exist" failed batches. Off, a batch costs 0.4 to
        # 1.2 ms more, under 0.3% of an SSDlite batch (docs/benchmarks.md, twenty-fourth session).
        connect_args["prepare_threshold"] = None
    sizes: dict[str, int] = {} if kept is None else {"pool_size": kept, "max_overflow": 10}
    engine = create_engine(url, pool_pre_ping=True, connect_args=connect_args, **sizes)
    if "application_name" not in url.query:
        event.listen(engine, "do_connect", _name_connection)
    return engine


def _name_connection(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    # Which host and process holds a connection, in pg_stat_activity and PgBouncer's SHOW CLIENTS. Made at
    # connect time: a forked pool process opens its own, under its own pid.
    cparams.setdefault("application_name", f"detq {socket.gethostname()[:40]} pid {os.getpid()}")


def _on_sqlite_connect(dbapi_connection: Any, connection_record: ConnectionPoolEntry) -> None:
    # SQLAlchemy's recipe for pysqlite (docs: "Enabling Non-Legacy SQLite Transactional Modes"): stop the
    # driver from emitting its own deferred BEGIN, so _on_sqlite_begin decides how transactions start.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # busy_timeout first, so that switching a fresh file to WAL waits for other processes too.
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _switch_to_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _switch_to_wal(cursor: Any) -> None:
    """PRAGMA journal_mode=WAL, retried for up to the busy timeout while the file is locked.

    The switch of a rollback-journal file (a fresh one) needs its exclusive lock. Where another connection
    holds the write lock, or two processes switch the same fresh file at once, SQLite answers "database is
    locked" at once rather than call the busy handler (waiting could deadlock), so the wait is done here.
    """
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

    for attempt in Retrying(
        retry=retry_if_exception(is_transient_error),
        wait=wait_exponential(multiplier=0.002, max=0.05),
        stop=stop_after_delay(SQLITE_BUSY_TIMEOUT_MS / 1000),
        reraise=True,
    ):
        with attempt:
            cursor.execute("PRAGMA journal_mode=WAL")


def read_only(engine: Engine) -> Engine:
    """The engine for transactions that only read, sharing its pool: READ ONLY on PostgreSQL; on SQLite a
    deferred BEGIN with PRAGMA query_only on, which in WAL mode reads a snapshot and takes no lock.

    detq's other SQLite transactions begin IMMEDIATE (_on_sqlite_begin): a read among them holds the
    database's write lock for as long as it lasts, and every worker's write waits for it, failing past
    the busy timeout: an export piped into a pager, a report drawing its thumbnails. A write in one of
    these transactions fails on either database instead of taking a lock.
    """
    options: dict[str, Any] = {READ_ONLY_OPTION: True}
    if engine.dialect.name == "postgresql":
        options["postgresql_readonly"] = True
    return engine.execution_options(**options)


def _on_sqlite_begin(conn: Connection) -> None:
    # BEGIN IMMEDIATE takes the write lock up front, waiting on busy_timeout. A deferred BEGIN would take it
    # at the first write, and SQLite fails such a read-to-write upgrade at once with "database is locked"
    # instead of waiting, when another process wrote since the transaction's first read. A read_only
    # transaction never writes: it begins deferred and takes no lock.
    reads = bool(conn.get_execution_options().get(READ_ONLY_OPTION, False))
    if reads != conn.info.get(_QUERY_ONLY, False):
        # query_only belongs to the pooled connection, not to the transaction: on for a read_only one,
        # off again for the next transaction that may write.
        conn.exec_driver_sql(f"PRAGMA query_only={'ON' if reads else 'OFF'}")
        conn.info[_QUERY_ONLY] = reads
    conn.exec_driver_sql("BEGIN DEFERRED" if reads else "BEGIN IMMEDIATE")


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit; callers use `with factory() as s, s.begin():`."""
    return sessionmaker(bind=engine, expire_on_commit=False)


def is_transient_error(exc_: BaseException) -> bool:
    """True when retrying the transaction may succeed: lock/busy, serialization, deadlock, lost connection."""
    seen: set[int] = set()
    current: BaseException | None = exc_
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _classify(current)
        if verdict is not None:
            return verdict
        current = current.__cause__  # follow `raise ... from db_error` through callers' own exceptions
    return False


def _classify(error: BaseException) -> bool | None:
    """True/False for database errors, None for anything else."""
    if isinstance(error, exc.DBAPIError):
        if error.connection_invalidated:
            return True
        if isinstance(error, exc.IntegrityError | exc.ProgrammingError | exc.DataError):
            return False
        return error.orig is not None and _classify_driver_error(error.orig)
    if isinstance(error, exc.DisconnectionError | exc.TimeoutError):
        return True
    if isinstance(error, sqlite3.Error | _psycopg_error()):
        return _classify_driver_error(error)
    return None


def _psycopg_error() -> type[BaseException]:
    """psycopg's base error, once the driver is loaded (a SQLite deployment never loads it: an error
    cannot come from a driver that was never imported)."""
    psycopg = sys.modules.get("psycopg")
    return psycopg.Error if psycopg is not None else sqlite3.Error


def _classify_driver_error(orig: BaseException) -> bool:
    """Classify the DBAPI exception itself."""
    if isinstance(orig, sqlite3.Error):
        if isinstance(orig, sqlite3.IntegrityError | sqlite3.ProgrammingError):
            return False
        code = getattr(orig, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in _SQLITE_TRANSIENT_CODES:
            return True
        message = str(orig).lower()
        return any(text in message for text in _SQLITE_TRANSIENT_MESSAGES)
    if isinstance(orig, _psycopg_error()):
        import psycopg  # loaded already: the error came from it

        assert isinstance(orig, psycopg.Error)
        if orig.sqlstate is not None:
            return orig.sqlstate in _TRANSIENT_SQLSTATES or orig.sqlstate.startswith("08")
        # No SQLSTATE: the server never answered, the connection failed or died on the way.
        return isinstance(orig, psycopg.OperationalError)
    return False
