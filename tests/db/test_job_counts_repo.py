"""Tests of db.job_counts_repo over SQLite and PostgreSQL: a job's counters, kept with every write that
moves its images, and a progress poll's read of the job, its model and its counts."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from db.images_repo import ImageResult, NewImage, finalise_results, insert_batched_images, insert_images
from db.job_counts_repo import JobCounts, job_counts, job_snapshot, run_activity
from db.jobs_repo import cancel_job, write_cancelled_rows
from db.models import Detection, Image, Job, status_as_read, utcnow
from detq.vocabulary import ImageStatus
from tests.ledger_support import done_results, pending_job, sql_sent

Factory = sessionmaker[Session]


def _scanned(session: Session, job_id: int, *, as_read: bool = True) -> JobCounts:
    """The job's counts as the rows say: its images by status (as read: a cancelled job's pending rows
    are cancelled; or as written), its detections (what the counters keep)."""
    status = status_as_read() if as_read else Image.status
    rows = session.execute(
        select(status, func.count())
        .join(Job, Job.id == Image.job_id)
        .where(Image.job_id == job_id)
        .group_by(status)
    ).tuples()
    by_status = {str(status): int(count) for status, count in rows}
    boxes = session.scalar(
        select(func.count())
        .select_from(Detection)
        .join(Image, Detection.image_id == Image.id)
        .where(Image.job_id == job_id)
    )
    return JobCounts(
        total=sum(by_status.values()),
        pending=by_status.get("pending", 0),
        done=by_status.get("done", 0),
        failed=by_status.get("failed", 0),
        rejected=by_status.get("rejected", 0),
        cancelled=by_status.get("cancelled", 0),
        detections=boxes or 0,
    )


def test_the_counters_say_what_the_rows_say_after_every_kind_of_write(factory: Factory) -> None:
    # Given a job of five images recorded, two more refused at the scan, and three in a bulk write
    job_id, model_id, image_ids = pending_job(factory, 5, "t")
    with factory() as session, session.begin():
        insert_images(
            session, job_id, [NewImage(f"/d/r{i}.jpg", 1, 1.0, 0, rejected="empty file") for i in (1, 2)]
        )
        more = insert_batched_images(
            session, job_id, [NewImage(f"/d/b{i}.jpg", 1, 1.0, 0, batch_id=None) for i in range(3)]
        )
    assert more == {}
    seen = []
    with factory() as session:
        seen.append((job_counts(session, job_id), _scanned(session, job_id)))
    # When two are done with 4 boxes each, one fails, one is rejected by the worker
    with factory() as session, session.begin():
        finalise_results(
            session, job_id, model_id, done_results(image_ids[:2], boxes=4), worker="w", device="cpu"
        )
        finalise_results(
            session,
            job_id,
            model_id,
            [
                ImageResult(image_id=image_ids[2], status=ImageStatus.FAILED, reason="unreadable"),
                ImageResult(image_id=image_ids[3], status=ImageStatus.REJECTED, reason="too large"),
            ],
            worker="w",
            device="cpu",
        )
    # And the first batch's results are written a second time (a redelivery), which changes nothing
    with factory() as session, session.begin():
        again = finalise_results(
            session, job_id, model_id, done_results(image_ids[:2], boxes=4), worker="w", device="cpu"
        )
    assert again == set()
    with factory() as session:
        seen.append((job_counts(session, job_id), _scanned(session, job_id)))
    # And the job is cancelled (its four pending images end cancelled)
    with factory() as session, session.begin():
        assert cancel_job(session, job_id, utcnow()) == 4
    with factory() as session:
        seen.append((job_counts(session, job_id), _scanned(session, job_id)))
        snapshot = job_snapshot(session, job_id)
        left_pending = _scanned(session, job_id, as_read=False).pending
    # And the reconciler writes the rows the cancel left
    with factory() as session, session.begin():
        written = write_cancelled_rows(session)
    with factory() as session:
        seen.append((job_counts(session, job_id), _scanned(session, job_id, as_read=False)))
    # Then after each, the counters were what the rows say: as read, and once written, as written
    for counted, scanned in seen:
        assert counted == scanned
    assert (left_pending, written) == (4, 4)
    assert seen[-1][0] == JobCounts(
        total=10, pending=0, done=2, failed=1, rejected=3, cancelled=4, detections=8
    )
    assert snapshot is not None and snapshot.counts == seen[-1][0]


def test_job_snapshot_reads_a_poll_in_two_statements_whatever_the_jobs_size(factory: Factory) -> None:
    # Given a job with two of its three images done, and a job with no images
    job_id, model_id, image_ids = pending_job(factory, 3, "s")
    empty, _, _ = pending_job(factory, 0, "e")
    with factory() as session, session.begin():
        finalise_results(
            session, job_id, model_id, done_results(image_ids[:2], boxes=4), worker="w", device="cpu"
        )
        fail = ImageResult(image_id=image_ids[2], status=ImageStatus.FAILED, reason="unreadable")
        finalise_results(session, job_id, model_id, [fail], worker="w", device="cpu")
    # When a progress poll reads it
    with factory() as session:
        with sql_sent(session.get_bind().engine) as sent:
            found = job_snapshot(session, job_id)
        none = job_snapshot(session, empty)
        missing = job_snapshot(session, job_id + 1000)
    # Then the job with its counters and model came in one statement, what its producer recorded in a
    # second: no statement reads its images or detections
    statements = [sql for sql in sent if not sql.startswith("BEGIN")]  # SQLite's BEGIN IMMEDIATE (db.engine)
    assert len(statements) == 2, statements
    assert not any(re.search(r"\b(FROM|JOIN)\s+(images|detections)\b", sql) for sql in statements), statements
    assert found is not None and none is not None
    assert found.job.id == job_id and found.model_sha256 == "c" * 64
    assert (found.counts.total, found.counts.done, found.counts.failed, found.counts.pending) == (3, 2, 1, 0)
    assert found.counts.detections == 8
    with factory() as session:
        assert found.counts == job_counts(session, job_id)
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
