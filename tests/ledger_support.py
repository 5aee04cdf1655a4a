"""Test helpers for the ledger: migrate a database by URL, read its revision, record the SQL sent, make a job
of pending images and results with boxes for them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine
from db.images_repo import DetectionRow, ImageResult, NewImage, insert_images
from db.jobs_repo import create_job, get_or_create_model
from db.migrate import current_revision, upgrade
from detq.vocabulary import ImageStatus


def migrate(url: str) -> None:
    """Upgrade the database at url to the newest schema."""
    engine = make_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()


def revision_of(url: str) -> str | None:
    """The schema revision of the database at url."""
    engine = make_engine(url)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


@contextmanager
def sql_sent(engine: Engine) -> Iterator[list[str]]:
    """The SQL the engine sends while the block runs, statement by statement."""
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def pending_job(factory: sessionmaker[Session], images: int, name: str) -> tuple[int, int, list[int]]:
    """A job of `images` pending images named /d/<name><i>.jpg: (job id, model id, image ids)."""
    with factory() as session, session.begin():
        model = get_or_create_model(session, sha256="c" * 64, path="/m.pt", size_bytes=1, meta={})
        job = create_job(session, model_id=model.id, roots=["/d"], pool="cpu", batch_size=4)
        new = [NewImage(path=f"/d/{name}{i}.jpg", size_bytes=1, mtime=1.0) for i in range(images)]
        return job.id, model.id, insert_images(session, job.id, new)


def done_results(image_ids: list[int], boxes: int = 3) -> list[ImageResult]:
    """A done result with `boxes` identical boxes for each image."""
    box = DetectionRow(label_id=2, label="dog", score=0.7, x1=1, y1=2, x2=3, y2=4)
    return [ImageResult(image_id=i, status=ImageStatus.DONE, detections=(box,) * boxes) for i in image_ids]


def in_thread(work: Callable[[], int | None]) -> tuple[threading.Thread, threading.Event, list[object]]:
    """Run work in a thread: (the thread, set once it returned, [its result or error])."""
    finished, outcome = threading.Event(), []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as error:  # noqa: B036 - reported to the main thread by the caller
            outcome.append(error)
        finished.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, finished, outcome


def waits_for(holder: Session, work: Callable[[], int | None]) -> list[object]:
    """Run work in a thread while holder's transaction is open: it must wait (row locks on PostgreSQL, the
    write lock on SQLite) until holder commits; then its result (or error)."""
    thread, finished, outcome = in_thread(work)
    try:
        assert not finished.wait(0.5), "it did not wait for the open transaction"
        holder.commit()
    finally:
        holder.close()
    thread.join(timeout=30)
    return outcome
