"""Tests of db.jobs_repo over SQLite and PostgreSQL: what a worker reads of a job, when a job starts,
and delete_job, whose detections go with it also while a worker writes some (they have no foreign key)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db.claims_repo import claimable_images
from db.export_repo import images_with_boxes, iter_ledger
from db.history_repo import latest_image_ids, past_outcomes
from db.images_repo import finalise_results
from db.job_counts_repo import job_counts
from db.jobs_repo import (
    JobSpec,
    cancel_job,
    create_job,
    delete_job,
    job_spec,
    mark_started,
    write_cancelled_rows,
)
from db.models import Batch, Detection, Image, Job, as_utc, utcnow
from detq.inference_settings import DEFAULTS, InferenceSettings
from tests.ledger_support import done_results, pending_job, sql_sent, waits_for

Factory = sessionmaker[Session]


def _count(factory: Factory, model: type[Detection] | type[Image] | type[Batch]) -> int:
    with factory() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


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
    assert waits_for(writer, delete) == [1]
    # And no detection of the job outlives it, though the worker committed after the delete began
    assert _count(factory, Detection) == 0
    assert _count(factory, Image) == 0


def test_job_model_reads_the_roots_the_model_the_pool_and_the_settings_of_a_job(factory: Factory) -> None:
    job_id, model_id, _ = pending_job(factory, 1, "m")
    with factory() as session:
        assert job_spec(session, job_id) == JobSpec(["/d"], model_id, "c" * 64, "/m.pt", "cpu", DEFAULTS)
        assert job_spec(session, job_id + 1000) is None
    # And a job's own settings come back as it recorded them; a job of before 0008 has none
    asked = InferenceSettings(score_threshold=0.6, classes=("dog", "3"), input_size=(480, 640))
    with factory() as session, session.begin():
        other = create_job(session, model_id=model_id, roots=["/e"], pool="gpu", batch_size=4, settings=asked)
        older = create_job(session, model_id=model_id, roots=["/e"], pool="gpu", batch_size=4)
        older.settings = None
    with factory() as session:
        assert job_spec(session, other.id) == JobSpec(["/e"], model_id, "c" * 64, "/m.pt", "gpu", asked)
        found = job_spec(session, older.id)
        assert found is not None and found.settings is None


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


def _as_read(factory: Factory, job_id: int) -> dict[str, list[str]]:
    """The job's images by status as each reader takes them: an export's, an incremental scan's, a
    folder's results', a worker's claim; and the rows as written."""
    with factory() as session:
        ids = session.scalars(select(Image.id).where(Image.job_id == job_id).order_by(Image.id)).all()
        paths = session.scalars(select(Image.path).where(Image.job_id == job_id).order_by(Image.id)).all()
        job = session.get_one(Job, job_id)
        past = past_outcomes(session, job.model_id, str(job.settings_key), list(paths))
        latest = [image.id for image, _ in images_with_boxes(session, latest_image_ids(session, [job_id]))]
        seen = claimable_images(
            session, job_id, list(ids), me=0, now=utcnow(), seen_since=utcnow(), still_running=lambda _: True
        )
        return {
            "export": [image.status for image, _ in iter_ledger(session, job_id)],
            "incremental": [outcome.status for path in paths for outcome in past[path]],
            "results": [image.status for image, _ in images_with_boxes(session, latest)],
            "claimable": [str(image.id) for image in seen.free],
            "rows": list(
                session.scalars(select(Image.status).where(Image.job_id == job_id).order_by(Image.id))
            ),
        }


def test_a_cancel_writes_the_job_alone_and_its_pending_images_read_cancelled_until_the_rows_are_written(
    factory: Factory,
) -> None:
    # Given a job of five images, one done
    job_id, model_id, image_ids = pending_job(factory, 5, "x")
    with factory() as session, session.begin():
        finalise_results(session, job_id, model_id, done_results(image_ids[:1]), worker="w", device="cpu")
    # When it is cancelled
    with sql_sent(factory.kw["bind"]) as statements, factory() as session, session.begin():
        assert cancel_job(session, job_id, utcnow()) == 4
    # Then no image row was written: the job row alone, whatever the job's size
    writes = [sql.split()[1].lower() for sql in statements if sql.lstrip().upper().startswith("UPDATE")]
    assert set(writes) == {"jobs"}
    # And every reader takes its four pending images as cancelled; no claim starts them
    cancelled = ["done"] + ["cancelled"] * 4
    assert _as_read(factory, job_id) == {
        "export": cancelled,
        "incremental": cancelled,
        "results": cancelled,
        "claimable": [],
        "rows": ["done"] + ["pending"] * 4,
    }
    # And the reconciler's writes bring the rows to what they read, a chunk at a time
    written = []
    for _ in range(3):
        with factory() as session, session.begin():
            written.append(write_cancelled_rows(session, limit=3))
    assert written == [3, 1, 0]
    assert _as_read(factory, job_id)["rows"] == cancelled
    with factory() as session:
        reasons = session.scalars(select(Image.reason).where(Image.job_id == job_id).order_by(Image.id))
        finished = session.scalars(select(Image.finished_at).where(Image.status == "cancelled")).all()
        job = session.get_one(Job, job_id)
        assert list(reasons) == [None] + ["cancelled"] * 4
        assert job.finished_at is not None and {as_utc(f) for f in finished} == {as_utc(job.finished_at)}


def test_a_batch_written_after_a_cancel_writes_nothing_and_one_being_written_is_counted_by_it(
    factory: Factory,
) -> None:
    # Given a job of four images and a worker that has written results for one, not committed yet
    job_id, model_id, image_ids = pending_job(factory, 4, "y")
    writer = factory()
    writer.begin()
    assert finalise_results(writer, job_id, model_id, done_results(image_ids[:1]), worker="w", device="cpu")

    # When the job is cancelled meanwhile
    def cancel() -> int:
        with factory() as session, session.begin():
            return cancel_job(session, job_id, utcnow())

    # Then the cancel waits for the worker's write, and counts its image done, the three others cancelled
    assert waits_for(writer, cancel) == [3]
    # And a batch written after the cancel writes nothing, though its images read pending in their rows
    with factory() as session, session.begin():
        late = finalise_results(
            session, job_id, model_id, done_results(image_ids[1:]), worker="w", device="cpu"
        )
    assert late == set()
    with factory() as session:
        counts = job_counts(session, job_id)
        boxes = session.scalar(select(func.count()).select_from(Detection))
    assert (counts.done, counts.cancelled, counts.pending, counts.detections, boxes) == (1, 3, 0, 3, 3)
    assert _as_read(factory, job_id)["export"] == ["done"] + ["cancelled"] * 3
