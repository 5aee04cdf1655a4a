"""`detq scheduler` end to end: incremental runs through real workers, one active scheduler with a standby
that takes over, a missed run caught up once, and no torch in the scheduler process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from db.engine import make_engine, make_session_factory
from db.export_repo import iter_ledger
from demo.shapes import write_dataset
from producer.scheduler.summaries import RunSummary, run_summaries
from tests.integration.harness import (
    WRAPPED_DETQ,
    Deployment,
    WorkerHandle,
    faked_clock,
    running_worker,
    stop_worker,
)

pytestmark = pytest.mark.integration

ACTIVE_MARK = "detq scheduler: active"
STANDBY_MARK = "detq scheduler: standby"
SENT_MARK = "sent to the control queue"
LEASE_S = 2.0


def configure(
    deployment: Deployment, tmp_path: Path, folder: Path, cron: str, batch_size: int = 4
) -> Deployment:
    """Point the deployment at a one-schedule file with a short lease."""
    schedules = tmp_path / "schedules.toml"
    schedules.write_text(
        f'[[schedule]]\nname = "cams"\nfolders = ["{folder}"]\ncron = "{cron}"\nbatch_size = {batch_size}\n'
    )
    deployment.extra.update(
        {"DETQ_SCHEDULES_FILE": str(schedules), "DETQ_SCHEDULER_LEASE_SECONDS": str(LEASE_S)}
    )
    return deployment


@contextmanager
def running_scheduler(
    deployment: Deployment, name: str = "s", env: Mapping[str, str] | None = None
) -> Iterator[WorkerHandle]:
    """`detq scheduler` under a wrapper that fails any import of torch and records it in a mark file;
    env: added to the deployment's."""
    log_path = deployment.data_dir / f"scheduler-{name}-{time.monotonic_ns()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = deployment.env() | dict(env or {}) | {"DETQ_TEST_TORCH_MARK": str(torch_mark(deployment))}
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [*WRAPPED_DETQ, "scheduler", "--loglevel", "INFO"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    handle = WorkerHandle(proc, log_path)
    try:
        handle.wait_for("detq scheduler: ready", timeout=60)
        assert "torch loaded: False" in handle.log()
        yield handle
    finally:
        stop_worker(handle, timeout=30)


def torch_mark(deployment: Deployment) -> Path:
    return deployment.data_dir / "torch-imported"


def runs(deployment: Deployment) -> list[RunSummary]:
    """Every run of the schedule, oldest first, read straight from the ledger."""
    engine = make_engine(deployment.database_url or f"sqlite:///{deployment.data_dir / 'detq.db'}")
    try:
        with make_session_factory(engine)() as session:
            return list(reversed(run_summaries(session, "cams", limit=1000)))
    finally:
        engine.dispose()


def run_paths(deployment: Deployment, job_id: int) -> set[str]:
    engine = make_engine(deployment.database_url or f"sqlite:///{deployment.data_dir / 'detq.db'}")
    try:
        with make_session_factory(engine)() as session:
            return {image.path for image, _ in iter_ledger(session, job_id)}
    finally:
        engine.dispose()


def wait_for_run(
    deployment: Deployment, after: int, timeout: float = 30, finished: bool = False
) -> RunSummary:
    """The first run whose job id is above `after`, fully enqueued (its counts recorded), or finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in runs(deployment):
            if run.job_id > after and run.state != "enqueuing" and (not finished or run.state == "finished"):
                return run
        time.sleep(0.2)
    raise AssertionError(f"no run after job {after} within {timeout} s: {runs(deployment)}")


def wait_until_finished(deployment: Deployment, job_id: int, timeout: float = 120) -> RunSummary:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (run,) = [r for r in runs(deployment) if r.job_id == job_id]
        if run.state == "finished":
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {job_id} did not finish within {timeout} s")


def test_scheduled_runs_enqueue_only_new_and_changed_images(deployment: Deployment, tmp_path: Path) -> None:
    images = tmp_path / "images"
    write_dataset(images, 6, seed=21)
    configure(deployment, tmp_path, images, "*/4 * * * * *")
    with running_worker(deployment, concurrency=1), running_scheduler(deployment):
        # The first run processes every image
        first = wait_for_run(deployment, after=0)
        assert (first.total, first.new, first.changed, first.skipped) == (6, 6, 0, 0)
        first = wait_until_finished(deployment, first.job_id)
        assert first.done == 6
        # When a run comes and goes, two files are added and one is touched before the next tick
        quiet = wait_for_run(deployment, after=first.job_id)
        added = write_dataset(tmp_path / "more", 2, seed=22)
        new_paths = set()
        for source in sorted((tmp_path / "more").glob("*.png")) + sorted((tmp_path / "more").glob("*.jpg")):
            target = images / f"new-{source.name}"
            source.rename(target)
            new_paths.add(str(target))
        assert added and len(new_paths) == 2
        touched = sorted(p for p in images.iterdir() if p.is_file() and not p.name.startswith("new-"))
        touched = [p for p in touched if p.suffix in (".png", ".jpg")][:1]
        stat = touched[0].stat()
        os.utime(touched[0], (stat.st_atime, stat.st_mtime + 10))
        # Then the next run enqueues exactly those three
        changes = wait_for_run(deployment, after=quiet.job_id)
        assert (changes.total, changes.new, changes.changed, changes.skipped) == (3, 2, 1, 5)
        assert run_paths(deployment, changes.job_id) == new_paths | {str(touched[0])}
        assert wait_until_finished(deployment, changes.job_id).done == 3
        # And a run with no changes enqueues nothing and finishes at once
        idle = wait_for_run(deployment, after=changes.job_id, finished=True)
        assert (idle.total, idle.skipped, idle.nothing_new) == (0, 8, True)
    assert quiet.new + quiet.changed + quiet.retried == 0
    assert not torch_mark(deployment).exists()


def test_two_schedulers_make_one_run_per_tick_and_the_standby_takes_over(
    deployment: Deployment, tmp_path: Path
) -> None:
    images = tmp_path / "images"
    write_dataset(images, 1, seed=3)
    configure(deployment, tmp_path, images, "* * * * * *")  # every second
    with running_scheduler(deployment, "a") as first:
        first.wait_for(ACTIVE_MARK)
        with running_scheduler(deployment, "b") as second:
            second.wait_for(STANDBY_MARK)
            first.wait_for(SENT_MARK, count=4)
            # While both run, only the active one sends runs, and every second has exactly one run
            assert SENT_MARK not in second.log()
            both = runs(deployment)
            ticks = [datetime.fromisoformat(r.scheduled_for) for r in both]
            assert len(ticks) == len(set(ticks)) >= 3
            assert all(b - a == timedelta(seconds=1) for a, b in zip(ticks[1:], ticks[2:], strict=False))
            # When the active scheduler dies without releasing its lease
            os.killpg(first.proc.pid, signal.SIGKILL)
            first.proc.wait()
            killed_at = time.monotonic()
            # Then the standby takes over within the lease plus one renewal interval (and start slack)
            second.wait_for(ACTIVE_MARK, timeout=LEASE_S * 4 / 3 + 3)
            assert time.monotonic() - killed_at <= LEASE_S * 4 / 3 + 3
            last_before = max(r.job_id for r in both)
            wait_for_run(deployment, after=max(r.job_id for r in runs(deployment)), timeout=5)
            assert second.log().count(SENT_MARK) >= 1
    after = runs(deployment)
    keys = [(r.schedule, r.scheduled_for) for r in after]
    assert len(keys) == len(set(keys)) and len(after) > len([r for r in after if r.job_id <= last_before])
    assert not torch_mark(deployment).exists()


def test_restarted_scheduler_runs_a_missed_run_once(embedded: Deployment, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    configure(embedded, tmp_path, images, "*/2 * * * * *")
    with running_scheduler(embedded, "before") as before:
        before.wait_for(SENT_MARK)
        wait_for_run(embedded, after=0)
    # Given the scheduler down for at least three fire times
    time.sleep(7)
    down = runs(embedded)
    with running_scheduler(embedded, "after") as after:
        after.wait_for(SENT_MARK, count=2)
        wait_for_run(embedded, after=max(r.job_id for r in down) + 1)
    later = [r for r in runs(embedded) if r.job_id > max(r.job_id for r in down)]
    # Then exactly one run was made for the missed times, at start-up, for the latest of them
    catch_up, regular = later[0], later[1]
    missed_from = datetime.fromisoformat(down[-1].scheduled_for)
    caught = datetime.fromisoformat(catch_up.scheduled_for)
    assert caught - missed_from >= timedelta(seconds=6)  # three or more fire times were missed
    assert datetime.fromisoformat(regular.scheduled_for) - caught == timedelta(seconds=2)
    assert not torch_mark(embedded).exists()


def test_a_scheduler_killed_mid_scan_leaves_a_run_that_closes_and_finishes(
    embedded: Deployment, tmp_path: Path
) -> None:
    # Given a schedule over 20000 files, due every 5 s, and a worker to heal and run it
    folder = tmp_path / "cams"
    folder.mkdir()
    for i in range(20000):
        (folder / f"{i:05d}.jpg").write_bytes(b"")  # empty: each is rejected fast with a reason
    # Batches of 64: however much the scan records before the kill (it records a 2,000-row chunk while
    # the one before is sent), the workers finish it in seconds.
    configure(embedded, tmp_path, folder, "*/5 * * * * *", batch_size=64)
    embedded.extra["DETQ_WORKER_TIMEOUT"] = "6"
    with running_worker(embedded, concurrency=2), running_scheduler(embedded) as scheduler:
        # When the scheduler is SIGKILLed while its run is still scanning
        deadline = time.monotonic() + 60
        while not any(run.state == "enqueuing" and run.total > 0 for run in runs(embedded)):
            assert time.monotonic() < deadline, "no run caught mid-scan"
            time.sleep(0.02)
        os.killpg(scheduler.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        (run,) = [r for r in runs(embedded) if r.state == "enqueuing"]
        # Then the run's job is closed with what was recorded and finishes, with no person involved
        finished = wait_until_finished(embedded, run.job_id, timeout=120)
    print(f"\nscheduler killed: run closed and finished {time.monotonic() - killed_at:.1f} s later")
    assert finished.pending == 0 and finished.total > 0 and finished.rejected == finished.total


def test_a_scheduler_a_minute_behind_fires_by_the_databases_clock(
    scaled_out: Deployment, tmp_path: Path
) -> None:
    # Given a scheduler whose machine's clock is 60 s behind the database server's, a schedule every 5 s
    deployment = scaled_out
    images = tmp_path / "images"
    write_dataset(images, 2, seed=3)
    configure(deployment, tmp_path, images, "*/5 * * * * *")
    with running_scheduler(deployment, env=faked_clock("-60s")) as scheduler:
        # When it makes its first run
        run = wait_for_run(deployment, after=0)
        seen_at = datetime.now(UTC)  # this machine's clock, the server's here
    # Then it said its clock is off, and the run is for a fire time by the server's clock, not 60 s ago
    said = scheduler.log()
    assert "this machine's clock is 60." in said and "behind the database server's" in said
    assert timedelta(0) <= seen_at - datetime.fromisoformat(run.scheduled_for) < timedelta(seconds=15)
