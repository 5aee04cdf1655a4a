"""process_batch against a real SQLite ledger and real TorchScript models, no worker process."""

from __future__ import annotations

import errno
import os
import socket
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import PIL.Image
import pytest
import torch
from sqlalchemy import event, func, select, update

from db.images_repo import ImageResult, finalise_results
from db.models import Detection, Image, Job, utcnow
from db.workers_repo import ROLE_PROCESS, WorkerIdentity, register_worker, set_current_batch
from detq.vocabulary import ImageStatus
from tests.support import write_corrupt_folder, write_jpeg
from tests.worker.conftest import Staged, ledger_rows, swap_default_model
from worker.batch import process_batch
from worker.heartbeat import host_key
from worker.runtime import WorkerRuntime

Stage = Callable[..., Staged]


def _detections(runtime: WorkerRuntime, image_id: int) -> list[tuple[float, float, float, float]]:
    with runtime.ledger.sessions() as session:
        rows = session.scalars(
            select(Detection).where(Detection.image_id == image_id).order_by(Detection.rank)
        )
        return [(d.x1, d.y1, d.x2, d.y2) for d in rows]


def test_a_batch_ends_every_image_done_with_boxes_in_original_pixels(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given three JPEGs of different sizes queued as one batch
    sizes = {"a.jpg": (320, 240), "b.jpg": (200, 300), "c.jpg": (641, 359)}
    for name, size in sizes.items():
        write_jpeg(tmp_path / name, size)
    job = stage(tmp_path, list(sizes))
    # When the batch is processed
    report = process_batch(runtime, job.job_id, job.image_ids)
    # Then each image is done with the fixed box at 25%..75% of its own size, and the job is finished
    assert (report.written, report.done, report.skipped) == (3, 3, 0)
    rows = ledger_rows(runtime, job.job_id)
    for image_id, name in job.names.items():
        w, h = sizes[name]
        assert rows[image_id].status == ImageStatus.DONE
        assert (rows[image_id].width, rows[image_id].height) == (w, h)
        assert rows[image_id].device == "cpu" and rows[image_id].worker == runtime.worker_name
        ((x1, y1, x2, y2),) = _detections(runtime, image_id)
        assert (x1, y1, x2, y2) == pytest.approx((w * 0.25, h * 0.25, w * 0.75, h * 0.75), abs=0.01)
    with runtime.ledger.sessions() as session:
        assert session.get(Job, job.job_id).finished_at is not None  # type: ignore[union-attr]


def test_a_jobs_first_claim_is_when_it_started(runtime: WorkerRuntime, stage: Stage, tmp_path: Path) -> None:
    # Given a job of four images, queued as two batches
    for name in ("a.jpg", "b.jpg", "c.jpg", "d.jpg"):
        write_jpeg(tmp_path / name, (64, 48))
    job = stage(tmp_path, ["a.jpg", "b.jpg", "c.jpg", "d.jpg"])
    # When a process runs the first batch, then the second
    process_batch(runtime, job.job_id, job.image_ids[:2])
    process_batch(runtime, job.job_id, job.image_ids[2:])
    # Then the job started when the first batch was claimed, not when its results were written
    with runtime.ledger.sessions() as session:
        started = session.get_one(Job, job.job_id).started_at
        first_claim = session.scalar(select(func.min(Image.claimed_at)).where(Image.job_id == job.job_id))
        first_finish = session.scalar(select(func.min(Image.finished_at)).where(Image.job_id == job.job_id))
    assert started is not None and first_claim is not None and first_finish is not None
    assert started == first_claim < first_finish


def test_bad_files_fail_or_are_rejected_alone_and_their_batch_mates_finish(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given good, empty, truncated, non-image and escaping files, and one that vanished after the scan
    folder = tmp_path / "in"
    expected = write_corrupt_folder(folder, tmp_path / "outside")
    names = [*expected, "vanished.jpg"]
    job = stage(folder, names)
    # When the batch is processed
    report = process_batch(runtime, job.job_id, job.image_ids)
    # Then each ends in its own terminal state with a reason, and only the good ones have boxes
    rows = {job.names[i]: row for i, row in ledger_rows(runtime, job.job_id).items()}
    assert {name: rows[name].status for name in expected} == expected
    assert (
        rows["vanished.jpg"].status == ImageStatus.FAILED and rows["vanished.jpg"].reason == "file not found"
    )
    assert rows["empty.jpg"].reason == "empty file (0 bytes)"
    assert "outside the job root" in (rows["escape.jpg"].reason or "")
    assert all(rows[n].reason for n in names if rows[n].status != ImageStatus.DONE)
    assert (report.done, report.rejected, report.failed) == (3, 4, 1)


class _FailsOnNarrowImages(torch.nn.Module):
    """torchvision format; raises for an image 13 pixels wide, as a model can fail on one odd input."""

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = []
        for img in images:
            if img.shape[2] == 13:
                raise RuntimeError("unsupported width")
            out.append(
                {
                    "boxes": torch.tensor([[1.0, 1.0, 5.0, 5.0]]),
                    "labels": torch.ones(1, dtype=torch.int64),
                    "scores": torch.full((1,), 0.8),
                }
            )
        return out


def _scripted(module: torch.nn.Module) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.script(module.eval())


def test_a_failing_forward_is_rerun_image_by_image_so_only_the_culprit_fails(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a model that fails on 13-pixel-wide images, and a micro-batch of four holding one of them
    swap_default_model(runtime, replace(runtime.default_model, module=_scripted(_FailsOnNarrowImages())))
    names = ["w40.jpg", "w13.jpg", "w41.jpg", "w42.jpg", "w43.jpg"]
    for name in names:
        write_jpeg(tmp_path / name, (int(name[1:3]), 20))
    job = stage(tmp_path, names)
    # When the batch is processed (micro-batch 4, then 1)
    report = process_batch(runtime, job.job_id, job.image_ids)
    # Then the narrow image alone failed with the model's reason; the others are done
    rows = {job.names[i]: row for i, row in ledger_rows(runtime, job.job_id).items()}
    assert rows["w13.jpg"].status == ImageStatus.FAILED
    assert (rows["w13.jpg"].reason or "").startswith("inference failed:")
    reason = rows["w13.jpg"].reason or ""
    assert reason.endswith("unsupported width") and "\n" not in reason and len(reason) <= 300
    assert all(rows[n].status == ImageStatus.DONE for n in names if n != "w13.jpg")
    assert all(rows[n].infer_ms is not None and rows[n].infer_ms >= 0 for n in names)  # type: ignore[operator]
    assert (report.done, report.failed) == (4, 1)


def test_a_redelivered_batch_writes_nothing_twice(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a batch already processed once
    for name in ("a.jpg", "b.jpg"):
        write_jpeg(tmp_path / name, (100, 80))
    job = stage(tmp_path, ["a.jpg", "b.jpg"])
    process_batch(runtime, job.job_id, job.image_ids)
    # When the same batch is delivered again
    again = process_batch(runtime, job.job_id, job.image_ids)
    # Then it is skipped whole: one detection per image, one attempt each
    assert (again.written, again.skipped) == (0, 2)
    with runtime.ledger.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Detection)) == 2
    assert [row.attempts for row in ledger_rows(runtime, job.job_id).values()] == [1, 1]


def test_a_pinned_worker_refuses_a_job_of_another_model(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a worker pinned to a hash that is not its job's model
    runtime.settings = runtime.settings.replace(model_sha256="0" * 64)
    write_jpeg(tmp_path / "a.jpg", (32, 32))
    job = stage(tmp_path, ["a.jpg"])
    # When the batch runs, Then its image fails with the pin as the reason, no model is loaded from it
    process_batch(runtime, job.job_id, job.image_ids)
    (row,) = ledger_rows(runtime, job.job_id).values()
    assert row.status == ImageStatus.FAILED and "DETQ_MODEL_SHA256" in (row.reason or "")


def _held_by_another_live_process(runtime: WorkerRuntime, job_id: int, attempts: int) -> int:
    """Give the job's images to a live pool process of another node, running batch 5; its row id."""
    now = utcnow()
    identity = WorkerIdentity(ROLE_PROCESS, "slow@host", socket.gethostname(), host_key(), os.getpid(), "cpu")
    with runtime.ledger.sessions() as session, session.begin():
        other = register_worker(session, identity, now)
        session.execute(
            update(Image)
            .where(Image.job_id == job_id)
            .values(batch_id=5, claimed_by=other, claimed_at=now, attempts=attempts)
        )
        set_current_batch(session, other, 5, now)
    return other


def test_a_backup_copy_races_a_live_process_and_the_first_result_wins(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a batch whose images a live process on a slow node has started
    for name in ("a.jpg", "b.jpg"):
        write_jpeg(tmp_path / name, (100, 80))
    job = stage(tmp_path, ["a.jpg", "b.jpg"])
    other = _held_by_another_live_process(runtime, job.job_id, attempts=1)
    # When the batch's own message comes again, it leaves them to that process
    assert process_batch(runtime, job.job_id, job.image_ids, 5).written == 0
    # When its backup copy comes
    report = process_batch(runtime, job.job_id, job.image_ids, 5, backup=True)
    # Then the backup finishes them, leaving their claims and attempts as they were
    assert (report.written, report.done, report.skipped) == (2, 2, 0)
    rows = ledger_rows(runtime, job.job_id)
    assert {(r.status, r.attempts, r.claimed_by) for r in rows.values()} == {(ImageStatus.DONE, 1, other)}
    # And the slow process's results, when they come, write nothing: one set of boxes per image
    late = [ImageResult(image_id=i, status=ImageStatus.DONE, width=100, height=80) for i in job.image_ids]
    model_id = _model_id(runtime, job.job_id)
    with runtime.ledger.sessions() as session, session.begin():
        assert finalise_results(session, job.job_id, model_id, late, worker="slow", device="cpu") == set()
    with runtime.ledger.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Detection)) == 2


def test_a_heartbeat_right_after_the_claim_says_which_batch_holds_it(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a batch, and a heartbeat that lands the moment each transaction of this process commits (the
    # worst moment for the pool process's heartbeat thread: under a CPU quota the detection that follows
    # the claim can start seconds later)
    for name in ("a.jpg", "b.jpg"):
        write_jpeg(tmp_path / name, (100, 80))
    job = stage(tmp_path, ["a.jpg", "b.jpg"])
    beats: list[int | None] = []

    def heartbeat(session: Any) -> None:
        beats.append(runtime.stats.beat().current_batch_id)

    event.listen(runtime.ledger.sessions, "after_commit", heartbeat)
    try:
        process_batch(runtime, job.job_id, job.image_ids, 5)
    finally:
        event.remove(runtime.ledger.sessions, "after_commit", heartbeat)
    # Then the beat after the claim's commit names the batch (it said "none", and a backup copy then took
    # the fresh claims for a dead process's, one more attempt on each), and the process is idle after it
    assert beats and beats[0] == 5
    assert runtime.stats.beat().current_batch_id is None
    rows = ledger_rows(runtime, job.job_id)
    assert {(r.status, r.attempts) for r in rows.values()} == {(ImageStatus.DONE, 1)}


def test_a_backup_copy_leaves_an_image_that_killed_a_process_before(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given images a live process runs on their second start (a process died on each once)
    for name in ("a.jpg", "b.jpg"):
        write_jpeg(tmp_path / name, (100, 80))
    job = stage(tmp_path, ["a.jpg", "b.jpg"])
    _held_by_another_live_process(runtime, job.job_id, attempts=2)
    # When a backup copy comes, it does not race them: a death there would count in no image's attempts
    report = process_batch(runtime, job.job_id, job.image_ids, 5, backup=True)
    assert (report.written, report.skipped) == (0, 2)
    assert {r.status for r in ledger_rows(runtime, job.job_id).values()} == {ImageStatus.PENDING}


def _model_id(runtime: WorkerRuntime, job_id: int) -> int:
    with runtime.ledger.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.model_id


def test_a_read_that_fails_is_a_failure_to_retry_and_content_that_is_no_image_a_rejection(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a good JPEG whose reads fail with EIO (a flaky share), beside a text file named .jpg
    write_jpeg(tmp_path / "flaky.jpg", (64, 48))
    (tmp_path / "notes.jpg").write_text("not an image\n")
    job = stage(tmp_path, ["flaky.jpg", "notes.jpg"])
    real_open = PIL.Image.open

    def failing_open(source: Any, *args: Any, **kwargs: Any) -> PIL.Image.Image:
        if source.read(3) == b"\xff\xd8\xff":  # the JPEG; the text file is read as it is
            raise OSError(errno.EIO, "Input/output error")
        source.seek(0)
        return real_open(source, *args, **kwargs)

    monkeypatch.setattr(PIL.Image, "open", failing_open)
    # When the batch runs
    process_batch(runtime, job.job_id, job.image_ids)
    # Then the failed read is `failed` (a later run retries it), the text file `rejected` (its content)
    rows = {job.names[i]: row for i, row in ledger_rows(runtime, job.job_id).items()}
    assert (rows["flaky.jpg"].status, rows["flaky.jpg"].reason) == (
        ImageStatus.FAILED,
        "cannot read file: [Errno 5] Input/output error",
    )
    assert (rows["notes.jpg"].status, rows["notes.jpg"].reason) == (
        ImageStatus.REJECTED,
        "not a recognised image format",
    )
