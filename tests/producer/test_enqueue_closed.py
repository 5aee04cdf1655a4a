"""An enqueue whose job is closed under it (a reconciler that took its producer for dead, `detq cancel`)
records nothing more: the job's total is every image it has."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db.enqueue_repo import PRODUCER_GONE_REASON, close_enqueue
from db.jobs_repo import cancel_job
from db.models import Image, Job, utcnow
from detq.celery_app import make_celery_app
from detq.settings import Settings
from detq.vocabulary import JobPool
from producer.enqueue import INSERT_CHUNK, EnqueueError, EnqueueResult, enqueue_folders

MODEL = Path(__file__).resolve().parents[2] / "worker" / "assets" / "demo_detector.pt"


def test_a_job_closed_mid_enqueue_gets_no_chunk_after_the_close(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    # Given a folder of two and a half chunks of files, whose job is closed (by a reconciler that took
    # its producer for a dead one) as soon as its first chunk is recorded and sent
    def reconciler(session: Session, job_id: int) -> None:
        close_enqueue(session, job_id, PRODUCER_GONE_REASON, utcnow())

    with pytest.raises(EnqueueError) as closed:
        _enqueue_closed_at_first_chunk(factory, tmp_path, INSERT_CHUNK * 5 // 2, reconciler)
    # Then the producer stops there: the job holds the first chunk's images and its total says so
    with factory() as session:
        job = session.scalars(select(Job)).one()
        images = session.scalar(select(func.count()).select_from(Image))
    assert images == INSERT_CHUNK == job.total
    # And says so: why, what it holds, and how to queue the rest
    assert str(closed.value) == (
        f'job {job.id} was closed while it was being enqueued: "{PRODUCER_GONE_REASON}"; its images are the'
        f" {INSERT_CHUNK} files recorded before; enqueue the folders again with --only-new for the rest"
    )
    assert job.enqueued_complete and job.closed_reason == PRODUCER_GONE_REASON


def _enqueue_closed_at_first_chunk(
    factory: sessionmaker[Session], tmp_path: Path, files: int, close: Callable[[Session, int], object]
) -> EnqueueResult:
    """Enqueue a folder of files, the job closed by `close` once its first chunk is recorded and sent."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for n in range(files):
        (folder / f"{n:05d}.jpg").write_bytes(b"\xff\xd8 not decoded by enqueue")
    app = make_celery_app(Settings(_env_file=None, data_dir=tmp_path / "data"))
    closes = iter([close])

    def close_once(images: int, batches: int) -> None:
        for closing in closes:
            with factory() as session, session.begin():
                closing(session, session.scalars(select(Job.id)).one())

    try:
        return enqueue_folders(
            factory,
            app,
            roots=[folder],
            model_path=MODEL,
            pool=JobPool.CPU,
            batch_size=8,
            on_progress=close_once,
        )
    finally:
        app.close()


def test_a_producer_closed_as_gone_after_its_last_chunk_takes_the_reason_back(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    # Given a reconciler that takes the producer for a dead one (a stall past DETQ_WORKER_TIMEOUT) once
    # every file is recorded, before the producer marks its enqueue finished
    def reconciler(session: Session, job_id: int) -> None:
        close_enqueue(session, job_id, PRODUCER_GONE_REASON, utcnow())

    result = _enqueue_closed_at_first_chunk(factory, tmp_path, 20, reconciler)
    # Then the enqueue ends well, and the job does not say it was interrupted: it holds every file
    with factory() as session:
        job = session.scalars(select(Job)).one()
    assert (result.total, job.total, job.enqueued_complete, job.closed_reason) == (20, 20, True, None)


def test_a_job_cancelled_after_its_last_chunk_is_said_to_be(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    def cancel(session: Session, job_id: int) -> None:
        cancel_job(session, job_id, utcnow())

    with pytest.raises(EnqueueError) as closed:
        _enqueue_closed_at_first_chunk(factory, tmp_path, 20, cancel)
    with factory() as session:
        job = session.scalars(select(Job)).one()
    assert str(closed.value) == (
        f'job {job.id} was closed while it was being enqueued: "cancelled", after all its 20 files were'
        " recorded"
    )
    assert (job.total, job.closed_reason) == (20, "cancelled")
