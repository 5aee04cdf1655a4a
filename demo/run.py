"""`detq demo`: generate shape images with ground truth, run CPU workers over them, score and summarise."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.orm import Session, sessionmaker

from db.export_repo import iter_ledger
from db.ledger import open_ledger
from demo.scoring import PredictedBox, precision_recall
from demo.shapes import CLASSES, GroundTruthBox, load_ground_truth, write_dataset
from detq.celery_app import make_celery_app
from detq.host import usable_cores
from detq.settings import Settings
from detq.vocabulary import ImageStatus, JobPool, WorkerPool
from producer.annotate import annotate
from producer.enqueue import enqueue_folders
from producer.export import export_coco_results
from producer.local_workers import LocalWorkers
from producer.progress import wait_with_progress
from producer.status import JobStatus, job_status

ANNOTATED_IMAGES = 6


def run_demo(
    settings: Settings, *, images: int, out_dir: Path, workers: int | None, seed: int, as_json: bool = False
) -> int:
    """The whole demo; returns an exit code. as_json: the summary as one JSON object on standard output,
    what it says to people on standard error."""
    say = sys.stderr if as_json else sys.stdout
    out_dir = out_dir.resolve()
    image_dir = out_dir / "images"
    annotated_dir = out_dir / "annotated"
    for folder in (image_dir, annotated_dir):
        folder.mkdir(parents=True, exist_ok=True)
    processes = workers or usable_cores()
    print(f"detq demo: generating {images} images with ground truth in {image_dir}", file=say)
    truth_path = write_dataset(image_dir, images, seed)
    truth = load_ground_truth(truth_path)

    with open_ledger(settings) as led:
        code, summary = _run(settings, led.sessions, processes, image_dir, truth, out_dir, annotated_dir, say)
    if as_json:
        print(json.dumps(summary))
    return code


def _run(
    settings: Settings,
    factory: sessionmaker[Session],
    processes: int,
    image_dir: Path,
    truth: dict[str, list[GroundTruthBox]],
    out_dir: Path,
    annotated_dir: Path,
    say: TextIO,
) -> tuple[int, dict[str, Any]]:
    log_path = out_dir / "worker.log"
    print(f"detq demo: starting {processes} CPU worker processes (log: {log_path})", file=say)
    workers = LocalWorkers(settings, WorkerPool.CPU, processes, log_path)
    try:
        workers.start()
        workers.wait_ready()
        began = time.monotonic()
        result = enqueue_folders(
            factory,
            make_celery_app(settings),
            roots=[image_dir],
            model_path=settings.model,
            pool=JobPool.CPU,
            batch_size=settings.batch_size,
            worker_timeout_s=settings.worker_timeout,
        )
        print(f"detq demo: job {result.job_id}: {result.total} images in {result.batches} batches", file=say)

        def poll() -> JobStatus:
            workers.check_alive()
            with factory() as session:
                return job_status(session, result.job_id)

        final = wait_with_progress(poll, stream=say, timeout_s=1800)
        elapsed = time.monotonic() - began
    finally:
        workers.stop()
    return _summarise(factory, result.job_id, final, elapsed, truth, out_dir, annotated_dir, say)


def _summarise(
    factory: sessionmaker[Session],
    job_id: int,
    final: JobStatus,
    elapsed: float,
    truth: dict[str, list[GroundTruthBox]],
    out_dir: Path,
    annotated_dir: Path,
    say: TextIO,
) -> tuple[int, dict[str, Any]]:
    predictions: dict[str, list[PredictedBox]] = {}
    per_class: Counter[str] = Counter()
    drawn = 0
    with factory() as session:
        for image, detections in iter_ledger(session, job_id):
            name = Path(image.path).name
            predictions[name] = [
                PredictedBox(label_id=d.label_id, score=d.score, x1=d.x1, y1=d.y1, x2=d.x2, y2=d.y2)
                for d in detections
            ]
            per_class.update(d.label for d in detections)
            if drawn < ANNOTATED_IMAGES and image.status == ImageStatus.DONE:
                drawn += annotate(Path(image.path), detections, annotated_dir / name)
        coco_path = out_dir / "detections_coco.json"
        with coco_path.open("w", encoding="utf-8") as handle:
            export_coco_results(session, job_id, handle)
    precision, recall, tp, fp, fn = precision_recall(truth, predictions, iou_threshold=0.5)
    finished = final.done + final.failed + final.rejected
    per_class_counts = {name: per_class.get(name, 0) for name in CLASSES}
    summary: dict[str, Any] = {
        "job_id": job_id,
        "images": final.total,
        "done": final.done,
        "failed": final.failed,
        "rejected": final.rejected,
        "detections": final.detections,
        "per_class": per_class_counts,
        "precision@0.5": round(precision, 4),
        "recall@0.5": round(recall, 4),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "seconds": round(elapsed, 2),
        "images_per_s": round(finished / elapsed, 2) if elapsed > 0 else None,
    }
    print(file=say)
    print("detq demo summary", file=say)
    print(
        f"  images       {final.total} ({final.done} done, {final.failed} failed, {final.rejected} rejected)",
        file=say,
    )
    print(f"  detections   {final.detections}", file=say)
    for name, count in per_class_counts.items():
        print(f"    {name:<10} {count}", file=say)
    print(
        f"  precision    {precision:.3f}  recall {recall:.3f}  (IoU 0.5; tp {tp}, fp {fp}, fn {fn})", file=say
    )
    print(f"  throughput   {summary['images_per_s']} images/s over {elapsed:.1f} s", file=say)
    print(f"  COCO JSON    {coco_path}", file=say)
    print(f"  annotated    {annotated_dir} ({drawn} images)", file=say)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return (0 if final.pending == 0 and final.done > 0 else 1), summary
