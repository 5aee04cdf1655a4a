"""Open the ledger from settings: one engine and session factory, the schema checked, disposed on exit."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.exc import ArgumentError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory, read_only
from db.migrate import ensure_schema
from detq.errors import DetqError
from detq.settings import Settings

# What PostgreSQL answers a connection past max_connections (SQLSTATE 53300, which psycopg does not carry
# on a failed connect): reachable, but full.
_SERVER_FULL = ("too many clients already", "connection slots are reserved")


class LedgerUnavailable(DetqError):
    """The database URL is malformed, or the database cannot be reached."""


@dataclass(frozen=True)
class Ledger:
    """An open ledger: the engine (one pool of connections) and the sessions its callers open.

    reads: sessions for work that only reads (db.engine.read_only), such as a status, an export, a
    report: on SQLite they hold no worker's write back however long they last.
    """

    engine: Engine
    sessions: sessionmaker[Session]
    reads: sessionmaker[Session]

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Ledger:
        """`with open_ledger(settings) as led, led.sessions() as s:` ... closed on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_ledger(settings: Settings, *, check_schema: bool = True, kept: int | None = None) -> Ledger:
    """The ledger of these settings; migrates the embedded SQLite default, checks PostgreSQL is migrated.

    Per process: a forked child opens its own (pooled connections never cross a fork).
    """
    try:
        engine = make_engine(settings.resolved_database_url, kept=kept)
    except ArgumentError as exc:
        raise LedgerUnavailable(f"DETQ_DATABASE_URL is not a database URL: {exc}") from exc
    except ImportError as exc:  # a URL naming a driver that is not installed
        raise LedgerUnavailable(f"DETQ_DATABASE_URL needs a driver that is not installed: {exc}") from exc
    if check_schema:
        try:
            ensure_schema(engine)
        except (OperationalError, InterfaceError) as exc:
            engine.dispose()
            where = engine.url.render_as_string(hide_password=True)
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            if any(sign in reason for sign in _SERVER_FULL):
                raise LedgerUnavailable(
                    f"the database at {where} takes no more connections ({reason}): raise its"
                    " max_connections, or put PgBouncer in transaction mode in front of it"
                    " (README: PostgreSQL connections)"
                ) from exc
            raise LedgerUnavailable(f"cannot reach the database at {where}: {reason}") from exc
        except BaseException:
            engine.dispose()
            raise
    return Ledger(
        engine=engine, sessions=make_session_factory(engine), reads=make_session_factory(read_only(engine))
    )
