"""Tests of db.job_counts_repo over SQLite and PostgreSQL: a job's counts, and a progress poll's read of
the job, its model and its counts in one statement."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from db.images_repo import ImageResult, finalise_results
from db.job_counts_repo import job_counts, job_snapshot, run_activity
from db.models import Image
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


def test_a_runs_activity_is_what_finished_since_it_began_and_the_span_it_was_processed_in(
    factory: Factory,
) -> None:
    # Given a job of four images: one finished before the run began, three in it (claimed at 0 s and
    # 10 s of it, or before it by a previous run, finished by 20 s)
    job_id, model_id, ids = pending_job(factory, 4, "r")
    began = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    with factory() as session, session.begin():
        earlier = done_results(ids[:1], boxes=1)
        finalise_results(
            session, job_id, model_id, earlier, worker="w", device="cpu", now=began - timedelta(hours=1)
        )
        claims = {ids[1]: began - timedelta(minutes=5), ids[2]: began, ids[3]: began + timedelta(seconds=10)}
        for image_id, at in claims.items():
            session.execute(update(Image).where(Image.id == image_id).values(claimed_at=at))
        finalise_results(
            session,
            job_id,
            model_id,
            done_results(ids[1:3], boxes=1),
            worker="w",
            device="cpu",
            now=began + timedelta(seconds=15),
        )
        failed = ImageResult(image_id=ids[3], status=ImageStatus.FAILED, reason="cannot read file")
        finalise_results(
            session, job_id, model_id, [failed], worker="w", device="cpu", now=began + timedelta(seconds=20)
        )
    # When the run's activity is read
    with factory() as session:
        activity = run_activity(session, [job_id], began)
        nothing = run_activity(session, [], began)
    # Then it counts the three it finished, over 20 s from its start (an older claim counts from it)
    assert (activity.done, activity.failed, activity.rejected) == (2, 1, 0)
    assert activity.processing_s == 20.0
    assert (nothing.finished, nothing.processing_s) == (0, None)
