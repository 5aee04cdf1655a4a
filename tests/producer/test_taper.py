"""A job's last batches taper for the live pool processes of its queue, so they finish together."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Batch, utcnow
from db.workers_repo import ROLE_NODE, ROLE_PROCESS, WorkerIdentity, close_worker, register_worker
from detq.celery_app import make_celery_app
from detq.settings import Settings
from detq.vocabulary import JobPool
from producer.enqueue import enqueue_folders
from producer.taper import tapered_sizes

MODEL = Path(__file__).resolve().parents[2] / "worker" / "assets" / "demo_detector.pt"


def test_the_last_batches_shrink_toward_an_eighth_of_the_batch_size() -> None:
    # 40 images, batches of 8, two processes: full batches until 2 x 2 x 8 remain, then remainder / 4
    assert tapered_sizes(40, 8, 2) == [8, 8, 6, 5, 4, 3, 2, 1, 1, 1, 1]
    # The floor is an eighth of the batch size
    assert tapered_sizes(100, 32, 2)[-3:] == [4, 4, 4]


@pytest.mark.parametrize("count", [1, 7, 64, 241, 2000])
@pytest.mark.parametrize(("batch_size", "processes"), [(1, 4), (8, 2), (16, 2), (32, 16)])
def test_tapered_sizes_cover_every_image_once_never_above_the_batch_size_and_never_grow(
    count: int, batch_size: int, processes: int
) -> None:
    sizes = tapered_sizes(count, batch_size, processes)
    assert sum(sizes) == count
    assert all(1 <= size <= batch_size for size in sizes)
    assert sizes == sorted(sizes, reverse=True)
    # Only the tail is smaller than a full batch: at most 2 x processes x batch_size images
    assert sum(size for size in sizes if size < batch_size) <= 2 * processes * batch_size


@pytest.mark.parametrize("processes", [0, 1])
def test_one_process_or_none_known_gets_full_batches(processes: int) -> None:
    assert tapered_sizes(20, 8, processes) == [8, 8, 4]
    assert tapered_sizes(0, 8, processes) == []


def _process(session: Session, node: str, pool: str, pid: int) -> int:
    identity = WorkerIdentity(role=ROLE_PROCESS, node=node, host="h", host_key="h", pid=pid, pool=pool)
    return register_worker(session, identity, utcnow())


def test_enqueue_tapers_for_the_live_processes_of_the_jobs_queue(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    # Given 40 image files, and a fleet of two live cpu pool processes, one gpu process, and a stopped
    # cpu process
    folder = tmp_path / "imgs"
    folder.mkdir()
    for n in range(40):
        (folder / f"{n:02d}.jpg").write_bytes(b"\xff\xd8 not decoded by enqueue")
    with factory() as session, session.begin():
        node = WorkerIdentity(role=ROLE_NODE, node="cpu@h", host="h", host_key="h", pid=1, pool="cpu")
        register_worker(session, node, utcnow())
        _process(session, "cpu@h", "cpu", 2)
        _process(session, "cpu@h", "cpu", 3)
        _process(session, "gpu@h", "gpu", 4)
        close_worker(session, [_process(session, "cpu@h", "cpu", 5)], utcnow())
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    app = make_celery_app(settings)

    def batch_sizes(pool: JobPool, worker_timeout_s: float | None) -> list[int]:
        job = enqueue_folders(
            factory,
            app,
            roots=[folder],
            model_path=MODEL,
            pool=pool,
            batch_size=8,
            worker_timeout_s=worker_timeout_s,
        ).job_id
        with factory() as session:
            return list(session.scalars(select(Batch.size).where(Batch.job_id == job).order_by(Batch.id)))

    # When the folder is enqueued for the cpu pool, the gpu pool and any, knowing the live fleet
    # Then the cpu job tapers for its two live processes, the gpu job's lone process gets full batches,
    # and a job any pool takes tapers for all three
    assert batch_sizes(JobPool.CPU, 60) == tapered_sizes(40, 8, 2) == [8, 8, 6, 5, 4, 3, 2, 1, 1, 1, 1]
    assert batch_sizes(JobPool.GPU, 60) == [8] * 5
    assert batch_sizes(JobPool.ANY, 60) == tapered_sizes(40, 8, 3)
    # And a caller that does not ask about the fleet gets full batches
    assert batch_sizes(JobPool.CPU, None) == [8] * 5
    app.close()
