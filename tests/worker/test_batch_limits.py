"""run_batch, the batch task's body, against a real SQLite ledger and real TorchScript models, no worker:
a batch that cannot finish (a soft time limit, a bug, a message that does not fit the ledger)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import select
from sqlalchemy.exc import ProgrammingError

from db.batches_repo import open_batches
from db.claims_repo import Claimable
from db.models import Batch, Detection
from detq.contract import BatchMessage
from detq.inference_settings import InferenceSettings
from detq.vocabulary import ImageStatus
from tests.support import write_jpeg
from tests.worker.conftest import Staged, ledger_rows, swap_default_model
from worker.batch import (
    ALONE_REASON,
    SOFT_LIMIT_REASON,
    BatchReport,
    SentAgain,
    fail_pending,
    process_batch,
    run_batch,
    split_unfinished,
)
from worker.metrics import ProcessMetrics
from worker.models.loading import LoadedModel
from worker.runtime import WorkerRuntime

Stage = Callable[..., Staged]


class _SlowModel(torch.nn.Module):
    """Answers like the fixed-box model, `seconds` per call: long enough for a timer to fire."""

    def __init__(self, inner: Any, seconds: float) -> None:
        super().__init__()
        self.inner = inner
        self.seconds = seconds

    def forward(self, images: list[torch.Tensor]) -> Any:
        time.sleep(self.seconds)
        return self.inner(images)


def _slow(runtime: WorkerRuntime, seconds: float) -> None:
    """Make the runtime's model slow, one image a forward."""
    model = runtime.default_model
    swap_default_model(runtime, replace(model, module=_SlowModel(model.module, seconds), max_batch=1))


@contextmanager
def _soft_time_limit(seconds: float) -> Iterator[None]:
    """Raise SoftTimeLimitExceeded in this thread after `seconds`, as billiard's pool does on its signal."""

    def fire(signum: int, frame: Any) -> None:
        raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class _Broker:
    """Stands in for the broker a task publishes to: records each batch sent, or refuses after `up_to`."""

    sent: list[tuple[int, int, list[int], str]] = field(default_factory=list)
    up_to: int | None = None

    def __call__(self, job_id: int, batch_id: int, image_ids: Any, pool: str) -> None:
        if self.up_to is not None and len(self.sent) >= self.up_to:
            raise ConnectionError("broker unreachable")
        self.sent.append((job_id, batch_id, list(image_ids), pool))


def _time_limits(runtime: WorkerRuntime) -> dict[str, float]:
    """detq_time_limits_total by outcome, as this process counted it."""
    assert runtime.metrics is not None
    (family,) = runtime.metrics.time_limits.collect()
    return {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}


def _images(tmp_path: Path, count: int) -> list[str]:
    names = [f"{i}.jpg" for i in range(count)]
    for name in names:
        write_jpeg(tmp_path / name, (64, 48))
    return names


def _run_timed(
    runtime: WorkerRuntime, job: Staged, broker: _Broker, *, seconds_an_image: float, limit_s: float
) -> BatchReport:
    """Run the job's images as one batch on a model that takes seconds_an_image each, stopped at limit_s,
    in a process that counts metrics."""
    _slow(runtime, seconds_an_image)
    runtime.metrics = ProcessMetrics()
    with _soft_time_limit(limit_s):
        return run_batch(runtime, BatchMessage(job.job_id, job.image_ids), send=broker)


@pytest.mark.slow
def test_a_soft_time_limit_keeps_what_finished_and_sends_the_rest_again_the_image_in_flight_alone(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a model of half a second an image and a batch of eight
    job = stage(tmp_path, _images(tmp_path, 8))
    broker = _Broker()
    # When the soft time limit fires part-way through the batch
    report = _run_timed(runtime, job, broker, seconds_an_image=0.5, limit_s=1.2)
    # Then what finished before it is done and written, and nothing failed
    rows = ledger_rows(runtime, job.job_id)
    done = [i for i in job.image_ids if rows[i].status == ImageStatus.DONE]
    assert len(done) >= 1 and report.done == len(done) and report.failed == 0
    assert all(rows[i].status == ImageStatus.PENDING for i in job.image_ids if i not in done)
    # And the rest was sent again to the job's pool: first the one image in flight, alone, then the others
    (alone_job, alone_batch, alone, pool), (_, rest_batch, rest, _) = broker.sent
    assert (alone_job, pool, len(alone)) == (job.job_id, "cpu", 1)
    assert sorted(alone + rest + done) == sorted(job.image_ids) and alone_batch != rest_batch
    # And the ledger has them in those batches, marked sent, their claims given back (no attempt counted)
    assert {rows[i].batch_id for i in alone} == {alone_batch}
    assert {rows[i].batch_id for i in rest} == {rest_batch}
    assert all(rows[i].claimed_by is None and rows[i].attempts == 0 for i in alone + rest)
    with runtime.ledger.sessions() as session:
        sends = dict(session.execute(select(Batch.id, Batch.sends)).tuples().all())
    assert (sends[alone_batch], sends[rest_batch]) == (1, 1)
    assert _time_limits(runtime) == {"sent_again": 1.0}
    # When a worker runs the batches sent, with time enough
    for _, batch_id, ids, _ in broker.sent:
        run_batch(runtime, BatchMessage(job.job_id, ids), batch_id, send=broker)
    # Then every image is done once, each with its one box, started once
    rows = ledger_rows(runtime, job.job_id)
    assert {row.status for row in rows.values()} == {ImageStatus.DONE}
    assert [row.attempts for row in rows.values()] == [1] * 8
    with runtime.ledger.sessions() as session:
        assert len(session.scalars(select(Detection.image_id)).all()) == 8
    assert len(broker.sent) == 2


def test_an_image_alone_in_its_batch_past_the_soft_time_limit_fails_with_that_reason(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a batch of one image that takes longer than the limit on its own
    job = stage(tmp_path, _images(tmp_path, 1))
    broker = _Broker()
    # When the soft time limit fires during its forward
    report = _run_timed(runtime, job, broker, seconds_an_image=2.0, limit_s=0.3)
    # Then it fails alone with the reason, and nothing is sent again
    (row,) = ledger_rows(runtime, job.job_id).values()
    assert (row.status, row.reason) == (ImageStatus.FAILED, ALONE_REASON)
    assert (report.failed, broker.sent) == (1, [])
    assert _time_limits(runtime) == {"failed": 1.0}


def test_batches_a_timed_out_batch_cannot_send_are_left_to_the_reconciler(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a broker that takes the first batch sent again and refuses the next
    job = stage(tmp_path, _images(tmp_path, 6))
    broker = _Broker(up_to=1)
    # When the soft time limit fires part-way through the batch
    _run_timed(runtime, job, broker, seconds_an_image=0.5, limit_s=0.8)
    # Then no image failed, and the batch not sent is in the ledger with its images, never sent: the
    # reconciler sends a batch no message delivers (dispatch.reconcile)
    rows = ledger_rows(runtime, job.job_id)
    assert ImageStatus.FAILED not in {row.status for row in rows.values()}
    ((_, sent_batch, _, _),) = broker.sent
    with runtime.ledger.sessions() as session:
        unsent = [b for b in open_batches(session, job.job_id) if b.batch_id != sent_batch]
    assert len(unsent) == 1 and unsent[0].sent_at is None
    assert unsent[0].pending == sum(1 for row in rows.values() if row.status == ImageStatus.PENDING) - 1


def test_a_soft_time_limit_before_any_image_started_fails_the_batch_with_that_reason(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a model that takes longer to load than the limit allows
    loaded = runtime.model_for

    def slow_load(sha256: str, path: str, settings: InferenceSettings | None) -> LoadedModel:
        time.sleep(2.0)
        return loaded(sha256, path, settings)

    monkeypatch.setattr(runtime, "model_for", slow_load)
    job = stage(tmp_path, _images(tmp_path, 3))
    broker = _Broker()
    # When the limit fires while it loads
    with _soft_time_limit(0.3):
        report = run_batch(runtime, BatchMessage(job.job_id, job.image_ids), send=broker)
    # Then nothing says which image held the batch up: all fail with the batch's reason, none is sent
    rows = ledger_rows(runtime, job.job_id)
    assert {(row.status, row.reason) for row in rows.values()} == {(ImageStatus.FAILED, SOFT_LIMIT_REASON)}
    assert (report.failed, broker.sent) == (3, [])


def test_fail_pending_gives_only_pending_images_a_reason(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a job of three images of which the first is done
    job = stage(tmp_path, _images(tmp_path, 3))
    process_batch(runtime, job.job_id, job.image_ids[:1])
    # When the batch is failed as a last resort
    failed = fail_pending(runtime, job.job_id, job.image_ids, "batch error: boom")
    # Then the two pending images fail with that reason and the done one is untouched
    rows = ledger_rows(runtime, job.job_id)
    assert failed == 2
    assert rows[job.image_ids[0]].status == ImageStatus.DONE
    assert [rows[i].reason for i in job.image_ids[1:]] == ["batch error: boom", "batch error: boom"]


def test_a_batch_failed_by_a_bug_records_its_error_in_one_short_line(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a database error whose text carries the statement and its parameters, as SQLAlchemy's do
    sql = "UPDATE images SET status=%(status)s WHERE images.id = %(image_id)s" + " " * 400
    error = ProgrammingError(sql, {"image_id": 1}, Exception('prepared statement "_pg3_0" already exists'))

    def broken(sha256: str, path: str, settings: InferenceSettings | None) -> LoadedModel:
        raise error

    monkeypatch.setattr(runtime, "model_for", broken)
    job = stage(tmp_path, _images(tmp_path, 2))
    # When a batch meets it
    report = run_batch(runtime, BatchMessage(job.job_id, job.image_ids))
    # Then its images fail with the error's first line, not the statement and parameters after it
    reasons = {row.reason for row in ledger_rows(runtime, job.job_id).values()}
    assert report.failed == 2 and "\n" in str(error) and len(str(error)) > 500
    assert reasons == {
        'batch error: ProgrammingError: (builtins.Exception) prepared statement "_pg3_0" already exists'
    }


def test_a_message_for_a_missing_job_writes_nothing(runtime: WorkerRuntime) -> None:
    report = run_batch(runtime, BatchMessage(job_id=999, image_ids=[1, 2]))
    assert (report.written, report.skipped) == (0, 0)


def test_a_message_naming_another_jobs_images_writes_nothing(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given two jobs, and a hand-made message for the first naming the second's images
    write_jpeg(tmp_path / "a.jpg", (32, 32))
    first, second = stage(tmp_path, ["a.jpg"]), stage(tmp_path, ["a.jpg"])
    # When it is processed
    report = run_batch(runtime, BatchMessage(first.job_id, second.image_ids))
    # Then nothing is written, the second job's image is still pending, and the log says why
    assert report.written == 0
    assert [row.status for row in ledger_rows(runtime, second.job_id).values()] == [ImageStatus.PENDING]
    assert "are not images of this job; ignored" in caplog.text


# How a batch stopped at its soft time limit splits what it did not finish.


def _free(*ids: int) -> list[Claimable]:
    return [Claimable(i, 1, f"/d/{i}.jpg", 0, 0, 7, None) for i in ids]


def test_each_image_in_flight_goes_alone_and_the_others_together() -> None:
    split = split_unfinished(_free(3, 4, 5, 6), in_flight={4, 6, 99})
    assert split == SentAgain(alone=[4, 6], together=[3, 5])
    assert split.groups == [[4], [6], [3, 5]]


def test_nothing_is_split_when_no_unfinished_image_was_in_flight() -> None:
    # Nothing says which image held the batch up, and the batch sent again whole might never shrink
    assert split_unfinished(_free(3, 4), in_flight=set()).groups == []
    assert split_unfinished(_free(3, 4), in_flight={9}).groups == []


def test_an_image_in_flight_with_no_others_left_goes_alone() -> None:
    assert split_unfinished(_free(8), in_flight={8}).groups == [[8]]
