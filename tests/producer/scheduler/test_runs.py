"""A scheduled run: its job, what its scan passed over said in the scheduler's log, and a run whose folder
is missing recorded closed with the reason."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from detq.celery_app import make_celery_app
from detq.settings import Settings
from detq.vocabulary import JobState
from producer.enqueue import EnqueueError
from producer.scheduler.cron import CronSpec
from producer.scheduler.runs import RunDefaults, run_schedule
from producer.scheduler.schedules import Schedule
from producer.scheduler.summaries import run_summaries

MODEL = Path(__file__).resolve().parents[3] / "worker" / "assets" / "demo_detector.pt"


def test_a_run_over_a_folder_without_images_says_so_in_the_log(
    factory: sessionmaker[Session], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a schedule over a folder that holds no image (a wrong path in the schedules file, say)
    folder = tmp_path / "camera"
    folder.mkdir()
    (folder / "clip.mp4").write_bytes(b"x")
    app = make_celery_app(Settings(_env_file=None, data_dir=tmp_path / "data"))
    schedule = Schedule(name="nightly", folders=(folder,), cron=CronSpec("0 2 * * *"))
    defaults = RunDefaults(model=MODEL, batch_size=4, max_retries=2)
    # When its run starts
    with caplog.at_level(logging.WARNING, logger="producer.scheduler.runs"):
        outcome = run_schedule(factory, app, schedule, datetime(2026, 12, 5, 2, tzinfo=UTC), defaults)
    # Then the run has its (empty) job, and the log says why it is empty
    assert outcome.job_id is not None and outcome.total == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "detq scheduler: nightly for 2026-12-05 02:00:00+00:00: no image files found (1 file of another"
        " type, such as clip.mp4); detq reads .bmp, .gif, .jpeg, .jpg, .png, .tif, .tiff, .webp"
    ]


def test_a_run_whose_folder_is_missing_is_recorded_closed_with_the_reason(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    # Given a schedule over a share that is not mounted tonight
    missing = tmp_path / "nas" / "camera"
    app = make_celery_app(Settings(_env_file=None, data_dir=tmp_path / "data"))
    schedule = Schedule(name="nightly", folders=(missing,), cron=CronSpec("0 2 * * *"))
    defaults = RunDefaults(model=MODEL, batch_size=4, max_retries=2)
    tonight = datetime(2026, 12, 5, 2, tzinfo=UTC)
    # When its run starts, it fails as before (the scheduler logs the error)
    with pytest.raises(EnqueueError, match="not a folder"):
        run_schedule(factory, app, schedule, tonight, defaults)
    # Then the ledger has the night's run, closed at once with the reason, not shown as "nothing new"
    with factory() as session:
        (run,) = run_summaries(session)
    assert (run.schedule, run.total, run.nothing_new) == ("nightly", 0, False)
    assert run.shown_state == "closed early"
    assert run.closed_reason == f"nothing queued: not a folder: {missing}"
    assert run.state is JobState.FINISHED
    # And the same run sent again (a redelivered message, a standby) does not make a second one
    assert run_schedule(factory, app, schedule, tonight, defaults).job_id is None
    with factory() as session:
        assert [r.job_id for r in run_summaries(session)] == [run.job_id]


def test_a_run_whose_model_file_is_gone_is_recorded_under_the_model_last_run_there(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    # Given a nightly schedule that ran last night with the model at models/detector.pt
    folder = tmp_path / "camera"
    folder.mkdir()
    model = tmp_path / "models" / "detector.pt"
    model.parent.mkdir()
    model.write_bytes(MODEL.read_bytes())
    app = make_celery_app(Settings(_env_file=None, data_dir=tmp_path / "data"))
    schedule = Schedule(name="nightly", folders=(folder,), cron=CronSpec("0 2 * * *"), model=model)
    defaults = RunDefaults(model=MODEL, batch_size=4, max_retries=2)
    last_night = run_schedule(factory, app, schedule, datetime(2026, 12, 4, 2, tzinfo=UTC), defaults)
    # When the model file is moved away before tonight's run
    model.unlink()
    with pytest.raises(EnqueueError, match="model file not found"):
        run_schedule(factory, app, schedule, datetime(2026, 12, 5, 2, tzinfo=UTC), defaults)
    # Then tonight's run is in the ledger, closed early with the reason, under the model that ran there
    with factory() as session:
        tonight, last = run_summaries(session)
    assert last.job_id == last_night.job_id and tonight.job_id != last.job_id
    assert (tonight.shown_state, tonight.total) == ("closed early", 0)
    assert tonight.closed_reason == f"nothing queued: model file not found: {model}"
    # And a schedule whose model never ran from its path is only logged: no row stands for its model
    stranger = Schedule(
        name="other", folders=(folder,), cron=CronSpec("0 3 * * *"), model=tmp_path / "never.pt"
    )
    with pytest.raises(EnqueueError, match="model file not found"):
        run_schedule(factory, app, stranger, datetime(2026, 12, 5, 3, tzinfo=UTC), defaults)
    with factory() as session:
        assert [r.schedule for r in run_summaries(session)] == ["nightly", "nightly"]
