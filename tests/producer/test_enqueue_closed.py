"""An enqueue whose job is closed under it (a reconciler that took its producer for dead, `detq cancel`)
records nothing more: the job's total is every image it has."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db.jobs_repo import close_enqueue
from db.models import Image, Job, utcnow
from detq.celery_app import make_celery_app
from detq.settings import Settings
from detq.vocabulary import Pool
from producer.enqueue import INSERT_CHUNK, EnqueueError, enqueue_folders

MODEL = Path(__file__).resolve().parents[2] / "worker" / "assets" / "demo_detector.pt"


def test_a_job_closed_mid_enqueue_gets_no_chunk_after_the_close(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    # Given a folder of two and a half chunks of files
    folder = tmp_path / "imgs"
    folder.mkdir()
    for n in range(INSERT_CHUNK * 5 // 2):
        (folder / f"{n:05d}.jpg").write_bytes(b"\xff\xd8 not decoded by enqueue")
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    app = make_celery_app(settings)

    def close_after_the_first_chunk(images: int, batches: int) -> None:
        with factory() as session, session.begin():
            job_id = session.scalars(select(Job.id)).one()
            close_enqueue(session, job_id, "enqueue interrupted (its producer stopped)", utcnow())

    # When the job is closed as soon as its first chunk is recorded and sent
    try:
        with pytest.raises(EnqueueError) as closed:
            enqueue_folders(
                factory,
                app,
                roots=[folder],
                model_path=MODEL,
                pool=Pool.CPU,
                batch_size=8,
                on_progress=close_after_the_first_chunk,
            )
    finally:
        app.close()
    # Then the producer stops there: the job holds the first chunk's images and its total says so
    with factory() as session:
        job = session.scalars(select(Job)).one()
        images = session.scalar(select(func.count()).select_from(Image))
    assert images == INSERT_CHUNK == job.total
    # And says so: why, what it holds, and how to queue the rest
    assert str(closed.value) == (
        f'job {job.id} was closed while it was being enqueued: "enqueue interrupted (its producer'
        f' stopped)"; its images are the {INSERT_CHUNK} files recorded before; enqueue the folders again'
        " with --only-new for the rest"
    )
    assert job.enqueued_complete and job.closed_reason == "enqueue interrupted (its producer stopped)"
