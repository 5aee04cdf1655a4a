"""A folder's results as files: JSON lines, COCO results and dataset, annotated images, for `detq run`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from sqlalchemy.orm import Session

from db.export_repo import images_with_boxes
from db.history_repo import jobs_over_roots, latest_image_ids
from db.models import Image, ModelRecord
from detq.vocabulary import ImageStatus
from producer.annotate import annotate
from producer.coco import CocoDatasetWriter, class_names, coco_categories, coco_result, dumps
from producer.export import image_record
from producer.files import write_atomically


@dataclass(frozen=True)
class WrittenResults:
    """What `write_results` wrote."""

    images: int
    detections: int
    annotated: int
    files: list[str]
    not_annotated: int = 0  # with save_images: done images that could not be read to draw on


def write_results(
    session: Session, model: ModelRecord, roots: Sequence[str], out_dir: Path, *, save_images: bool
) -> WrittenResults:
    """Every image of these roots with its latest outcome under this model, across the runs over them.

    One pass over the images, a chunk at a time, writes the three files together (the dataset's
    annotations spooled, then appended after its images), so memory holds a chunk whatever the folder's
    size (a folder of 100,000 images of 10 boxes took 1.6 GB when they were all loaded first).
    """
    jobs = jobs_over_roots(session, model.id, roots)
    job_ids = [job.id for job in jobs]
    image_ids = latest_image_ids(session, job_ids)
    info = {"description": f"detq results of {', '.join(roots)}"}
    categories = coco_categories(class_names(session, model, job_ids))
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {"images": 0, "detections": 0, "annotated": 0, "not_annotated": 0}

    def write_all(lines: TextIO, results: TextIO, dataset_out: TextIO) -> None:
        with tempfile.TemporaryFile("w+", encoding="utf-8", dir=out_dir) as spool:
            dataset = CocoDatasetWriter(dataset_out, info, categories, spool)
            results.write("[")
            for image, boxes in images_with_boxes(session, image_ids):
                lines.write(dumps(image_record(image, boxes)) + "\n")
                counts["images"] += 1
                if image.status != ImageStatus.DONE:
                    continue
                dataset.add_image(image)
                dataset.add_boxes(image.id, boxes)
                for box in boxes:
                    results.write((", " if counts["detections"] else "") + dumps(coco_result(image.id, box)))
                    counts["detections"] += 1
                if save_images:
                    try:
                        annotate(Path(image.path), boxes, out_dir / "images" / _flat_name(image, roots))
                        counts["annotated"] += 1
                    except OSError:  # moved or unreadable since it ran: the results still hold it
                        counts["not_annotated"] += 1
            results.write("]\n")
            dataset.close()

    write_atomically(
        out_dir / "detections.jsonl",
        lambda lines: write_atomically(
            out_dir / "coco_results.json",
            lambda results: write_atomically(
                out_dir / "coco_dataset.json", lambda dataset: write_all(lines, results, dataset)
            ),
        ),
    )
    files = ["detections.jsonl", "coco_results.json", "coco_dataset.json"]
    if save_images:
        files.append("images/")
    return WrittenResults(
        images=counts["images"],
        detections=counts["detections"],
        annotated=counts["annotated"],
        files=files,
        not_annotated=counts["not_annotated"],
    )


def _flat_name(image: Image, roots: Sequence[str]) -> str:
    """The image's path under its root, folders joined with '__', as a .jpg name."""
    root = roots[image.root_index] if 0 <= image.root_index < len(roots) else ""
    relative = os.path.relpath(image.path, root) if root else os.path.basename(image.path)
    prefix = f"{image.root_index}__" if len(roots) > 1 else ""  # a.jpg of two roots stay apart
    return prefix + os.path.splitext(relative.replace(os.sep, "__"))[0] + ".jpg"
