"""Export a job's ledger: CSV (a row per detection), JSON lines (a line per image), COCO."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from typing import Any, TextIO, TypeVar

from sqlalchemy.orm import Session

from db.export_repo import iter_ledger
from db.images_repo import DetectionRow
from db.jobs_repo import get_job
from db.models import Image
from detq.vocabulary import ExportFormat, ImageStatus
from producer.coco import CocoDatasetWriter, class_names, coco_categories, coco_result
from producer.status import JobNotFound

T = TypeVar("T")

CSV_COLUMNS = ("job_id", "image_id", "path", "label_id", "label", "score", "x1", "y1", "x2", "y2")


def _detection_dict(det: DetectionRow) -> dict[str, Any]:
    return {
        "label": det.label,
        "label_id": det.label_id,
        "score": round(det.score, 6),
        "box": [round(det.x1, 2), round(det.y1, 2), round(det.x2, 2), round(det.y2, 2)],
    }


def image_record(image: Image, detections: list[DetectionRow]) -> dict[str, Any]:
    """The per-image ledger line of the jsonl export."""
    return {
        "image_id": image.id,
        "job_id": image.job_id,
        "path": image.path,
        "status": image.status,
        "reason": image.reason,
        "width": image.width,
        "height": image.height,
        "worker": image.worker,
        "device": image.device,
        "attempts": image.attempts,
        "decode_ms": image.decode_ms,
        "infer_ms": image.infer_ms,
        "detections": [_detection_dict(d) for d in detections],
    }


Progress = Callable[[], None]  # called once per image read, for a progress display


def _counted(items: Iterator[T], progress: Progress | None) -> Iterator[T]:
    for item in items:
        if progress is not None:
            progress()
        yield item


def export_jsonl(session: Session, job_id: int, out: TextIO, progress: Progress | None = None) -> int:
    """Write one JSON object per image; returns the number of lines."""
    lines = 0
    for image, detections in _counted(iter_ledger(session, job_id), progress):
        out.write(json.dumps(image_record(image, detections), ensure_ascii=False) + "\n")
        lines += 1
    return lines


def export_csv(session: Session, job_id: int, out: TextIO, progress: Progress | None = None) -> int:
    """Write a header and one row per detection; returns the number of rows."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    rows = 0
    for image, detections in _counted(iter_ledger(session, job_id), progress):
        for det in detections:
            writer.writerow(
                [
                    job_id,
                    image.id,
                    image.path,
                    det.label_id,
                    det.label,
                    f"{det.score:.6f}",
                    f"{det.x1:.2f}",
                    f"{det.y1:.2f}",
                    f"{det.x2:.2f}",
                    f"{det.y2:.2f}",
                ]
            )
            rows += 1
    return rows


def export_coco_dataset(session: Session, job_id: int, out: TextIO, progress: Progress | None = None) -> int:
    """Write a job's COCO dataset form (images that finished, categories by label id, annotations with
    bbox [x, y, w, h] and their scores), as json.dump writes it, streamed in two passes over the job: its
    images, then its boxes. Returns the number of annotations."""
    job = get_job(session, job_id)
    if job is None:
        raise JobNotFound(f"no job {job_id}")
    info: dict[str, Any] = {"description": f"detq job {job_id}", "model_sha256": job.model.sha256}
    if job.settings is not None:
        info["settings"] = job.settings  # what its results are made with (detq.inference_settings)
    dataset = CocoDatasetWriter(out, info, coco_categories(class_names(session, job.model, [job_id])))
    for image, _ in _counted(iter_ledger(session, job_id, boxes=False), progress):
        if image.status == ImageStatus.DONE:
            dataset.add_image(image)
    dataset.end_images()
    for image, detections in _counted(iter_ledger(session, job_id), progress):
        if image.status == ImageStatus.DONE:
            dataset.add_boxes(image.id, detections)
    dataset.close()
    return dataset.annotations


def export_coco_results(session: Session, job_id: int, out: TextIO, progress: Progress | None = None) -> int:
    """Write COCO results, the list pycocotools' loadRes takes: image_id, category_id, bbox [x, y, w, h],
    score per detection, streamed; returns how many."""
    count = 0
    out.write("[")
    for image, detections in _counted(iter_ledger(session, job_id), progress):
        if image.status != ImageStatus.DONE:
            continue
        for det in detections:
            out.write(("," if count else "") + "\n" + json.dumps(coco_result(image.id, det)))
            count += 1
    out.write("\n]\n")
    return count


# Times a format reads each image: the COCO dataset reads them twice (its images, then its boxes).
PASSES = {ExportFormat.COCO_DATASET: 2}


def export_job(
    session: Session, job_id: int, fmt: ExportFormat, out: TextIO, progress: Progress | None = None
) -> int:
    """Write the job's results in this format; returns how many records were written. progress is called
    once per image read, PASSES[fmt] (default 1) times per image of the job."""
    if get_job(session, job_id) is None:
        raise JobNotFound(f"no job {job_id}")
    writers = {
        ExportFormat.CSV: export_csv,
        ExportFormat.JSONL: export_jsonl,
        ExportFormat.COCO: export_coco_results,
        ExportFormat.COCO_DATASET: export_coco_dataset,
    }
    return writers[ExportFormat(fmt)](session, job_id, out, progress)
