"""End to end through real `detq worker` processes: demo images, ground truth, once-per-process loading,
redelivered batches, on the embedded default and on Redis with PostgreSQL."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from demo.scoring import PredictedBox, precision_recall
from demo.shapes import load_ground_truth, write_dataset
from detq.celery_app import make_celery_app
from detq.contract import TASK_PROCESS_BATCH
from detq.settings import Settings
from tests.integration.faults import FAST_HEALING, digests, save_slow_model, wait_until, write_images
from tests.integration.harness import LOADED_MARK, Deployment, running_worker

pytestmark = pytest.mark.integration

IMAGES = 24
BATCH = 4
MIN_PRECISION = 0.8
MIN_RECALL = 0.8


def _ledger(deployment: Deployment, job_id: int) -> list[dict[str, Any]]:
    out = deployment.run("export", str(job_id), "--format", "jsonl").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _database_url(deployment: Deployment) -> str:
    return deployment.database_url or f"sqlite:///{deployment.data_dir / 'detq.db'}"


def _duplicate_detection_count(deployment: Deployment) -> int:
    engine = sa.create_engine(_database_url(deployment).replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "select count(*) from (select image_id, model_id, label_id, score, x1, y1 "
                        "from detections group by image_id, model_id, label_id, score, x1, y1 "
                        "having count(*) > 1) d"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_folder_end_to_end_against_ground_truth(deployment: Deployment, tmp_path: Path) -> None:
    images = tmp_path / "images"
    truth = load_ground_truth(write_dataset(images, IMAGES, seed=11))
    with running_worker(deployment, concurrency=2) as worker:
        # When a folder is enqueued and waited on
        status = deployment.run_json(
            "enqueue", str(images), "--pool", "cpu", "--batch-size", str(BATCH), "--wait", "--timeout", "240"
        )
        job_id = status["job_id"]
        # Then every image is done and detections landed in the database
        assert status["state"] == "finished"
        assert (status["total"], status["done"], status["pending"]) == (IMAGES, IMAGES, 0)
        assert status["failed"] == status["rejected"] == 0
        assert status["detections"] > 0
        ledger = _ledger(deployment, job_id)
        assert len(ledger) == IMAGES
        predictions = {
            Path(row["path"]).name: [
                PredictedBox(d["label_id"], d["score"], *d["box"]) for d in row["detections"]
            ]
            for row in ledger
        }
        precision, recall, *_ = precision_recall(truth, predictions, iou_threshold=0.5)
        assert precision >= MIN_PRECISION, precision
        assert recall >= MIN_RECALL, recall
        assert all(row["width"] and row["height"] for row in ledger)

        # And the model was loaded once per pool process, not once per task (6 batches, 2 processes)
        workers = {row["worker"] for row in ledger}
        assert 1 <= len(workers) <= 2
        assert worker.log().count(LOADED_MARK) == 2

        # When a batch is delivered a second time (a Redis redelivery, a retried publish)
        first_batch = [row["image_id"] for row in ledger[:BATCH]]
        settings = Settings(
            data_dir=deployment.data_dir,
            database_url=deployment.database_url,
            broker_url=deployment.broker_url,
        )
        app = make_celery_app(settings)
        app.send_task(TASK_PROCESS_BATCH, args=[job_id, first_batch], queue="cpu", routing_key="cpu")
        app.send_task(TASK_PROCESS_BATCH, args=[job_id, first_batch], queue="any", routing_key="any")
        worker.wait_for(f"{BATCH} already finished", count=2, timeout=60)
        app.close()

    # Then nothing was written twice
    again = deployment.run_json("status", str(job_id))
    assert again["detections"] == status["detections"]
    assert again["done"] == IMAGES
    assert _duplicate_detection_count(deployment) == 0
    assert all(row["attempts"] == 1 for row in _ledger(deployment, job_id))


def test_export_formats(embedded: Deployment, tmp_path: Path) -> None:
    images = tmp_path / "images"
    write_dataset(images, 6, seed=5)
    with running_worker(embedded, concurrency=1):
        status = embedded.run_json("enqueue", str(images), "--wait", "--timeout", "120")
    job = str(status["job_id"])
    dataset_path, results_path = tmp_path / "dataset.json", tmp_path / "results.json"
    embedded.run("export", job, "--format", "coco-dataset", "-o", str(dataset_path))
    embedded.run("export", job, "--format", "coco", "-o", str(results_path))
    coco = json.loads(dataset_path.read_text())
    assert len(coco["images"]) == 6
    assert {c["name"] for c in coco["categories"]} >= {"circle", "square", "triangle"}
    assert len(coco["annotations"]) == status["detections"]
    for ann in coco["annotations"]:
        x, y, w, h = ann["bbox"]
        assert w >= 0 and h >= 0 and 0 <= ann["score"] <= 1
    # The results form is what pycocotools' loadRes takes, against the dataset form as ground truth
    from pycocotools.coco import COCO

    truth = COCO(str(dataset_path))
    results = truth.loadRes(str(results_path))
    assert len(results.getAnnIds()) == status["detections"]
    assert sorted(results.getImgIds()) == sorted(image["id"] for image in coco["images"])
    rows = embedded.run("export", job, "--format", "csv").stdout.splitlines()
    assert rows[0].split(",")[:6] == ["job_id", "image_id", "path", "label_id", "label", "score"]
    assert len(rows) - 1 == status["detections"]


def test_enqueue_of_empty_folder_finishes_at_once(embedded: Deployment, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    status = embedded.run_json("enqueue", str(tmp_path / "empty"), "--wait", "--timeout", "10")
    assert (status["state"], status["total"]) == ("finished", 0)


def test_requeue_resends_only_pending_images(embedded: Deployment, tmp_path: Path) -> None:
    # Given a job queued while no worker runs, whose messages are then lost (the queue purged)
    images = tmp_path / "images"
    write_dataset(images, 5, seed=3)
    job = embedded.run_json("enqueue", str(images), "--batch-size", "2")["job_id"]
    for message in (embedded.data_dir / "broker" / "queue").glob("*.msg"):
        message.unlink()
    # When the pending images are re-sent and a worker runs
    sent = embedded.run_json("requeue", str(job))
    assert (sent["images"], sent["batches"]) == (5, 3)
    with running_worker(embedded, concurrency=1):
        deadline = time.monotonic() + 120
        while embedded.job_status(job)["state"] != "finished":
            assert time.monotonic() < deadline, "job did not finish after requeue"
            time.sleep(0.5)
    # Then every image finished exactly once
    assert embedded.run_json("status", str(job))["done"] == 5
    assert embedded.run_json("requeue", str(job))["images"] == 0


def _rows_pending(deployment: Deployment, job_id: int) -> int:
    engine = sa.create_engine(_database_url(deployment).replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            query = "select count(*) from images where job_id = :job and status = 'pending'"
            return int(conn.execute(sa.text(query), {"job": job_id}).scalar_one())
    finally:
        engine.dispose()


def test_a_job_cancelled_while_a_worker_runs_it_ends_with_each_image_once(
    deployment: Deployment, tmp_path: Path
) -> None:
    # Given a job of 48 images of about 0.1 s each running on a worker of two processes
    deployment.extra.update(FAST_HEALING)  # a reconciler pass every 2 s
    deployment.model = save_slow_model(tmp_path / "slow.pt", 100)
    images = write_images(tmp_path / "in", 48)
    before = digests(images)
    with running_worker(deployment, concurrency=2) as worker:
        job_id = deployment.run_json("enqueue", str(tmp_path / "in"), "--batch-size", "4")["job_id"]
        wait_until(lambda: deployment.job_status(job_id)["done"] >= 4, 120, "4 images done")
        # When it is cancelled
        cancelled = deployment.run_json("cancel", str(job_id))["cancelled"]
        status = deployment.job_status(job_id)
        # Then it is cancelled at once, and the worker takes no more of its images: the batches it was on
        # write nothing, the others find nothing to do
        assert (status["state"], status["pending"], status["cancelled"]) == ("cancelled", 0, cancelled)
        batch_lines = re.compile(rf"job {job_id}: batch of (\d+): ")

        def taken() -> int:  # images of the batches it finished (the queue's tail is cut in smaller ones)
            return sum(int(size) for size in batch_lines.findall(worker.log()))

        wait_until(lambda: taken() >= 48, 120, "all its batches taken")
        # And the reconciler writes the rows the cancel left
        wait_until(lambda: _rows_pending(deployment, job_id) == 0, 60, "its rows written cancelled")
        assert worker.proc.poll() is None
    # And each image ended once: done with its box as counted then, or cancelled with no box
    rows = _ledger(deployment, job_id)
    assert sorted(row["path"] for row in rows) == sorted(str(p) for p in images)
    done = [row for row in rows if row["status"] == "done"]
    assert {row["status"] for row in rows} <= {"done", "cancelled"} and 4 <= len(done) == status["done"]
    assert all(len(row["detections"]) == 1 for row in done)
    assert all(row["reason"] == "cancelled" and not row["detections"] for row in rows if row not in done)
    assert deployment.job_status(job_id) == status
    assert _duplicate_detection_count(deployment) == 0
    assert digests(images) == before
