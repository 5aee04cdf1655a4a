"""Machines whose clocks are off (libfaketime): what they stamp for other machines to judge, a producer's
enqueue, a lease, a worker's heartbeats and claims, is on the database server's clock."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

from db.engine import make_engine, make_session_factory
from db.models import Batch, Image, Job, Lease, WorkerRecord, as_utc
from demo.shapes import write_dataset
from detq.settings import BUNDLED_MODEL
from dispatch.leadership import Leadership
from tests.integration.harness import DETQ, WRAPPED_DETQ, Deployment, faked_clock, running_worker

pytestmark = pytest.mark.integration

# A process that takes a lease and prints when it thinks it is (its clock), then exits holding it.
_HOLD_LEASE = """
import sys
from datetime import UTC, datetime
from db.engine import make_engine, make_session_factory
from dispatch.leadership import Leadership
sessions = make_session_factory(make_engine(sys.argv[1]))
assert Leadership(sessions, ttl_s=float(sys.argv[2]), owner="skewed", name="probe").check()
print(datetime.now(UTC).isoformat())
"""


def _server_now(url: str) -> datetime:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            now = conn.scalar(select(func.now()))
    finally:
        engine.dispose()
    assert isinstance(now, datetime)
    return as_utc(now)


def test_a_producer_a_minute_behind_stamps_its_enqueue_by_the_databases_clock(
    scaled_out: Deployment, postgres_url: str, tmp_path: Path
) -> None:
    # Given a producer machine whose clock is 60 s behind the database server's (the reconciler on
    # another machine closed such a producer's live enqueue as a dead one's: 10,000 of 100,000 files)
    deployment = scaled_out
    deployment.model = BUNDLED_MODEL
    images = tmp_path / "images"
    write_dataset(images, 4, seed=5)
    # When it enqueues a folder
    done = subprocess.run(
        [*DETQ, "enqueue", str(images), "--json"],
        env=deployment.env() | faked_clock("-60s"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    server_now = _server_now(postgres_url)
    engine = make_engine(postgres_url)
    try:
        with make_session_factory(engine)() as session:
            job = session.scalars(select(Job)).one()
            batch_made = as_utc(session.scalars(select(Batch.created_at)).first())
    finally:
        engine.dispose()
    # Then what it stamps for itself carries its skewed clock (the check that faketime took) ...
    assert 55 < (server_now - batch_made).total_seconds() < 90
    # ... while the stamp that says its producer is alive is the server's, as the reconciler's judgement,
    # and so are the job's own times
    for stamp in (job.enqueue_seen_at, job.created_at, job.enqueued_at):
        assert stamp is not None and 0 <= (server_now - as_utc(stamp)).total_seconds() < 30
    # And `detq status` on a machine with the right clock times the job by them (it read 61 s old)
    assert deployment.run_json("status", str(job.id))["elapsed_s"] < 30


def test_a_lease_taken_by_a_machine_a_minute_behind_is_not_taken_over_early(
    postgres_url: str, tmp_path: Path
) -> None:
    # Given a lease of 20 s taken by a process whose clock is 60 s behind
    from tests.ledger_support import migrate

    migrate(postgres_url)
    done = subprocess.run(
        [sys.executable, "-c", _HOLD_LEASE, postgres_url, "20"],
        env=dict(os.environ) | faked_clock("-60s"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    its_clock = datetime.fromisoformat(done.stdout.strip())
    assert 55 < (datetime.now(UTC) - its_clock).total_seconds() < 90  # faketime took
    engine = make_engine(postgres_url)
    try:
        sessions = make_session_factory(engine)
        with sessions() as session:
            expires = as_utc(session.scalars(select(Lease.expires_at)).one())
        # Then it holds the lease for 20 s by the server's clock, not until 40 s ago
        assert 10 < (expires - _server_now(postgres_url)).total_seconds() <= 20
        # And a standby on a right clock cannot take it over meanwhile
        assert not Leadership(sessions, ttl_s=20, owner="standby", name="probe").check()
    finally:
        engine.dispose()


def test_a_worker_a_minute_behind_stamps_what_it_writes_by_the_databases_clock(
    scaled_out: Deployment, postgres_url: str, tmp_path: Path
) -> None:
    # Given a worker on a machine whose clock is 60 s behind the database server's, where other machines
    # judge its heartbeats and claims (such a worker showed `stale 60s ago` in `detq workers` while it ran
    # batches, and was closed as lost)
    deployment = scaled_out
    images = tmp_path / "images"
    write_dataset(images, 8, seed=7)
    with running_worker(deployment, concurrency=2, command=WRAPPED_DETQ, env=faked_clock("-60s")) as worker:
        # When it runs a job
        done = deployment.run_json("enqueue", str(images), "--wait", "--timeout", "120")
        fleet = deployment.run_json("workers")
        said = worker.log()
        server_now = _server_now(postgres_url)
        engine = make_engine(postgres_url)
        try:
            with make_session_factory(engine)() as session:
                seen = [as_utc(t) for t in session.scalars(select(WorkerRecord.last_seen_at))]
                claimed = [as_utc(t) for t in session.scalars(select(Image.claimed_at)) if t is not None]
                finished = [as_utc(t) for t in session.scalars(select(Image.finished_at)) if t is not None]
        finally:
            engine.dispose()
    # Then it started, saying how far off its clock is, and did the job
    assert "detq worker: this machine's clock is 60." in said and "corrected to the server's" in said
    assert done["done"] == 8
    # And every time it wrote is the server's (within the test's few seconds), none a minute early
    assert len(seen) == 3 and len(finished) == 8
    for stamp in [*seen, *claimed, *finished]:
        assert 0 <= (server_now - stamp).total_seconds() < 30
    assert [w["state"] for w in fleet] == ["alive"] * 3
