"""Open the ledger and the Celery app for CLI commands, from settings."""

from __future__ import annotations

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory
from db.schema import ensure_schema
from detq.settings import Settings
from worker.app import make_celery_app


def open_ledger(settings: Settings) -> tuple[Engine, sessionmaker[Session]]:
    """Engine and session factory; migrates the embedded SQLite default, checks PostgreSQL is migrated."""
    url = settings.resolved_database_url
    ensure_schema(url)
    engine = make_engine(url)
    return engine, make_session_factory(engine)


def celery_app(settings: Settings) -> Celery:
    """The Celery app producers send through (by task name; no task code is imported)."""
    return make_celery_app(settings)
