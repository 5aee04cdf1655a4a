"""A folder's results as files: JSON lines, COCO results and dataset, annotated images, for `detq run`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.orm import Session

from db.export_repo import Box, boxes_of
from db.history_repo import jobs_over_roots, latest_images
from db.models import Image, ModelRecord
from detq.vocabulary import ImageStatus
from producer.annotate import annotate
from producer.export import class_names, coco_dataset, coco_result, image_record
from producer.files import write_atomically


@dataclass(frozen=True)
class WrittenResults:
    """What `write_results` wrote."""

    images: int
    detections: int
    annotated: int
    files: list[str]


def write_results(
    session: Session, model: ModelRecord, roots: Sequence[str], out_dir: Path, *, save_images: bool
) -> WrittenResults:
    """Every image of these roots with its latest outcome under this model, across the runs over them."""
    jobs = jobs_over_roots(session, model.id, roots)
    images = latest_images(session, [job.id for job in jobs])
    boxes = boxes_of(session, [image.id for image in images])
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / "detections.jsonl", lambda out: _write_lines(out, images, boxes))
    done = [(image, boxes.get(image.id, [])) for image in images if image.status == ImageStatus.DONE]
    results = [coco_result(image.id, det) for image, dets in done for det in dets]
    names = class_names(session, model, [job.id for job in jobs])
    dataset = coco_dataset(done, names, {"description": f"detq results of {', '.join(roots)}"})
    write_atomically(out_dir / "coco_results.json", lambda out: _write_json(out, results))
    write_atomically(out_dir / "coco_dataset.json", lambda out: _write_json(out, dataset))
    files = ["detections.jsonl", "coco_results.json", "coco_dataset.json"]
    annotated = 0
    if save_images:
        for image, dets in done:
            annotate(Path(image.path), dets, out_dir / "images" / _flat_name(image, roots))
            annotated += 1
        files.append("images/")
    return WrittenResults(images=len(images), detections=len(results), annotated=annotated, files=files)


def _write_lines(out: TextIO, images: Sequence[Image], boxes: dict[int, list[Box]]) -> None:
    for image in images:
        out.write(json.dumps(image_record(image, boxes.get(image.id, [])), ensure_ascii=False) + "\n")


def _write_json(out: TextIO, document: Any) -> None:
    json.dump(document, out, ensure_ascii=False)
    out.write("\n")


def _flat_name(image: Image, roots: Sequence[str]) -> str:
    """The image's path under its root, folders joined with '__', as a .jpg name."""
    root = roots[image.root_index] if 0 <= image.root_index < len(roots) else ""
    relative = os.path.relpath(image.path, root) if root else os.path.basename(image.path)
    prefix = f"{image.root_index}__" if len(roots) > 1 else ""  # a.jpg of two roots stay apart
    return prefix + os.path.splitext(relative.replace(os.sep, "__"))[0] + ".jpg"
