"""`detq run`'s result files on real ledgers: the latest row of each path across runs, files that agree."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from db.images_repo import ImageResult, NewImage, finalise_results, insert_images
from db.jobs_repo import create_job, get_or_create_model
from db.models import ModelRecord
from detq.vocabulary import ImageStatus
from producer.results import write_results
from tests.ledger_support import done_results
from tests.support import write_jpeg


def test_results_hold_each_paths_latest_row_and_the_files_agree(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    for name in ("a", "b", "c"):
        write_jpeg(root / f"{name}.jpg", (64, 48))
    paths = [str(root / f"{name}.jpg") for name in ("a", "b", "c", "gone")]
    with factory() as session, session.begin():
        model = get_or_create_model(session, sha256="d" * 64, path="/m.pt", size_bytes=1, meta={})
        # Given a first run: a done with 2 boxes, b failed, c done with 1 box, gone done with 3 (then moved)
        first = create_job(session, model_id=model.id, roots=[str(root)], pool="cpu", batch_size=4).id
        ids = insert_images(session, first, [NewImage(p, 1, 1.0) for p in paths])
        results = [*done_results([ids[0]], 2), ImageResult(ids[1], ImageStatus.FAILED, reason="truncated")]
        results += [*done_results([ids[2]], 1), *done_results([ids[3]], 3)]
        finalise_results(session, first, model.id, results, worker="w", device="cpu")
        # And a second run: b again, now done with 4 boxes, and c again, still pending
        second = create_job(session, model_id=model.id, roots=[str(root)], pool="cpu", batch_size=4).id
        again = insert_images(session, second, [NewImage(p, 1, 1.0) for p in paths[1:3]])
        finalise_results(session, second, model.id, done_results([again[0]], 4), worker="w", device="cpu")
    out = tmp_path / "results"
    # When the results are written, with annotated copies
    with factory() as session:
        record = session.get_one(ModelRecord, model.id)
        written = write_results(session, record, [str(root)], out, save_images=True)
    # Then each path has one line, in path order: the newest finished row (b from the second run, c from
    # the first: its second row is still pending)
    lines = [json.loads(line) for line in (out / "detections.jsonl").read_text().splitlines()]
    assert [(Path(r["path"]).name, r["status"], len(r["detections"])) for r in lines] == [
        ("a.jpg", "done", 2),
        ("b.jpg", "done", 4),
        ("c.jpg", "done", 1),
        ("gone.jpg", "done", 3),
    ]
    assert [r["job_id"] for r in lines] == [first, second, first, first]
    # And the COCO files hold the same boxes: results as pycocotools takes them, the dataset numbered 1..n
    coco_results = json.loads((out / "coco_results.json").read_text())
    dataset = json.loads((out / "coco_dataset.json").read_text())
    assert len(coco_results) == len(dataset["annotations"]) == written.detections == 10
    assert [a["id"] for a in dataset["annotations"]] == list(range(1, 11))
    assert [i["id"] for i in dataset["images"]] == [r["image_id"] for r in lines]
    assert dataset["categories"] == [{"id": 2, "name": "dog"}]
    # And the image that moved away is counted, not drawn, and stops nothing
    assert (written.images, written.annotated, written.not_annotated) == (4, 3, 1)
    assert sorted(p.name for p in (out / "images").iterdir()) == ["a.jpg", "b.jpg", "c.jpg"]
