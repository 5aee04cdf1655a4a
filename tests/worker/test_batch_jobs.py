"""process_batch reads a job once per process, and again when the job may be gone (a real SQLite ledger)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from db.jobs_repo import delete_job
from detq.vocabulary import ImageStatus
from tests.ledger_support import sql_sent
from tests.support import write_jpeg
from tests.worker.conftest import Staged, ledger_rows
from worker.batch import JobMissing, process_batch
from worker.runtime import MAX_CACHED_JOBS, WorkerRuntime

Stage = Callable[..., Staged]


def _reads_of_jobs(sql: list[str]) -> list[str]:
    return [s for s in sql if "FROM jobs JOIN models" in s]


def test_a_job_is_read_at_its_first_batch_only(runtime: WorkerRuntime, stage: Stage, tmp_path: Path) -> None:
    # Given a job of four images in two batches
    names = [f"{i}.jpg" for i in range(4)]
    for name in names:
        write_jpeg(tmp_path / name, (64, 48))
    job = stage(tmp_path, names)
    # When both batches run in the same process
    with sql_sent(runtime.ledger.engine) as first:
        process_batch(runtime, job.job_id, job.image_ids[:2])
    with sql_sent(runtime.ledger.engine) as second:
        process_batch(runtime, job.job_id, job.image_ids[2:])
    # Then the job's roots and model were read for the first only, and every image is done
    assert len(_reads_of_jobs(first)) == 1
    assert _reads_of_jobs(second) == []
    assert {row.status for row in ledger_rows(runtime, job.job_id).values()} == {ImageStatus.DONE}


def test_a_job_deleted_after_its_first_batch_is_refused_as_missing(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a job whose first batch ran in this process, then deleted
    names = ["a.jpg", "b.jpg"]
    for name in names:
        write_jpeg(tmp_path / name, (64, 48))
    job = stage(tmp_path, names)
    process_batch(runtime, job.job_id, job.image_ids[:1])
    with runtime.ledger.sessions() as session, session.begin():
        assert delete_job(session, job.job_id)
    # When its second batch is delivered (a message sent before the delete)
    # Then the job is read again, found missing, and forgotten
    with pytest.raises(JobMissing):
        process_batch(runtime, job.job_id, job.image_ids[1:])
    assert job.job_id not in runtime.jobs


def test_the_process_keeps_a_bounded_number_of_jobs(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given more jobs than a process keeps, each run one batch
    write_jpeg(tmp_path / "a.jpg", (64, 48))
    jobs = [stage(tmp_path, ["a.jpg"]) for _ in range(MAX_CACHED_JOBS + 2)]
    for job in jobs:
        process_batch(runtime, job.job_id, job.image_ids)
    # Then only the most recent ones are kept
    assert list(runtime.jobs) == [job.job_id for job in jobs[-MAX_CACHED_JOBS:]]
