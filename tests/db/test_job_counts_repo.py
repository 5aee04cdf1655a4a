"""Tests of db.job_counts_repo over SQLite and PostgreSQL: a job's counts, and a progress poll's read of
the job, its model and its counts in one statement."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from db.images_repo import ImageResult, finalise_results
from db.job_counts_repo import job_counts, job_snapshot
from detq.vocabulary import ImageStatus
from tests.ledger_support import done_results, pending_job, sql_sent

Factory = sessionmaker[Session]


def test_job_counts_can_leave_the_detections_uncounted(factory: Factory) -> None:
    job_id, model_id, image_ids = pending_job(factory, 3, "n")
    with factory() as session, session.begin():
        finalise_results(
            session, job_id, model_id, done_results(image_ids[:2], boxes=4), worker="w", device="cpu"
        )
    with factory() as session:
        full = job_counts(session, job_id)
        quick = job_counts(session, job_id, detections=False)
    assert (full.done, full.pending, full.detections) == (2, 1, 8)
    assert (quick.done, quick.pending, quick.detections) == (2, 1, 0)


def test_job_snapshot_reads_a_poll_in_one_statement(factory: Factory) -> None:
    # Given a job with two of its three images done, and a job with no images
    job_id, model_id, image_ids = pending_job(factory, 3, "s")
    empty, _, _ = pending_job(factory, 0, "e")
    with factory() as session, session.begin():
        finalise_results(
            session, job_id, model_id, done_results(image_ids[:2], boxes=4), worker="w", device="cpu"
        )
        fail = ImageResult(image_id=image_ids[2], status=ImageStatus.FAILED, reason="unreadable")
        finalise_results(session, job_id, model_id, [fail], worker="w", device="cpu")
    # When a progress poll reads it (detections left out)
    with factory() as session:
        with sql_sent(session.get_bind().engine) as sent:
            quick = job_snapshot(session, job_id, detections=False)
        full = job_snapshot(session, job_id)
        none = job_snapshot(session, empty)
        missing = job_snapshot(session, job_id + 1000)
    # Then the job, its model and its counts came in one statement, the same as job_counts says
    statements = [sql for sql in sent if not sql.startswith("BEGIN")]  # SQLite's BEGIN IMMEDIATE (db.engine)
    assert len(statements) == 1, statements
    assert quick is not None and full is not None and none is not None
    assert quick.job.id == job_id and quick.model_sha256 == "c" * 64
    assert (quick.counts.total, quick.counts.done, quick.counts.failed, quick.counts.pending) == (3, 2, 1, 0)
    assert quick.counts.detections == 0 and full.counts.detections == 8
    with factory() as session:
        assert full.counts == job_counts(session, job_id)
    # And a job with no images reads zeros, a job that does not exist None
    assert (none.counts.total, none.counts.pending, none.counts.detections) == (0, 0, 0)
    assert missing is None
