"""Tests of the repository API over SQLite and PostgreSQL: idempotent results, counts, ledger reads, races."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_session_factory
from db.export_repo import iter_ledger, label_names
from db.images_repo import (
    DetectionRow,
    ImageResult,
    NewImage,
    finalise_results,
    insert_images,
)
from db.job_counts_repo import job_counts
from db.jobs_repo import (
    create_job,
    finish_enqueue,
    get_job,
    get_or_create_model,
    latest_job_id,
    list_jobs,
)
from db.models import Detection, Image, Job, ModelRecord
from detq.vocabulary import ImageStatus
from tests.ledger_support import migrate, sql_sent

Factory = sessionmaker[Session]


@dataclass(frozen=True)
class Fixture:
    """A model, a job and its images' ids."""

    model_id: int
    job_id: int
    image_ids: list[int]


@pytest.fixture()
def engine(migrated_url: str) -> Iterator[sa.Engine]:
    """An engine on a freshly migrated database."""
    engine = make_engine(migrated_url)
    yield engine
    engine.dispose()


@pytest.fixture()
def factory(engine: sa.Engine) -> Factory:
    return make_session_factory(engine)


def make_job(factory: Factory, n_images: int, *, sha256: str = "f" * 64, prefix: str = "img") -> Fixture:
    """A job of n_images pending images."""
    with factory() as s, s.begin():
        model = get_or_create_model(s, sha256=sha256, path="/m/model.pt", size_bytes=10, meta={"k": 1})
        job = create_job(s, model_id=model.id, roots=["/data"], pool="cpu", batch_size=4)
        images = [
            NewImage(path=f"/data/{prefix}{i:04d}.jpg", size_bytes=100 + i, mtime=1.5)
            for i in range(n_images)
        ]
        return Fixture(model.id, job.id, insert_images(s, job.id, images))


@pytest.fixture()
def job(factory: Factory) -> Fixture:
    return make_job(factory, 4)


def boxes(n: int, label_id: int = 1) -> tuple[DetectionRow, ...]:
    return tuple(
        DetectionRow(
            label_id=label_id, label=f"class{label_id}", score=0.9 - i / 100, x1=i, y1=i, x2=i + 5, y2=i + 6
        )
        for i in range(n)
    )


def done(image_id: int, n_boxes: int = 2, label_id: int = 1) -> ImageResult:
    return ImageResult(
        image_id=image_id,
        status=ImageStatus.DONE,
        width=640,
        height=480,
        detections=boxes(n_boxes, label_id),
        decode_ms=1.0,
        infer_ms=2.0,
    )


def record(factory: Factory, fx: Fixture, results: Sequence[ImageResult], worker: str = "w1") -> int:
    with factory() as s, s.begin():
        return len(finalise_results(s, fx.job_id, fx.model_id, results, worker=worker, device="cpu"))


def count(factory: Factory, model: type[Detection] | type[Image]) -> int:
    with factory() as s:
        return s.scalar(select(func.count()).select_from(model)) or 0


def snapshot(factory: Factory) -> tuple[list[Any], list[Any]]:
    """Every image and detection row, as plain tuples."""
    with factory() as s:
        images = [tuple(row) for row in s.execute(select(Image.__table__).order_by(Image.id))]
        detections = [
            tuple(row)
            for row in s.execute(
                select(Detection.__table__).order_by(Detection.image_id, Detection.model_id, Detection.rank)
            )
        ]
        return images, detections


def run_in_threads(*targets: Callable[[], object]) -> None:
    """Run targets in threads at once; re-raise the first error."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as error:  # noqa: B036 - re-raised in the main thread
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    if errors:
        raise errors[0]


def test_get_or_create_model_returns_the_same_row(factory: Factory) -> None:
    with factory() as s, s.begin():
        first = get_or_create_model(s, sha256="a" * 64, path="/m/a.pt", size_bytes=5, meta={"labels": ["x"]})
    with factory() as s, s.begin():
        again = get_or_create_model(s, sha256="a" * 64, path="/elsewhere/a.pt", size_bytes=5, meta={})
    assert again.id == first.id
    assert again.path == "/m/a.pt"
    assert again.meta == {"labels": ["x"]}
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(ModelRecord)) == 1


def test_get_or_create_model_is_race_safe(factory: Factory) -> None:
    barrier = threading.Barrier(2)
    ids: list[int] = []

    def register() -> None:
        with factory() as s, s.begin():
            barrier.wait(timeout=10)
            ids.append(get_or_create_model(s, sha256="b" * 64, path="/m/b.pt", size_bytes=5, meta={}).id)

    run_in_threads(register, register)
    assert len(ids) == 2 and ids[0] == ids[1]


def test_jobs_are_created_listed_and_found(factory: Factory) -> None:
    with factory() as s:
        assert latest_job_id(s) is None
        assert list_jobs(s) == []
    first, second = make_job(factory, 0), make_job(factory, 0)
    with factory() as s:
        assert latest_job_id(s) == second.job_id
        assert [j.id for j in list_jobs(s)] == [second.job_id, first.job_id]
        assert [j.id for j in list_jobs(s, limit=1)] == [second.job_id]
        found = get_job(s, first.job_id)
        assert found is not None
        assert (found.roots, found.pool, found.batch_size, found.total) == (["/data"], "cpu", 4, 0)
        assert not found.enqueued_complete and found.created_at is not None
        assert get_job(s, 10_000) is None


def test_insert_images_returns_ids_in_input_order(factory: Factory) -> None:
    # Given paths deliberately not in sorted order
    fx = make_job(factory, 0)
    paths = [f"/data/{name}.{i}.jpg" for i, name in enumerate(["z", "a", "m", "b", "y"] * 30)]
    with factory() as s, s.begin():
        ids = insert_images(
            s, fx.job_id, [NewImage(path=p, size_bytes=1, mtime=0.0, root_index=2) for p in paths]
        )
    # Then the i-th id is the row of the i-th path
    with factory() as s:
        by_id = {row.id: row for row in s.scalars(sa.select(Image).where(Image.id.in_(ids)))}
    assert [by_id[i].path for i in ids] == paths
    assert len(set(ids)) == len(paths)
    assert {(row.status, row.root_index) for row in by_id.values()} == {("pending", 2)}
    with factory() as s, s.begin():
        assert insert_images(s, fx.job_id, []) == []


def test_finalise_results_finalises_images_and_writes_detections(factory: Factory, job: Fixture) -> None:
    first, second, third, _ = job.image_ids
    results = [
        done(first, n_boxes=3),
        ImageResult(image_id=second, status=ImageStatus.FAILED, reason="decode error"),
        ImageResult(image_id=third, status=ImageStatus.REJECTED, reason="too large"),
    ]
    assert record(factory, job, results, worker="host:1") == 3
    with factory() as s:
        image = s.get_one(Image, first)
        # attempts counts starts (claims, db/claims_repo.py); recording a result adds none
        assert (image.status, image.width, image.height, image.attempts) == ("done", 640, 480, 0)
        assert (image.worker, image.device, image.decode_ms, image.infer_ms) == ("host:1", "cpu", 1.0, 2.0)
        assert image.finished_at is not None
        dets = s.scalars(select(Detection).where(Detection.image_id == first).order_by(Detection.rank)).all()
        assert [(d.rank, d.model_id, d.label, d.x2) for d in dets] == [
            (0, job.model_id, "class1", 5.0),
            (1, job.model_id, "class1", 6.0),
            (2, job.model_id, "class1", 7.0),
        ]
        failed = s.get_one(Image, second)
        assert (failed.status, failed.reason, failed.attempts) == ("failed", "decode error", 0)
        assert s.get_one(Image, third).status == "rejected"
        assert s.get_one(Job, job.job_id).started_at is not None
    assert count(factory, Detection) == 3


def test_recording_the_same_results_twice_changes_nothing(factory: Factory, job: Fixture) -> None:
    # Given a batch already recorded
    batch = [done(image_id) for image_id in job.image_ids[:3]]
    assert record(factory, job, batch) == 3
    before = snapshot(factory)
    # When the broker delivers it again
    assert record(factory, job, batch, worker="w2") == 0
    # Then no row changed and no detection was duplicated
    assert snapshot(factory) == before
    assert count(factory, Detection) == 6


def test_a_terminal_image_is_never_overwritten(factory: Factory, job: Fixture) -> None:
    # Given an image that failed
    image_id = job.image_ids[0]
    record(factory, job, [ImageResult(image_id=image_id, status=ImageStatus.FAILED, reason="oom")])
    # When a later delivery reports it done with detections
    assert record(factory, job, [done(image_id, n_boxes=4)]) == 0
    # Then it stays failed, without detections
    with factory() as s:
        image = s.get_one(Image, image_id)
        assert (image.status, image.reason, image.attempts, image.width) == ("failed", "oom", 0, None)
    assert count(factory, Detection) == 0


def test_finalise_results_ignores_images_of_other_jobs(factory: Factory, job: Fixture) -> None:
    other = make_job(factory, 1, prefix="other")
    assert record(factory, job, [done(other.image_ids[0])]) == 0
    with factory() as s:
        assert s.get_one(Image, other.image_ids[0]).status == "pending"


def test_finalise_results_refuses_pending_results(factory: Factory, job: Fixture) -> None:
    with pytest.raises(ValueError, match="terminal"):
        record(factory, job, [ImageResult(image_id=job.image_ids[0], status=ImageStatus.PENDING)])


def test_two_workers_racing_on_one_batch_write_one_set_of_detections(factory: Factory) -> None:
    # Given a batch that two workers received (a redelivery while the first was still running)
    fx = make_job(factory, 16)
    batch = [done(image_id, n_boxes=3) for image_id in fx.image_ids]
    barrier = threading.Barrier(2)
    finalised: list[int] = []

    def worker(name: str, results: list[ImageResult]) -> Callable[[], None]:
        def run() -> None:
            with factory() as s, s.begin():
                barrier.wait(timeout=10)
                finalised.append(
                    len(finalise_results(s, fx.job_id, fx.model_id, results, worker=name, device="cpu"))
                )

        return run

    # When both record it at the same moment, each in its own session, one in reverse order
    run_in_threads(worker("a", batch), worker("b", batch[::-1]))
    # Then the images were finalised once, by one of them, with one set of detections
    assert sorted(finalised) == [0, 16]
    assert count(factory, Detection) == 16 * 3
    with factory() as s:
        assert set(s.scalars(select(Image.worker))) in ({"a"}, {"b"})
        assert set(s.scalars(select(Image.attempts))) == {0}


def test_job_counts(factory: Factory, job: Fixture) -> None:
    first, second, third, _ = job.image_ids
    with factory() as s:
        counts = job_counts(s, job.job_id)
        assert (counts.total, counts.pending, counts.done, counts.detections) == (4, 4, 0, 0)
    record(
        factory,
        job,
        [
            done(first, n_boxes=2),
            done(second, n_boxes=5),
            ImageResult(image_id=third, status=ImageStatus.REJECTED, reason="tiny"),
        ],
    )
    make_job(factory, 3, prefix="other")  # another job's images are not counted
    with factory() as s:
        counts = job_counts(s, job.job_id)
    assert (counts.total, counts.pending, counts.done, counts.failed, counts.rejected) == (4, 1, 2, 0, 1)
    assert counts.detections == 7


def finished_at(factory: Factory, job_id: int) -> Any:
    with factory() as s:
        return s.get_one(Job, job_id).finished_at


def test_finished_at_is_set_only_when_enqueued_and_nothing_pending(factory: Factory, job: Fixture) -> None:
    first, second, third, fourth = job.image_ids
    # Given an enqueued job, some results are not enough
    with factory() as s, s.begin():
        finish_enqueue(s, job.job_id, total=4)
    record(factory, job, [done(first), done(second), done(third)])
    assert finished_at(factory, job.job_id) is None
    # When the last image is finalised, Then the job is finished
    record(factory, job, [done(fourth)])
    finished = finished_at(factory, job.job_id)
    assert finished is not None
    # And a redelivery does not move it
    record(factory, job, [done(fourth)])
    assert finished_at(factory, job.job_id) == finished
    with factory() as s:
        loaded = s.get_one(Job, job.job_id)
        assert (loaded.total, loaded.enqueued_complete) == (4, True)
        assert loaded.enqueued_at is not None


def test_job_finished_before_enqueue_completed_is_closed_by_finish_enqueue(
    factory: Factory, job: Fixture
) -> None:
    # Given workers that finalised every image while the producer was still enqueueing
    record(factory, job, [done(image_id) for image_id in job.image_ids])
    assert finished_at(factory, job.job_id) is None
    # When the producer marks the enqueue complete, Then the job is finished
    with factory() as s, s.begin():
        finish_enqueue(s, job.job_id, total=4)
    assert finished_at(factory, job.job_id) is not None


@contextmanager
def both_paused_before_the_completion_check(engine: sa.Engine) -> Iterator[None]:
    """Hold two transactions until both reach their first statement on the job row (a worker's counters,
    a producer's enqueue), every other write uncommitted; from there the job row's lock orders them, and
    the second's completion check comes after the first's commit.

    Only on PostgreSQL: on SQLite BEGIN IMMEDIATE already runs the two transactions one after the other, so
    the second could never reach this point while the first waits for it.
    """
    if engine.dialect.name != "postgresql":
        yield
        return
    barrier = threading.Barrier(2)
    paused: set[int] = set()

    def pause(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        touches_job = statement.lstrip().upper().startswith("UPDATE JOBS") or (
            "enqueued_complete" in statement and statement.lstrip().upper().startswith("SELECT")
        )
        if touches_job and id(conn) not in paused:
            paused.add(id(conn))
            barrier.wait(timeout=10)

    event.listen(engine, "before_cursor_execute", pause)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", pause)


def test_job_finishes_when_its_last_images_are_finalised_concurrently(
    factory: Factory, engine: sa.Engine
) -> None:
    # Given an enqueued, started job (started_at set, so its update does not serialise the two below)
    fx = make_job(factory, 3)
    with factory() as s, s.begin():
        finish_enqueue(s, fx.job_id, total=3)
    record(factory, fx, [done(fx.image_ids[0])])

    def worker(image_id: int) -> Callable[[], int]:
        return lambda: record(factory, fx, [done(image_id)])

    # When two workers finalise its last two images, each checking completion before the other commits
    with both_paused_before_the_completion_check(engine):
        run_in_threads(worker(fx.image_ids[1]), worker(fx.image_ids[2]))
    # Then the one that checks second, after the first commits, still finishes the job
    assert finished_at(factory, fx.job_id) is not None


def test_job_finishes_when_enqueue_completes_as_the_last_result_lands(
    factory: Factory, engine: sa.Engine
) -> None:
    # Given a started job
    fx = make_job(factory, 3)
    record(factory, fx, [done(fx.image_ids[0])])

    def producer() -> None:
        with factory() as s, s.begin():
            finish_enqueue(s, fx.job_id, total=3)

    # When the producer completes the enqueue while a worker finalises the remaining images
    with both_paused_before_the_completion_check(engine):
        run_in_threads(producer, lambda: record(factory, fx, [done(i) for i in fx.image_ids[1:]]))
    # Then whichever checks second sees the other's work and finishes the job
    assert finished_at(factory, fx.job_id) is not None


def test_iter_ledger_returns_every_image_with_its_detections(factory: Factory, engine: sa.Engine) -> None:
    fx = make_job(factory, 5)
    make_job(factory, 2, prefix="other")
    # (each box labelled with its image's id, its x1 its rank: a box says whose it is and where it stands)
    first, fourth = fx.image_ids[0], fx.image_ids[3]
    record(factory, fx, [done(first, n_boxes=3, label_id=first), done(fourth, n_boxes=1, label_id=fourth)])
    with sql_sent(engine) as statements, factory() as s:
        ledger = [
            (image.id, [(d.label_id, d.x1) for d in dets]) for image, dets in iter_ledger(s, fx.job_id, 2)
        ]
    assert [image_id for image_id, _ in ledger] == fx.image_ids
    assert ledger[0][1] == [(fx.image_ids[0], 0), (fx.image_ids[0], 1), (fx.image_ids[0], 2)]
    assert ledger[3][1] == [(fx.image_ids[3], 0)]
    assert [dets for _, dets in ledger][1:3] == [[], []]
    # Two queries per chunk of 2 (and a last, short chunk) and one of the job, not one per image
    assert len([sql for sql in statements if sql.lstrip().upper().startswith("SELECT")]) == 7


def test_iter_ledger_streams_each_images_boxes_past_another_jobs_in_the_same_id_range(
    factory: Factory,
) -> None:
    # Given two jobs whose images were recorded turn about (their ids interleave), every image with boxes
    first, second = make_job(factory, 0), make_job(factory, 0, prefix="other")
    with factory() as s, s.begin():
        for n in range(6):
            for fx, prefix in ((first, "a"), (second, "b")):
                fx.image_ids.extend(insert_images(s, fx.job_id, [NewImage(f"/data/{prefix}{n}.jpg", 1, 1.0)]))
    # (each box labelled with its image's id, its x1 its rank)
    record(factory, first, [done(i, n_boxes=1 + k % 3, label_id=i) for k, i in enumerate(first.image_ids)])
    record(factory, second, [done(i, n_boxes=4, label_id=i) for i in second.image_ids])
    # When the first job is read in chunks of four, and read again but left after its third image
    with factory() as s:
        read = [
            (image.id, [(d.label_id, d.x1) for d in boxes])
            for image, boxes in iter_ledger(s, first.job_id, 4)
        ]
        stream = iter_ledger(s, first.job_id, 4)
        partial = [next(stream)[0].id for _ in range(3)]
        stream.close()  # (its streamed read closed with it)
        assert [image.id for image, _ in iter_ledger(s, second.job_id, 4, boxes=False)] == second.image_ids
    # Then each image came once, in id order, with exactly its own boxes by rank
    assert read == [(i, [(i, r) for r in range(1 + k % 3)]) for k, i in enumerate(first.image_ids)]
    assert partial == first.image_ids[:3]


def test_label_names(factory: Factory, job: Fixture) -> None:
    record(factory, job, [done(job.image_ids[0], label_id=3), done(job.image_ids[1], label_id=1)])
    other = make_job(factory, 1, prefix="other")
    record(factory, other, [done(other.image_ids[0], label_id=7)])
    with factory() as s:
        assert label_names(s, job.job_id) == {1: "class1", 3: "class3"}


def _record_disjoint_batches(url: str, fx: Fixture, image_ids: list[int], barrier: Any) -> None:
    """Child process: its own engine, then one read-then-write transaction per batch of two images."""
    engine = make_engine(url)
    try:
        factory = make_session_factory(engine)
        barrier.wait(timeout=30)
        for start in range(0, len(image_ids), 2):
            ids = image_ids[start : start + 2]
            with factory() as s, s.begin():
                # Read, then write: under a deferred BEGIN, SQLite fails this lock upgrade at once ("database
                # is locked", no busy wait) whenever another process committed in between.
                statuses = s.scalars(sa.select(Image.status).where(Image.id.in_(ids))).all()
                assert statuses == ["pending"] * len(ids)
                batch = [done(image_id, n_boxes=2) for image_id in ids]
                finalised = finalise_results(s, fx.job_id, fx.model_id, batch, worker="p", device="cpu")
                assert finalised == set(ids)
    finally:
        engine.dispose()


def test_processes_writing_one_sqlite_file_at_once_all_succeed(sqlite_url: str) -> None:
    # Given one SQLite file and three worker processes, each with its own engine and its own images
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    try:
        factory = make_session_factory(engine)
        fx = make_job(factory, 120)
        with factory() as s, s.begin():
            finish_enqueue(s, fx.job_id, total=120)
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(3)
        shares = [fx.image_ids[i::3] for i in range(3)]
        processes = [
            context.Process(target=_record_disjoint_batches, args=(sqlite_url, fx, share, barrier))
            for share in shares
        ]
        # When they all record results at once
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=60)
        # Then none failed ("database is locked" would exit non-zero) and every result landed
        assert [process.exitcode for process in processes] == [0, 0, 0]
        with factory() as s:
            counts = job_counts(s, fx.job_id)
            assert (counts.done, counts.pending, counts.detections) == (120, 0, 240)
            assert s.get_one(Job, fx.job_id).finished_at is not None
    finally:
        engine.dispose()
