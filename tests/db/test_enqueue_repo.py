"""An enqueue's life in the ledger: a close counts every chunk or keeps it out, a stale one is closed only
while still stale, workers pass a chunk being recorded, and a producer closed as gone takes that back."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory
from db.enqueue_repo import (
    PRODUCER_GONE_REASON,
    close_enqueue,
    close_stale_enqueue,
    lock_open_enqueue,
    take_back_producer_gone,
    touch_enqueue,
)
from db.images_repo import NewImage, finalise_results, insert_images
from db.jobs_repo import cancel_job
from db.models import Image, Job, utcnow
from tests.ledger_support import done_results, in_thread, migrate, pending_job, waits_for

Factory = sessionmaker[Session]


def _images(factory: Factory) -> int:
    with factory() as session:
        return session.scalar(select(func.count()).select_from(Image)) or 0


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
    assert waits_for(producer, close) == [5]
    with factory() as session:
        total = session.get_one(Job, job_id).total
    assert total == 5 == _images(factory)


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

        thread, written, outcome = in_thread(finish)
        # Then it commits without waiting for the producer (its job row lock, FOR NO KEY UPDATE, passes)
        assert written.wait(10), "the worker's results waited for the producer's chunk"
        thread.join()
        assert outcome == [2]
        producer.commit()
    finally:
        producer.close()
        engine.dispose()


def test_only_a_close_as_gone_is_taken_back(factory: Factory) -> None:
    gone, _, _ = pending_job(factory, 2, "m")
    cancelled, _, _ = pending_job(factory, 2, "n")
    with factory() as session, session.begin():
        close_enqueue(session, gone, PRODUCER_GONE_REASON, utcnow())
        cancel_job(session, cancelled, utcnow())
    with factory() as session, session.begin():
        assert take_back_producer_gone(session, gone)
        assert not take_back_producer_gone(session, cancelled)
        assert not take_back_producer_gone(session, 999_999)  # no such job
    with factory() as session:
        reasons = [session.get_one(Job, job_id).closed_reason for job_id in (gone, cancelled)]
    assert reasons == [None, "cancelled"]
