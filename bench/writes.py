"""Detection writes per second through the worker's own write (finalise_results), on PostgreSQL and SQLite."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.deployments import fresh_postgres
from db.engine import make_engine, make_session_factory
from db.images_repo import DetectionRow, ImageResult, NewImage, finalise_results, insert_images
from db.jobs_repo import create_job, get_or_create_model
from db.migrate import upgrade
from detq.vocabulary import ImageStatus


def _boxes(count: int) -> tuple[DetectionRow, ...]:
    return tuple(
        DetectionRow(
            label_id=i % 80, label=f"class{i % 80}", score=0.9 - i / 1000, x1=i, y1=i, x2=i + 5.5, y2=i + 6.25
        )
        for i in range(count)
    )


def detections_per_s(url: str, batches: int = 30, batch_size: int = 8, boxes: int = 300) -> float:
    """Batches of batch_size images of `boxes` detections each, one transaction per batch, as a worker."""
    engine = make_engine(url)
    upgrade(engine)
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        model = get_or_create_model(session, sha256="b" * 64, path="/bench", size_bytes=1, meta={})
        job = create_job(session, model_id=model.id, roots=["/bench"], pool="cpu", batch_size=batch_size)
        new = [NewImage(path=f"/bench/{i}.jpg", size_bytes=1, mtime=1.0) for i in range(batches * batch_size)]
        ids = insert_images(session, job.id, new)
        model_id, job_id = model.id, job.id
    detections = _boxes(boxes)
    began = time.perf_counter()
    for start in range(0, len(ids), batch_size):
        results = [
            ImageResult(image_id=i, status=ImageStatus.DONE, width=1280, height=960, detections=detections)
            for i in ids[start : start + batch_size]
        ]
        with sessions() as session, session.begin():
            finalise_results(session, job_id, model_id, results, worker="bench", device="cpu")
    elapsed = time.perf_counter() - began
    engine.dispose()
    return len(ids) * boxes / elapsed


def postgres_detections_per_s() -> float:
    with fresh_postgres() as url:
        return detections_per_s(url)


def sqlite_detections_per_s() -> float:
    with tempfile.TemporaryDirectory() as folder:
        return detections_per_s(f"sqlite:///{Path(folder) / 'ledger.db'}")
