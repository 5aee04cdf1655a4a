"""Bulk writes on SQLite and PostgreSQL: ids taken up front, values read back as the ORM wrote them."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import cast

import sqlalchemy as sa
from sqlalchemy import Table, select
from sqlalchemy.orm import Session, sessionmaker

from db.batches_repo import create_batches
from db.bulk import insert_rows, next_ids
from db.engine import make_engine, make_session_factory
from db.images_repo import DETECTION_COLUMNS, NewImage, insert_batched_images
from db.jobs_repo import create_job, get_or_create_model
from db.models import Detection, Image
from tests.ledger_support import migrate

Factory = sessionmaker[Session]


def new_job(factory: Factory) -> tuple[int, int]:
    with factory() as s, s.begin():
        model = get_or_create_model(s, sha256="a" * 64, path="/m.pt", size_bytes=1, meta={})
        return create_job(s, model_id=model.id, roots=["/d"], pool="cpu", batch_size=4).id, model.id


def test_batched_images_get_the_ids_their_rows_were_written_with(factory: Factory) -> None:
    # Given a job with two batches of 3 and 2 files, and a refused file
    job_id, _ = new_job(factory)
    with factory() as s, s.begin():
        first, second = create_batches(s, job_id, [3, 2], datetime.now(UTC))
        images = [NewImage(f"/d/{i}.jpg", i, 1.5, 0, first) for i in range(3)]
        images += [NewImage(f"/d/{i}.jpg", i, 2.5, 0, second) for i in range(3, 5)]
        images.append(NewImage("/d/\\xff.jpg", 0, 0.0, 0, None, "file name is not valid UTF-8"))
        # When they are inserted in bulk
        ids = insert_batched_images(s, job_id, images)
    # Then each batch's ids, ascending, are those of its own rows, and the refused file is rejected
    with factory() as s:
        rows = {r.id: r for r in s.execute(select(Image)).scalars()}
    assert sorted(ids) == sorted([first, second])
    assert [rows[i].path for i in ids[first]] == ["/d/0.jpg", "/d/1.jpg", "/d/2.jpg"]
    assert [rows[i].path for i in ids[second]] == ["/d/3.jpg", "/d/4.jpg"]
    assert all(rows[i].batch_id == b and rows[i].status == "pending" for b in ids for i in ids[b])
    (refused,) = [r for r in rows.values() if r.batch_id is None]
    assert (refused.status, refused.reason) == ("rejected", "file name is not valid UTF-8")
    assert refused.finished_at is not None and refused.attempts == 0


def test_ids_taken_after_rows_are_written_follow_every_id_in_use(factory: Factory) -> None:
    # Given rows written with ids taken for them
    table = cast(Table, Image.__table__)
    job_id, _ = new_job(factory)
    with factory() as s, s.begin():
        insert_batched_images(s, job_id, [NewImage(f"/d/{i}.jpg", 1, 1.0, 0, None, "x") for i in range(3)])
    # When more ids are taken
    with factory() as s, s.begin():
        later = next_ids(s, table, 4)
        none = next_ids(s, table, 0)
    # Then they ascend, one by one, after every id in use
    with factory() as s:
        in_use = list(s.execute(select(Image.id)).scalars())
    assert len(in_use) == 3 and none == []
    assert later == list(range(later[0], later[0] + 4)) and later[0] > max(in_use)


def test_concurrent_transactions_take_disjoint_ids_on_postgresql(postgres_url: str) -> None:
    # Given two PostgreSQL transactions open at once (SQLite runs writers one after the other)
    migrate(postgres_url)
    engine = make_engine(postgres_url)
    factory = make_session_factory(engine)
    table = cast(Table, Image.__table__)
    try:
        with factory() as one, one.begin(), factory() as two, two.begin():
            # When each takes ids before either commits
            first, second = next_ids(one, table, 50), next_ids(two, table, 50)
    finally:
        engine.dispose()
    # Then no id is handed out twice
    assert len(set(first) | set(second)) == 100


def test_rows_beyond_one_statements_parameter_limit_are_all_written(factory: Factory) -> None:
    # Given more detection rows than SQLite takes parameters in one statement (32,766 / 10 columns)
    job_id, model_id = new_job(factory)
    with factory() as s, s.begin():
        (batch,) = create_batches(s, job_id, [1], datetime.now(UTC))
        image_id = insert_batched_images(s, job_id, [NewImage("/d/a.jpg", 1, 1.0, 0, batch)])[batch][0]
    rows = [(image_id, model_id, rank, 1, "car", 0.5, rank, 2.0, 3.0, 4.0) for rank in range(5000)]
    # When they are written in bulk
    with factory() as s, s.begin():
        insert_rows(s, cast(Table, Detection.__table__), DETECTION_COLUMNS, rows)
    # Then every row is there, values as written
    with factory() as s:
        found = s.execute(
            select(Detection.rank, Detection.x1, Detection.score).order_by(Detection.rank)
        ).all()
    assert [tuple(r) for r in found] == [(rank, float(rank), 0.5) for rank in range(5000)]


def test_datetimes_written_in_bulk_read_back_as_the_orm_writes_them(factory: Factory) -> None:
    # Given a refused image written in bulk at a known time, and the same through the ORM
    job_id, _ = new_job(factory)
    when = datetime(2026, 12, 1, 1, 2, 3, 456789, tzinfo=UTC)
    with factory() as s, s.begin():
        insert_rows(
            s,
            cast(Table, Image.__table__),
            ("job_id", "path", "size_bytes", "mtime", "root_index", "status", "finished_at", "attempts"),
            [(job_id, "/d/bulk.jpg", 1, 1.0, 0, "rejected", when, 0)],
        )
        s.add(
            Image(
                job_id=job_id, path="/d/orm.jpg", size_bytes=1, mtime=1.0, status="rejected", finished_at=when
            )
        )
    # Then both read back equal, and compare equal in SQL
    with factory() as s:
        stamps = dict(s.execute(select(Image.path, Image.finished_at)).tuples().all())
        same = s.scalar(select(sa.func.count()).where(Image.finished_at == when))
    assert stamps["/d/bulk.jpg"] == stamps["/d/orm.jpg"]
    assert same == 2


def test_values_written_in_bulk_read_back_exactly(factory: Factory) -> None:
    # Given detection rows whose values a text format would have to print and parse: doubles at full
    # precision, a float32 widened, a tiny and a huge number, an integer where a float goes, and labels
    # with a tab, a newline, a backslash, a quote and non-ASCII letters
    job_id, model_id = new_job(factory)
    with factory() as s, s.begin():
        (batch,) = create_batches(s, job_id, [1], datetime.now(UTC))
        image_id = insert_batched_images(s, job_id, [NewImage("/d/a.jpg", 1, 1.0, 0, batch)])[batch][0]
    floats = [0.1 + 0.2, float(struct.unpack("f", struct.pack("f", 523.8372))[0]), 5e-324, 1.7e308, 7]
    labels = ["a\tb", "line\nbreak", "back\\slash", 'qu"ote', "Straßenbahn é 車"]
    rows = [
        (image_id, model_id, rank, rank, label, value, value, -value, 2 * rank, 0.0)
        for rank, (label, value) in enumerate(zip(labels, floats, strict=True))
    ]
    # When they are written in bulk
    with factory() as s, s.begin():
        insert_rows(s, cast(Table, Detection.__table__), DETECTION_COLUMNS, rows)
    # Then each value reads back as it was written
    with factory() as s:
        found = s.execute(
            select(*(Detection.__table__.c[name] for name in DETECTION_COLUMNS)).order_by(Detection.rank)
        ).all()
    assert [tuple(r) for r in found] == rows
