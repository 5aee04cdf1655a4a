"""detq end to end: warm `detq worker` processes, one job, timed from `detq enqueue` to its last image."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from db.models import Image, as_utc
from detq.settings import Settings
from tests.integration.harness import Deployment, running_worker

POSTGRES_ADMIN_URL = os.environ.get(
    "DETQ_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("DETQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")


@contextmanager
def fresh_postgres() -> Iterator[str]:
    """A new, empty PostgreSQL database, dropped afterwards."""
    name = f"detq_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.engine.make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _flush_redis() -> None:
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()


def warm_up_count(processes: int, batch_size: int) -> int:
    """Photos in the warm-up job: three batches a process, so that every process runs a full batch.

    A job's last batches taper (producer/taper.py: full ones while more than 2 x processes x batch size
    remain), so the first `processes` batches of 3 x processes x batch size photos are full. Of two batches
    a process, the 32 photos came as 8, 6, 5, 4, 3, 2, 1, ...: one process never ran 8 at once, and its
    first batch of 8 in the timed job grew its heap then (0.85 to 0.94 s against 0.52 to 0.66 s for the
    later ones).
    """
    return 3 * processes * batch_size


def warm_up_folder(photos: Sequence[Path], folder: Path, processes: int, batch_size: int = 8) -> Path:
    """A folder of links to the first photos (warm_up_count): a first job on them warms the workers as the
    ceiling's processes are warmed (bench.loops), and as the workers of a nightly run are by the nights
    before.

    On a fresh process the first large photos are slow: its heap grows to hold their float copies, and
    memory new to a process is faulted in at about 3 ms a MB on this virtual machine. A job of 32 12 MP
    photos ran 1.2 to 1.8x as fast on workers that had run one before (docs/benchmarks.md).
    """
    folder.mkdir(parents=True, exist_ok=True)
    for photo in photos[: warm_up_count(processes, batch_size)]:
        link = folder / photo.name
        if not link.exists():
            try:
                os.link(photo, link)
            except OSError:  # another file system: a copy does as well
                shutil.copyfile(photo, link)
    return folder


@dataclass(frozen=True)
class JobRun:
    """One timed detq job: from the launch of `detq enqueue` to its first claimed image and to its last
    finished one (ledger times)."""

    images: int
    start_up_s: float  # the command's start-up, its rows and sends, and the first batch's delivery
    seconds: float

    @property
    def rate(self) -> float:
        """Images/s, the enqueue command's start-up included: the bench's headline figure."""
        return self.images / self.seconds

    @property
    def rate_after_first_claim(self) -> float:
        """Images/s from the first claim on: the pace of the workers, the part a long job is made of."""
        return self.images / (self.seconds - self.start_up_s)


def first_claim(url: str, job_id: int) -> datetime:
    """When the first of the job's images was claimed by a pool process (the ledger's claimed_at)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.select(sa.func.min(Image.claimed_at)).where(Image.job_id == job_id))
            claimed = found.scalar_one()
    finally:
        engine.dispose()
    if claimed is None:
        raise AssertionError(f"job {job_id} has no claimed image")
    return as_utc(claimed)


def database_url(deployment: Deployment) -> str:
    """The ledger's URL of this deployment (its embedded SQLite file where it names no database)."""
    settings = Settings(_env_file=None, data_dir=deployment.data_dir, database_url=deployment.database_url)
    return settings.resolved_database_url


def run_job(deployment: Deployment, photos: Path, processes: int, warm_up: Path | None = None) -> JobRun:
    """One job over the folder, timed from `detq enqueue` to the ledger's last finished image; after an
    untimed job over warm_up where given."""
    with running_worker(deployment, concurrency=processes):
        if warm_up is not None:
            deployment.run_json("enqueue", str(warm_up), "--pool", "cpu", "--wait", "--timeout", "3600")
        began = time.time()
        status = deployment.run_json("enqueue", str(photos), "--pool", "cpu", "--wait", "--timeout", "3600")
    assert status["done"] == status["total"], status
    return job_run(deployment, status, began)


def job_run(deployment: Deployment, status: dict[str, Any], began: float) -> JobRun:
    """The times of a finished job from its `--json` status and the ledger, its enqueue launched at
    `began` (epoch seconds): its first claim at began + start_up_s."""
    finished = datetime.fromisoformat(status["finished_at"]).timestamp()
    claimed = first_claim(database_url(deployment), int(status["job_id"])).timestamp()
    return JobRun(images=int(status["total"]), start_up_s=claimed - began, seconds=finished - began)


def detq_embedded(
    model: Path,
    photos: Path,
    base: Path,
    processes: int,
    extra: dict[str, str],
    warm_up: Path | None = None,
) -> JobRun:
    """The default deployment: SQLite and the filesystem broker under one data folder."""
    data = base / f"embedded-{time.monotonic_ns()}"
    return run_job(Deployment(data_dir=data, model=model, extra=extra), photos, processes, warm_up)


@contextmanager
def redis_postgres(
    base: Path, name: str, model: Path, extra: dict[str, str] | None = None
) -> Iterator[Deployment]:
    """A deployment on an emptied Redis database and a fresh, migrated PostgreSQL one."""
    _flush_redis()
    with fresh_postgres() as url:
        deployment = Deployment(
            data_dir=base / f"{name}-{time.monotonic_ns()}",
            database_url=url,
            broker_url=REDIS_URL,
            model=model,
            extra=extra or {},
        )
        deployment.run("db", "upgrade")
        yield deployment
    _flush_redis()


def detq_redis_postgres(
    model: Path,
    photos: Path,
    base: Path,
    processes: int,
    extra: dict[str, str],
    warm_up: Path | None = None,
) -> JobRun:
    """The scaled-out deployment: Redis broker, PostgreSQL ledger."""
    with redis_postgres(base, "redis-pg", model, extra) as deployment:
        return run_job(deployment, photos, processes, warm_up)
