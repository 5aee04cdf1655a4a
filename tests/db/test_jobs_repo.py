"""Tests of db.jobs_repo over SQLite and PostgreSQL: what a worker reads of a job, when a job starts,
delete_job, whose detections go with it also while a worker writes some (they have no foreign key), and an
enqueue closed while its producer records a chunk."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory
from db.images_repo import NewImage, finalise_results, insert_images
from db.jobs_repo import (
    JobModel,
    close_enqueue,
    close_stale_enqueue,
    delete_job,
    job_model,
    lock_open_enqueue,
    mark_started,
    touch_enqueue,
)
from db.models import Batch, Detection, Image, Job, as_utc, utcnow
from tests.ledger_support import done_results, migrate, pending_job

Factory = sessionmaker[Session]


def _count(factory: Factory, model: type[Detection] | type[Image] | type[Batch]) -> int:
    with factory() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def _in_thread(work: Callable[[], int | None]) -> tuple[threading.Thread, threading.Event, list[object]]:
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


def _waits_for(holder: Session, work: Callable[[], int | None]) -> list[object]:
    """Run work in a thread while holder's transaction is open: it must wait (row locks on PostgreSQL, the
    write lock on SQLite) until holder commits; then its result (or error)."""
    thread, finished, outcome = _in_thread(work)
    try:
        assert not finished.wait(0.5), "it did not wait for the open transaction"
        holder.commit()
    finally:
        holder.close()
    thread.join(timeout=30)
    return outcome


def test_delete_job_removes_its_images_and_detections_and_no_other_jobs(factory: Factory) -> None:
    # Given two jobs with finished images and their detections
    gone, model_id, gone_ids = pending_job(factory, 3, "a")
    kept, _, kept_ids = pending_job(factory, 2, "b")
    with factory() as session, session.begin():
        finalise_results(session, gone, model_id, done_results(gone_ids), worker="w", device="cpu")
        finalise_results(session, kept, model_id, done_results(kept_ids), worker="w", device="cpu")
    # When the first is deleted
    with factory() as session, session.begin():
        assert delete_job(session, gone)
    # Then its images and detections are gone, the other job's are all there
    with factory() as session:
        left = session.scalars(select(Detection.image_id).order_by(Detection.image_id, Detection.rank)).all()
        images = session.scalars(select(Image.id).order_by(Image.id)).all()
    assert sorted(set(left)) == kept_ids and len(left) == 6
    assert images == kept_ids
    with factory() as session, session.begin():
        assert not delete_job(session, gone)


def test_a_delete_while_a_worker_writes_results_leaves_no_detections(factory: Factory) -> None:
    # Given a worker that has written results for two images of a job and not committed yet
    job_id, model_id, image_ids = pending_job(factory, 4, "c")
    writer = factory()
    writer.begin()
    written = finalise_results(
        writer, job_id, model_id, done_results(image_ids[:2]), worker="w", device="cpu"
    )
    assert written == set(image_ids[:2])

    # When the job is deleted meanwhile
    def delete() -> int:
        with factory() as session, session.begin():
            return int(delete_job(session, job_id))

    # Then the delete waits for the worker (its row locks on PostgreSQL, the write lock on SQLite)
    assert _waits_for(writer, delete) == [1]
    # And no detection of the job outlives it, though the worker committed after the delete began
    assert _count(factory, Detection) == 0
    assert _count(factory, Image) == 0


def test_job_model_reads_the_roots_the_model_and_the_pool_of_a_job(factory: Factory) -> None:
    job_id, model_id, _ = pending_job(factory, 1, "m")
    with factory() as session:
        assert job_model(session, job_id) == JobModel(["/d"], model_id, "c" * 64, "/m.pt", "cpu")
        assert job_model(session, job_id + 1000) is None


def test_the_first_results_start_the_job_and_later_ones_leave_started_at_alone(factory: Factory) -> None:
    # Given a job whose first image has a result
    job_id, model_id, image_ids = pending_job(factory, 2, "s")
    with factory() as session, session.begin():
        finalise_results(session, job_id, model_id, done_results(image_ids[:1]), worker="w", device="cpu")
    with factory() as session:
        started = session.get_one(Job, job_id).started_at
    assert started is not None
    # When the second one's result is written later
    with factory() as session, session.begin():
        finalise_results(session, job_id, model_id, done_results(image_ids[1:]), worker="w", device="cpu")
    # Then the job still started when its first results came
    with factory() as session:
        assert session.get_one(Job, job_id).started_at == started


def test_the_first_claim_starts_the_job_and_a_later_mark_or_result_leaves_it(factory: Factory) -> None:
    # Given a job whose first image a process claimed a minute ago
    job_id, model_id, image_ids = pending_job(factory, 2, "m")
    first = utcnow() - timedelta(minutes=1)
    with factory() as session, session.begin():
        mark_started(session, job_id, first)
    # When another process's first claim marks it again, and results are written
    with factory() as session, session.begin():
        mark_started(session, job_id, utcnow())
    with factory() as session, session.begin():
        finalise_results(session, job_id, model_id, done_results(image_ids), worker="w", device="cpu")
    # Then the job started at its first claim
    with factory() as session:
        started = session.get_one(Job, job_id).started_at
    assert started is not None and as_utc(started) == first


def _chunk(name: str, count: int) -> list[NewImage]:
    return [NewImage(path=f"/d/{name}{i}.jpg", size_bytes=1, mtime=1.0) for i in range(count)]


def test_a_close_waits_for_the_chunk_a_producer_records_and_counts_it(factory: Factory) -> None:
    # Given a producer recording a second chunk of its job, not committed yet
    job_id, _, _ = pending_job(factory, 2, "e")
    producer = factory()
    producer.begin()
    assert lock_open_enqueue(producer, job_id)
    insert_images(producer, job_id, _chunk("f", 3))

    # When a reconciler closes the job's enqueue meanwhile (it took the producer for a dead one)
    def close() -> int:
        with factory() as session, session.begin():
            return close_enqueue(session, job_id, "gone", utcnow())

    # Then the close waits for the chunk (a row lock on PostgreSQL, the write lock on SQLite), and counts
    # it: the job's total is every image it has, none left outside it
    assert _waits_for(producer, close) == [5]
    with factory() as session:
        total = session.get_one(Job, job_id).total
    assert total == 5 == _count(factory, Image)


def test_a_chunk_after_a_close_finds_the_job_closed(factory: Factory) -> None:
    # Given a job whose enqueue was closed (its producer taken for dead, or `detq cancel`)
    job_id, _, _ = pending_job(factory, 2, "g")
    with factory() as session, session.begin():
        assert close_enqueue(session, job_id, "gone", utcnow()) == 2
    # When its producer comes to record its next chunk, it is told to stop
    with factory() as session, session.begin():
        assert not lock_open_enqueue(session, job_id)


def test_a_stale_enqueue_is_closed_only_while_it_is_still_stale(factory: Factory) -> None:
    # Given a job whose producer beat just now
    job_id, _, _ = pending_job(factory, 3, "h")
    now = utcnow()
    with factory() as session, session.begin():
        assert touch_enqueue(session, job_id, now)
    # When a reconciler that found it stale earlier closes it: nothing is done
    with factory() as session, session.begin():
        assert close_stale_enqueue(session, job_id, now - timedelta(seconds=30), "gone", now) is None
    with factory() as session:
        assert not session.get_one(Job, job_id).enqueued_complete
    # While once its producer is silent for longer than the timeout, it is closed with its images
    later = now + timedelta(seconds=31)
    with factory() as session, session.begin():
        assert close_stale_enqueue(session, job_id, later - timedelta(seconds=30), "gone", later) == 3
    with factory() as session:
        job = session.get_one(Job, job_id)
    assert job.enqueued_complete and job.closed_reason == "gone" and job.total == 3


def test_workers_finishing_batches_pass_a_chunk_being_recorded(postgres_url: str) -> None:
    # Given a PostgreSQL job whose producer records a chunk, not committed yet (its FOR KEY SHARE lock)
    migrate(postgres_url)
    engine = make_engine(postgres_url)
    sessions = make_session_factory(engine)
    job_id, model_id, image_ids = pending_job(sessions, 2, "k")
    producer = sessions()
    producer.begin()
    try:
        assert lock_open_enqueue(producer, job_id)
        insert_images(producer, job_id, _chunk("l", 3))

        # When a worker writes the results of the job's first images meanwhile
        def finish() -> int:
            with sessions() as session, session.begin():
                done = finalise_results(
                    session, job_id, model_id, done_results(image_ids), worker="w", device="cpu"
                )
            return len(done)

        thread, written, outcome = _in_thread(finish)
        # Then it commits without waiting for the producer (its job row lock, FOR NO KEY UPDATE, passes)
        assert written.wait(10), "the worker's results waited for the producer's chunk"
        thread.join()
        assert outcome == [2]
        producer.commit()
    finally:
        producer.close()
        engine.dispose()
