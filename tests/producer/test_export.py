"""Exports on real ledgers: each format's rows, another job's boxes kept out, the COCO dataset streamed."""

from __future__ import annotations

import io
import json
from functools import partial
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db.export_repo import iter_ledger
from db.images_repo import DetectionRow, ImageResult, NewImage, finalise_results, insert_images
from db.jobs_repo import create_job, get_job, get_or_create_model
from db.models import Image
from detq.vocabulary import ExportFormat, ImageStatus
from producer.coco import class_names, coco_annotation, coco_categories, coco_image
from producer.export import PASSES, export_job
from tests.ledger_support import done_results


def _interleaved_jobs(factory: sessionmaker[Session]) -> tuple[int, int]:
    """Job A of four images (three done with 1, 2 and 3 boxes, one failed) whose ids enclose job B's two
    done images of 5 boxes each: (A, B)."""
    with factory() as session, session.begin():
        model = get_or_create_model(session, sha256="e" * 64, path="/m.pt", size_bytes=1, meta={})
        a = create_job(session, model_id=model.id, roots=["/a"], pool="cpu", batch_size=4).id
        b = create_job(session, model_id=model.id, roots=["/b"], pool="cpu", batch_size=4).id
        ids_a = insert_images(session, a, [NewImage(f"/a/{i}.jpg", 1, 1.0) for i in range(2)])
        ids_b = insert_images(session, b, [NewImage(f"/b/{i}.jpg", 1, 1.0) for i in range(2)])
        ids_a += insert_images(session, a, [NewImage(f"/a/{i}.jpg", 1, 1.0) for i in range(2, 4)])
        assert ids_a[1] < ids_b[0] < ids_b[1] < ids_a[2]
        for boxes, image_id in enumerate(ids_a[:3], start=1):
            finalise_results(session, a, model.id, done_results([image_id], boxes), worker="w", device="cpu")
        failed = ImageResult(ids_a[3], ImageStatus.FAILED, reason="truncated")
        finalise_results(session, a, model.id, [failed], worker="w", device="cpu")
        finalise_results(session, b, model.id, done_results(ids_b, 5), worker="w", device="cpu")
    return a, b


def coco_dataset(
    done: list[tuple[Image, list[DetectionRow]]], names: dict[int, str], info: dict[str, Any]
) -> dict[str, Any]:
    """The COCO dataset document built whole in memory, as the export was before it streamed."""
    boxes = ((image.id, det) for image, dets in done for det in dets)
    return {
        "info": info,
        "images": [coco_image(image) for image, _ in done],
        "categories": coco_categories(names),
        "annotations": [coco_annotation(i, det, n) for n, (i, det) in enumerate(boxes, start=1)],
    }


def _export(factory: sessionmaker[Session], job_id: int, fmt: ExportFormat) -> tuple[int, str]:
    out = io.StringIO()
    with factory() as session:
        written = export_job(session, job_id, fmt, out)
    return written, out.getvalue()


def test_each_format_has_the_jobs_own_boxes_only(factory: sessionmaker[Session]) -> None:
    a, _ = _interleaved_jobs(factory)
    # JSON lines: a line per image of A with its own boxes (B's ten, read in the same id range, left out)
    lines, text = _export(factory, a, ExportFormat.JSONL)
    records = [json.loads(line) for line in text.splitlines()]
    assert lines == 4 and [len(r["detections"]) for r in records] == [1, 2, 3, 0]
    assert [r["status"] for r in records] == ["done", "done", "done", "failed"]
    assert {d["label"] for r in records for d in r["detections"]} == {"dog"}
    # CSV and COCO results: a row per box of A
    rows, text = _export(factory, a, ExportFormat.CSV)
    assert rows == 6 and len(text.splitlines()) == 7
    results, text = _export(factory, a, ExportFormat.COCO)
    assert results == 6 and len(json.loads(text)) == 6


def test_the_streamed_coco_dataset_is_the_document_json_dump_writes(factory: sessionmaker[Session]) -> None:
    a, b = _interleaved_jobs(factory)
    for job_id, images, boxes in ((a, 3, 6), (b, 2, 10)):
        # Given the whole document built in memory, as it was written before
        with factory() as session:
            done = [(i, d) for i, d in iter_ledger(session, job_id) if i.status == ImageStatus.DONE]
            found = get_job(session, job_id)
            assert found is not None
            job_spec = found.model
            info = {"description": f"detq job {job_id}", "model_sha256": job_spec.sha256}
            info["settings"] = found.settings  # what its results are made with
            document = coco_dataset(done, class_names(session, job_spec, [job_id]), info)
        # When it is exported, Then the text is json.dump's, byte for byte, with annotations numbered 1..n
        count, text = _export(factory, job_id, ExportFormat.COCO_DATASET)
        assert text == json.dumps(document, ensure_ascii=False) + "\n"
        parsed = json.loads(text)
        assert (len(parsed["images"]), count) == (images, boxes)
        assert [ann["id"] for ann in parsed["annotations"]] == list(range(1, boxes + 1))
        assert parsed["categories"] == [{"id": 2, "name": "dog"}]


def test_a_job_with_no_finished_image_is_an_empty_coco_dataset(factory: sessionmaker[Session]) -> None:
    with factory() as session, session.begin():
        model = get_or_create_model(session, sha256="f" * 64, path="/m.pt", size_bytes=1, meta={})
        job = create_job(session, model_id=model.id, roots=["/c"], pool="cpu", batch_size=4).id
        insert_images(session, job, [NewImage("/c/x.jpg", 1, 1.0)])
    count, text = _export(factory, job, ExportFormat.COCO_DATASET)
    parsed = json.loads(text)
    assert (count, parsed["images"], parsed["annotations"], parsed["categories"]) == (0, [], [], [])


def test_progress_is_told_once_per_image_read_and_twice_for_the_coco_dataset(
    factory: sessionmaker[Session],
) -> None:
    a, _ = _interleaved_jobs(factory)
    for fmt in ExportFormat:
        reads: list[None] = []
        with factory() as session:
            export_job(session, a, fmt, io.StringIO(), partial(reads.append, None))
        assert len(reads) == 4 * PASSES.get(fmt, 1), fmt
