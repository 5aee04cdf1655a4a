"""Tests of db.migrate: the migration builds exactly the models' schema, also when processes race on it,
and upgrades keep the rows."""

from __future__ import annotations

import fcntl
import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.orm import Session

from db.engine import make_engine, make_session_factory
from db.jobs_repo import get_or_create_model
from db.migrate import SchemaError, ensure_schema, head_revision, make_config, script_head, upgrade
from db.models import Base, utcnow
from detq.inference_settings import DEFAULT_KEY
from tests.ledger_support import migrate, revision_of

HEAD = "0009"
ROOT = Path(__file__).resolve().parents[2]


def schema_differences(url: str) -> list[Any]:
    """What autogenerate would change to make the database match db.models."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def _differences_of(url: str, table: str) -> list[Any]:
    """The schema differences (autogenerate's tuples) that concern one table."""

    def concerns(diff: Any) -> bool:
        if isinstance(diff, list):  # a column's modifications: (op, schema, table, column, ...) each
            return any(step[2] == table for step in diff)
        thing = diff[1]
        found = getattr(thing, "table", None)
        return getattr(found, "name", getattr(thing, "name", None)) == table

    return [diff for diff in schema_differences(url) if concerns(diff)]


def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_head_is_the_only_head_and_the_one_detq_checks_for() -> None:
    assert ScriptDirectory.from_config(make_config("sqlite://")).get_heads() == [HEAD]
    assert head_revision() == script_head() == HEAD


def test_opening_a_migrated_ledger_does_not_load_alembic_or_psycopg(tmp_path: Path) -> None:
    # Given a migrated SQLite ledger
    url = f"sqlite:///{tmp_path / 'detq.db'}"
    migrate(url)
    # When a fresh process opens it, checking its schema (what every command and worker start does)
    code = (
        "import sys; from db.ledger import open_ledger; from detq.settings import Settings; "
        f"open_ledger(Settings(_env_file=None, database_url={url!r})).close(); "
        "print(sorted(m for m in ('alembic', 'psycopg') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    # Then neither the migration tool nor the PostgreSQL driver was imported: start-up stays short
    assert done.stdout.strip() == "[]"


def test_upgrade_builds_exactly_the_models_schema(database_url: str) -> None:
    assert revision_of(database_url) is None
    migrate(database_url)
    assert revision_of(database_url) == HEAD
    assert schema_differences(database_url) == []


def test_upgrade_twice_is_a_no_op(database_url: str) -> None:
    migrate(database_url)
    migrate(database_url)
    assert revision_of(database_url) == HEAD
    assert table_names(database_url) == {
        "alembic_version",
        "models",
        "jobs",
        "images",
        "detections",
        "schedule_state",
        "scheduler_leases",
        "batches",
        "workers",
        "recorded_counts",
    }


def test_downgrade_through_alembic_command_then_upgrade_again(database_url: str) -> None:
    # Given a migrated database, When the Alembic command API downgrades it with only make_config's URL
    migrate(database_url)
    command.downgrade(make_config(database_url), "base")
    # Then every ledger table is gone, and upgrading rebuilds them
    assert table_names(database_url) == {"alembic_version"}
    migrate(database_url)
    assert schema_differences(database_url) == []


def test_make_config_keeps_percent_signs_in_urls() -> None:
    url = "postgresql+psycopg://detq:p%40ss%25word@db.example:5432/detq"
    assert make_config(url).get_main_option("sqlalchemy.url") == url


def test_bare_postgresql_url_is_accepted(postgres_url: str) -> None:
    bare = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    migrate(bare)
    assert revision_of(bare) == HEAD


def _upgrade_after_barrier(url: str, barrier: Any) -> None:
    barrier.wait(timeout=30)
    migrate(url)


def test_concurrent_upgrades_of_one_fresh_sqlite_file_from_three_processes(tmp_path: Path) -> None:
    # Given a database file that does not exist yet and three processes released at the same moment
    url = f"sqlite:///{tmp_path / 'fresh' / 'detq.db'}"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(3)
    processes = [context.Process(target=_upgrade_after_barrier, args=(url, barrier)) for _ in range(3)]
    # When each runs upgrade
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    # Then all succeed and the schema is migrated once, completely
    assert [process.exitcode for process in processes] == [0, 0, 0]
    assert revision_of(url) == HEAD
    assert schema_differences(url) == []


def test_concurrent_upgrades_of_one_fresh_postgresql_database(postgres_url: str) -> None:
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _upgrade_after_barrier(postgres_url, barrier)
        except BaseException as error:  # noqa: B036 - reported to the main thread below
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert revision_of(postgres_url) == HEAD
    assert schema_differences(postgres_url) == []


def test_sqlite_upgrade_waits_for_the_migration_file_lock(tmp_path: Path) -> None:
    # Given another process holding <file>.migrate.lock
    database = tmp_path / "detq.db"
    url = f"sqlite:///{database}"
    with open(f"{database}.migrate.lock", "a") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        # When upgrade starts, Then it waits and has not touched the database
        worker = threading.Thread(target=migrate, args=(url,))
        worker.start()
        worker.join(timeout=0.5)
        assert worker.is_alive()
        assert not database.exists()
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
    # And once the lock is released it completes
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert revision_of(url) == HEAD


def _detection_rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    """Every detection's values but a surrogate id, in key order."""
    columns = "image_id, model_id, rank, label_id, label, score, x1, y1, x2, y2"
    with engine.connect() as conn:
        query = f"SELECT {columns} FROM detections ORDER BY image_id, model_id, rank"
        return [tuple(row) for row in conn.execute(sa.text(query))]


# The columns jobs has had since 0001: a job written at an older revision than the models' names only these.
_JOBS_0001 = sa.table(
    "jobs",
    sa.column("id", sa.Integer),
    sa.column("model_id", sa.Integer),
    sa.column("roots", sa.JSON),
    sa.column("pool", sa.String),
    sa.column("batch_size", sa.Integer),
    sa.column("total", sa.Integer),
    sa.column("enqueued_complete", sa.Boolean),
    sa.column("created_at", sa.DateTime(timezone=True)),
)


def _job_at_any_revision(session: Session, model_id: int) -> int:
    """A job row written with the columns of revision 0001 (the model Job has columns added since)."""
    values = {"model_id": model_id, "roots": ["/d"], "pool": "cpu", "batch_size": 4, "total": 0}
    values |= {"enqueued_complete": False, "created_at": utcnow()}
    return int(session.execute(sa.insert(_JOBS_0001).values(values).returning(_JOBS_0001.c.id)).scalar_one())


def _ledger_with_detections(engine: sa.Engine, revision: str, boxes: int) -> None:
    """The ledger migrated to revision, with one finished image of `boxes` detections, written in SQL with
    the columns every revision has (today's repository functions also write what later ones added)."""
    upgrade(engine, revision)
    sessions = make_session_factory(engine)
    with sessions() as session, session.begin():
        model = get_or_create_model(session, sha256="a" * 64, path="/m.pt", size_bytes=1, meta={})
        job_id = _job_at_any_revision(session, model.id)
        image_id = session.execute(
            sa.text(
                "INSERT INTO images (job_id, root_index, path, size_bytes, mtime, width, height, status,"
                " attempts, finished_at) VALUES (:job, 0, '/d/a.jpg', 1, 1.0, 640, 480, 'done', 1, :now)"
                " RETURNING id"
            ),
            {"job": job_id, "now": utcnow()},
        ).scalar_one()
        for i in range(boxes):
            session.execute(
                sa.text(
                    "INSERT INTO detections (image_id, model_id, rank, label_id, label, score, x1, y1, x2,"
                    " y2)"
                    " VALUES (:image, :model, :rank, :rank, :label, :score, :rank, 2, 3 + :rank, 4)"
                ),
                {"image": image_id, "model": model.id, "rank": i, "label": f"c{i}", "score": 1 - i / 10},
            )


def test_0004_drops_the_detections_foreign_keys_and_keeps_their_rows(database_url: str) -> None:
    # Given a ledger at 0003 with a finished image and its detections
    engine = make_engine(database_url)
    try:
        _ledger_with_detections(engine, "0003", boxes=2)
        before = _detection_rows(engine)
        assert len(before) == 2
        assert len(sa.inspect(engine).get_foreign_keys("detections")) == 2
        # When it is upgraded to 0004
        upgrade(engine, "0004")
        # Then detections have no foreign key left and the rows are as they were
        assert sa.inspect(engine).get_foreign_keys("detections") == []
        assert _detection_rows(engine) == before
        # And a downgrade puts both keys back over the same rows
        command.downgrade(make_config(database_url), "0003")
        engine.dispose()
        keys = sa.inspect(engine).get_foreign_keys("detections")
        assert sorted(key["referred_table"] for key in keys) == ["images", "models"]
        assert _detection_rows(engine) == before
    finally:
        engine.dispose()


def test_0005_keys_detections_by_image_model_rank_and_keeps_their_rows(database_url: str) -> None:
    # Given a ledger at 0004 with a finished image and its three detections
    engine = make_engine(database_url)
    try:
        _ledger_with_detections(engine, "0004", boxes=3)
        before = _detection_rows(engine)
        assert len(before) == 3
        # When it is upgraded to 0005
        upgrade(engine, "0005")
        engine.dispose()
        # Then the rows are as they were, keyed by (image_id, model_id, rank) with no id, as the models say
        key = sa.inspect(engine).get_pk_constraint("detections")["constrained_columns"]
        columns = [c["name"] for c in sa.inspect(engine).get_columns("detections")]
        assert key == ["image_id", "model_id", "rank"]
        assert "id" not in columns
        assert _detection_rows(engine) == before
        assert _differences_of(database_url, "detections") == []  # later revisions change other tables
        # And a second box of the same rank of the same image and model is refused by the key
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO detections"
                    " (image_id, model_id, rank, label_id, label, score, x1, y1, x2, y2)"
                    " SELECT image_id, model_id, rank, 0, 'again', 0.1, 0, 0, 1, 1 FROM detections"
                    " WHERE rank = 1"
                )
            )
        # And a downgrade numbers the rows again under an id key, over the same values
        command.downgrade(make_config(database_url), "0004")
        engine.dispose()
        assert sa.inspect(engine).get_pk_constraint("detections")["constrained_columns"] == ["id"]
        with engine.connect() as conn:
            ids = conn.execute(sa.text("SELECT id FROM detections ORDER BY id")).scalars().all()
        assert len(set(ids)) == 3 and None not in ids
        assert _detection_rows(engine) == before
        # And the next row written there gets an id of its own
        _ledger_with_detections(engine, "0004", boxes=1)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(DISTINCT id) FROM detections")).scalar() == 4
    finally:
        engine.dispose()


def _image_rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        query = "SELECT id, job_id, path, status FROM images ORDER BY id"
        return [tuple(row) for row in conn.execute(sa.text(query))]


def _unique_and_indexes(engine: sa.Engine) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    inspector = sa.inspect(engine)
    uniques = {str(u["name"]): list(u["column_names"]) for u in inspector.get_unique_constraints("images")}
    indexes = {
        str(i["name"]): [str(c) for c in i["column_names"]]
        for i in inspector.get_indexes("images")
        if not i.get("duplicates_constraint")  # PostgreSQL lists a constraint's own index again
    }
    return uniques, indexes


def test_0006_makes_images_unique_by_path_then_job_and_keeps_their_rows(database_url: str) -> None:
    # Given a ledger at 0005 with an image
    engine = make_engine(database_url)
    try:
        _ledger_with_detections(engine, "0005", boxes=1)
        before = _image_rows(engine)
        assert len(before) == 1
        # When it is upgraded to 0006
        upgrade(engine, "0006")
        engine.dispose()
        # Then the rows are as they were; one unique key led by the path, and no separate index on path
        assert _image_rows(engine) == before
        uniques, indexes = _unique_and_indexes(engine)
        assert uniques == {"uq_images_path_job": ["path", "job_id"]}
        assert "ix_images_path" not in indexes
        assert _differences_of(database_url, "images") == []
        # And a job still cannot hold one path twice
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO images (job_id, root_index, path, size_bytes, mtime, status, attempts)"
                    " SELECT job_id, 0, path, 1, 1.0, 'pending', 0 FROM images"
                )
            )
        # And a downgrade puts the unique (job_id, path) and the index on path back over the same rows
        command.downgrade(make_config(database_url), "0005")
        engine.dispose()
        uniques, indexes = _unique_and_indexes(engine)
        assert uniques == {"uq_images_job_path": ["job_id", "path"]}
        assert indexes["ix_images_path"] == ["path"]
        assert _image_rows(engine) == before
    finally:
        engine.dispose()


def test_0007_gives_jobs_their_unreadable_folders_and_keeps_their_rows(database_url: str) -> None:
    # Given a ledger at 0006 with a job and its image
    engine = make_engine(database_url)
    try:
        _ledger_with_detections(engine, "0006", boxes=1)
        before = _image_rows(engine)
        # When it is upgraded to 0007
        upgrade(engine, "0007")
        engine.dispose()
        # Then the job has the two columns, empty, and the tables are as the models say
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT unreadable_count, unreadable_folders FROM jobs")).all()
        assert found == [(None, None)]
        assert _image_rows(engine) == before
        assert _differences_of(database_url, "jobs") == []
        # And a downgrade drops them, keeping the rows
        command.downgrade(make_config(database_url), "0006")
        engine.dispose()
        columns = {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
        assert not {"unreadable_count", "unreadable_folders"} & columns
        assert _image_rows(engine) == before
    finally:
        engine.dispose()


def test_a_ledger_migrated_by_a_newer_release_is_refused_in_one_line(database_url: str) -> None:
    # Given a ledger that a newer release has migrated past this detq's last revision
    migrate(database_url)
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '0099'"))
        # When this detq opens it, or is asked to upgrade it, Then it refuses with what to do, and the
        # ledger is left as it was (an older release once "upgraded" it, then failed in Alembic)
        for attempt in (ensure_schema, upgrade):
            with pytest.raises(SchemaError, match=rf"at 0099, newer than this detq knows \({HEAD}\)"):
                attempt(engine)
        assert revision_of(database_url) == "0099"
    finally:
        engine.dispose()


def test_an_existing_embedded_ledger_says_it_is_upgrading_and_a_new_one_does_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an embedded ledger at 0005, and a folder with none yet
    old, new = f"sqlite:///{tmp_path / 'old.db'}", f"sqlite:///{tmp_path / 'new.db'}"
    engine = make_engine(old)
    upgrade(engine, "0005")
    engine.dispose()
    # When each is opened as every command opens it
    with caplog.at_level("WARNING", logger="db.migrate"):
        for url in (old, new):
            engine = make_engine(url)
            ensure_schema(engine)
            engine.dispose()
    # Then both are at head, and only the existing one said so (a rebuilt table takes a while on millions
    # of rows: 3 s for 1,000,000 images, 0005 to 0006)
    assert revision_of(old) == revision_of(new) == HEAD
    warnings = [r.getMessage() for r in caplog.records if r.name == "db.migrate"]
    assert warnings == [f"detq: upgrading the ledger {tmp_path / 'old.db'} from 0005 to {HEAD}"]


def test_0008_gives_jobs_their_settings_and_earlier_jobs_the_defaults_key(database_url: str) -> None:
    # Given a ledger at 0007 with a job and its image
    engine = make_engine(database_url)
    try:
        _ledger_with_detections(engine, "0007", boxes=1)
        before = _image_rows(engine)
        # When it is upgraded to 0008
        upgrade(engine, "0008")
        engine.dispose()
        # Then the job's settings are unknown and its key is the defaults' (its earlier results count as
        # done for an incremental run at the defaults), and the tables are as the models say
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT settings, settings_key FROM jobs")).all()
        assert found == [(None, DEFAULT_KEY)]
        assert _image_rows(engine) == before
        assert _differences_of(database_url, "jobs") == []
        # And a downgrade drops them, keeping the rows
        command.downgrade(make_config(database_url), "0007")
        engine.dispose()
        columns = {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
        assert not {"settings", "settings_key"} & columns
        assert _image_rows(engine) == before
    finally:
        engine.dispose()


def test_0009_counts_what_each_job_holds_into_its_row(database_url: str) -> None:
    # Given a ledger at 0008 with a job of one image done with three boxes
    engine = make_engine(database_url)
    try:
        _ledger_with_detections(engine, "0008", boxes=3)
        before = _image_rows(engine)
        # When it is upgraded to 0009
        upgrade(engine, "0009")
        engine.dispose()
        # Then the job's row counts its image and boxes, and the tables are as the models say
        with engine.connect() as conn:
            found = conn.execute(
                sa.text(
                    "SELECT pending_count, done_count, failed_count, rejected_count, cancelled_count,"
                    " detection_count FROM jobs"
                )
            ).all()
        assert found == [(0, 1, 0, 0, 0, 3)]
        assert _image_rows(engine) == before
        assert _differences_of(database_url, "jobs") == []
        assert _differences_of(database_url, "recorded_counts") == []
        # And a downgrade drops them, keeping the rows
        command.downgrade(make_config(database_url), "0008")
        engine.dispose()
        columns = {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
        assert not {"pending_count", "detection_count"} & columns
        assert "recorded_counts" not in sa.inspect(engine).get_table_names()
        assert _image_rows(engine) == before
    finally:
        engine.dispose()
