"""PostgreSQL connections at a fleet's scale: a server past max_connections said so, and detq behind
PgBouncer in transaction mode, where each statement runs on whichever server connection a transaction gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from db.engine import make_engine
from demo.shapes import write_dataset
from tests.integration.harness import Deployment, running_worker
from tests.integration.servers import ThrowawayPgBouncer, ThrowawayPostgres
from tests.ledger_support import migrate

pytestmark = pytest.mark.integration


def test_statements_run_many_times_by_clients_sharing_server_connections(
    pgbouncer: ThrowawayPgBouncer, postgres_url: str
) -> None:
    # Given two engines (two processes, say) whose transactions PgBouncer puts on the same server
    # connections; psycopg prepares a statement on the server after five runs of it, as _pg3_0, _pg3_1...
    migrate(postgres_url)
    engines = [make_engine(pgbouncer.url_for(postgres_url)) for _ in range(2)]
    statements = [sa.text("SELECT count(*) FROM jobs WHERE id > :n"), sa.text("SELECT :n + 1")]
    try:
        # When each runs its own statement ten times, in turn, a transaction each
        answers = []
        for n in range(10):
            for engine, statement in zip(engines, statements, strict=True):
                with engine.begin() as connection:
                    answers.append(connection.execute(statement, {"n": n}).scalar_one())
        # Then every run answers (before, the sixth run of the second statement met "prepared statement
        # _pg3_0 already exists" on a server connection where the first engine's had been prepared)
        assert answers == [v for n in range(10) for v in (0, n + 1)]
        # And the server sees each connection named for its host and process
        with engines[0].connect() as connection:
            name = connection.execute(sa.text("SELECT current_setting('application_name')")).scalar_one()
        assert name.startswith("detq ") and " pid " in name
    finally:
        for engine in engines:
            engine.dispose()


def test_a_job_runs_all_done_through_pgbouncer(
    pgbouncer: ThrowawayPgBouncer, postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    # Given a deployment whose ledger is reached through PgBouncer (migrated directly, as `detq db upgrade`
    # must be: its lock is held across transactions), and a job of many small batches
    migrate(postgres_url)
    deployment = Deployment(
        tmp_path / "data",
        database_url=pgbouncer.url_for(postgres_url),
        broker_url=redis_url,
        extra={"DETQ_BATCH_SIZE": "2"},
    )
    images = tmp_path / "images"
    write_dataset(images, 40, seed=5)
    # When two pool processes run it, each statement many times over the pooler's two server connections
    with running_worker(deployment, concurrency=2):
        status = deployment.run_json("enqueue", str(images), "--wait", "--timeout", "240", codes=(0,))
    # Then every image is done: none failed on a statement prepared on another client's connection
    assert (status["total"], status["done"], status["failed"]) == (40, 40, 0), pgbouncer.log()[-2000:]


def test_a_server_past_max_connections_is_named_full_with_what_to_do(tmp_path: Path) -> None:
    # Given a PostgreSQL server whose every connection slot is taken
    server = ThrowawayPostgres({"max_connections": "3", "superuser_reserved_connections": "0"})
    server.start()
    held: list[sa.Connection] = []
    admin = sa.create_engine(server.url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        held = [admin.connect() for _ in range(3)]
        deployment = Deployment(tmp_path / "data", database_url=server.url)
        # When a detq command opens the ledger
        refused = deployment.run("status", codes=(1,))
    finally:
        for connection in held:
            connection.close()
        admin.dispose()
        server.remove()
    # Then it says, in one line, that the server is full (not unreachable) and what to change
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("detq status: the database at postgresql") and "takes no more connections" in line
    assert "too many clients already" in line and "max_connections" in line and "PgBouncer" in line


def test_a_worker_node_keeps_one_connection_a_pool_process_and_two_of_its_own(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    # Given a node of two pool processes that has run a job of many batches, beating twice a second
    # (so that its heartbeats meet its batches' transactions: each such meeting left one connection more
    # kept, two a process)
    migrate(postgres_url)
    often = {"DETQ_BATCH_SIZE": "2", "DETQ_WORKER_TIMEOUT": "3"}
    deployment = Deployment(tmp_path / "data", database_url=postgres_url, broker_url=redis_url, extra=often)
    images = tmp_path / "images"
    write_dataset(images, 400, seed=6)
    with running_worker(deployment, concurrency=2) as worker:
        status = deployment.run_json("enqueue", str(images), "--wait", "--timeout", "240")
        # When the server is asked who holds its connections, each named for its host and process
        database = sa.engine.make_url(postgres_url).database
        admin = make_engine(postgres_url)
        try:
            with admin.connect() as connection:
                rows = connection.execute(
                    sa.text(
                        "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = :db"
                        " AND pid <> pg_backend_pid() GROUP BY application_name"
                    ),
                    {"db": database},
                ).all()
        finally:
            admin.dispose()
    assert status["done"] == 400
    held = {str(name).rsplit(" pid ", 1)[-1]: count for name, count in rows}
    # Then the node holds two (its heartbeat's and its reconciler's) and each pool process one
    node = str(worker.proc.pid)
    assert held.pop(node) <= 2, rows
    assert sorted(held.values()) == [1, 1], rows
