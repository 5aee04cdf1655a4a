"""A folder's results as files: JSON lines, COCO results and dataset, annotated images, for `detq run`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from db.history_repo import detections_of, jobs_over_roots, latest_images
from db.images_repo import label_names
from db.models import Image, ModelRecord
from detq.vocabulary import ImageStatus
from producer.annotate import annotate
from producer.export import image_record


@dataclass(frozen=True)
class WrittenResults:
    """What `write_results` wrote."""

    images: int
    detections: int
    annotated: int
    files: list[str]


def _atomic_json_lines(path: Path, lines: Sequence[str]) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(partial, path)


def _atomic_json(path: Path, document: Any) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(document, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, path)


def write_results(
    session: Session, model: ModelRecord, roots: Sequence[str], out_dir: Path, *, save_images: bool
) -> WrittenResults:
    """Every image of these roots with its latest outcome under this model, across the runs over them."""
    jobs = jobs_over_roots(session, model.id, roots)
    images = latest_images(session, [job.id for job in jobs])
    boxes = detections_of(session, [image.id for image in images])
    out_dir.mkdir(parents=True, exist_ok=True)
    records = [
        json.dumps(image_record(image, boxes.get(image.id, [])), ensure_ascii=False) for image in images
    ]
    _atomic_json_lines(out_dir / "detections.jsonl", records)
    names = _class_names(session, model, [job.id for job in jobs])
    done = [image for image in images if image.status == ImageStatus.DONE]
    results = [_coco_result(image.id, det) for image in done for det in boxes.get(image.id, [])]
    _atomic_json(out_dir / "coco_results.json", results)
    _atomic_json(
        out_dir / "coco_dataset.json",
        {
            "images": [{"id": i.id, "file_name": i.path, "width": i.width, "height": i.height} for i in done],
            "categories": [{"id": k, "name": v} for k, v in sorted(names.items())],
            "annotations": [
                dict(r, id=n + 1, area=r["bbox"][2] * r["bbox"][3], iscrowd=0) for n, r in enumerate(results)
            ],
        },
    )
    files = ["detections.jsonl", "coco_results.json", "coco_dataset.json"]
    annotated = 0
    if save_images:
        for image in done:
            annotate(Path(image.path), boxes.get(image.id, []), out_dir / "images" / _flat_name(image, roots))
            annotated += 1
        files.append("images/")
    return WrittenResults(images=len(images), detections=len(results), annotated=annotated, files=files)


def _coco_result(image_id: int, det: Any) -> dict[str, Any]:
    w, h = det.x2 - det.x1, det.y2 - det.y1
    return {
        "image_id": image_id,
        "category_id": det.label_id,
        "bbox": [round(det.x1, 2), round(det.y1, 2), round(w, 2), round(h, 2)],
        "score": round(det.score, 6),
    }


def _class_names(session: Session, model: ModelRecord, job_ids: Sequence[int]) -> dict[int, str]:
    names: dict[int, str] = {}
    classes = model.meta.get("classes") if isinstance(model.meta, dict) else None
    if isinstance(classes, list):
        names.update({i: str(name) for i, name in enumerate(classes)})
    for job_id in job_ids:
        names.update(label_names(session, job_id))
    return names


def _flat_name(image: Image, roots: Sequence[str]) -> str:
    """The image's path under its root, folders joined with '__', as a .jpg name."""
    root = roots[image.root_index] if 0 <= image.root_index < len(roots) else ""
    relative = os.path.relpath(image.path, root) if root else os.path.basename(image.path)
    prefix = f"{image.root_index}__" if len(roots) > 1 else ""  # a.jpg of two roots stay apart
    return prefix + os.path.splitext(relative.replace(os.sep, "__"))[0] + ".jpg"
