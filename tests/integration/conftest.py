"""Deployments for the integration tests: the embedded default, and Redis with PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Deployment
from tests.integration.servers import ThrowawayPgBouncer, ThrowawayTlsRedis


@pytest.fixture(params=["embedded", "redis+postgres"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Deployment:
    """A fresh detq deployment of each kind, its schema migrated."""
    if request.param == "embedded":
        return Deployment(data_dir=tmp_path / "data")
    return _scaled_out(
        tmp_path, str(request.getfixturevalue("postgres_url")), str(request.getfixturevalue("redis_url"))
    )


@pytest.fixture()
def scaled_out(tmp_path: Path, postgres_url: str, redis_url: str) -> Deployment:
    """Redis with PostgreSQL only (the database a fleet's machines share), its schema migrated."""
    return _scaled_out(tmp_path, postgres_url, redis_url)


def _scaled_out(tmp_path: Path, database_url: str, broker_url: str) -> Deployment:
    deployed = Deployment(data_dir=tmp_path / "data", database_url=database_url, broker_url=broker_url)
    deployed.run("db", "upgrade")
    return deployed


@pytest.fixture()
def embedded(tmp_path: Path) -> Deployment:
    """The embedded default only: SQLite and the filesystem broker in a data dir."""
    return Deployment(data_dir=tmp_path / "data")


@pytest.fixture()
def tls_redis(tmp_path: Path) -> Iterator[ThrowawayTlsRedis]:
    """A throwaway redis-server that speaks TLS only, its certificate signed by a CA of its own."""
    server = ThrowawayTlsRedis(tmp_path / "tls")
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def pgbouncer(postgres_admin_url: str) -> Iterator[ThrowawayPgBouncer]:
    """A throwaway PgBouncer in transaction mode, two server connections, in front of the test server."""
    bouncer = ThrowawayPgBouncer(postgres_admin_url, pool_size=2)
    bouncer.start()
    yield bouncer
    bouncer.stop()
