"""`detq run`'s result files on real ledgers: the latest row of each path across runs, files that agree."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest
from PIL import Image
from sqlalchemy.orm import Session, sessionmaker

from db.images_repo import ImageResult, NewImage, finalise_results, insert_images
from db.job_counts_repo import RunActivity
from db.jobs_repo import create_job, get_or_create_model
from db.models import ModelRecord
from detq.errors import DetqError
from detq.inference_settings import DEFAULT_KEY
from detq.vocabulary import ImageStatus
from producer.results import (
    AnnotatedCopies,
    WrittenResults,
    check_copies_folder,
    folder_exit_code,
    run_summary_lines,
    write_results,
)
from tests.ledger_support import done_results
from tests.support import write_jpeg


class ImageRow(NamedTuple):
    """What a copy's path is made of: an image's path and its root."""

    path: str
    root_index: int


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
        written = write_results(session, (record, DEFAULT_KEY), [str(root)], out, save_images=True)
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
    # And report.html lists the same latest row of each image, across both runs, each drawn image linked
    # to its copy (relative to the report) and the moved one to its file
    page = (out / "report.html").read_text()
    assert "report.html" in written.files and "results of</td><td>job 2, job 1 (each image" in page
    listed = [json.loads(line) for line in page.split('id="report-images">')[1].split("</script>")[0].split()]
    assert [(row["n"], row["s"], row["k"], row["a"]) for row in listed] == [
        ("a.jpg", "done", 2, "images/a.jpg"),
        ("b.jpg", "done", 4, "images/b.jpg"),
        ("c.jpg", "done", 1, "images/c.jpg"),
        ("gone.jpg", "done", 3, ""),
    ]
    assert listed[3]["u"] == Path(paths[3]).as_uri()


def test_annotated_copies_keep_the_folders_layout_and_never_overwrite_each_other(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    # Given a folder whose names collide once flattened or stripped of their suffix
    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    names = ["a.jpg", "a.png", "sub/x.jpg", "sub__x.jpg"]
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]
    for name, colour in zip(names, colours, strict=True):
        Image.new("RGB", (64, 48), colour).save(root / name)
    with factory() as session, session.begin():
        model = get_or_create_model(session, sha256="e" * 64, path="/m.pt", size_bytes=1, meta={})
        job = create_job(session, model_id=model.id, roots=[str(root)], pool="cpu", batch_size=4).id
        ids = insert_images(session, job, [NewImage(str(root / n), 1, 1.0) for n in names])
        finalise_results(session, job, model.id, done_results(ids, 0), worker="w", device="cpu")
    out = tmp_path / "results"
    # When the results are written with annotated copies
    with factory() as session:
        written = write_results(
            session, (session.get_one(ModelRecord, model.id), DEFAULT_KEY), [str(root)], out, save_images=True
        )
    # Then there are four copies, each at its image's path under images/, in its format, with its pixels
    assert written.annotated == 4
    copies = sorted(str(p.relative_to(out / "images")) for p in (out / "images").rglob("*") if p.is_file())
    assert copies == sorted(names)
    for name, colour in zip(names, colours, strict=True):
        with Image.open(out / "images" / name) as copy:
            assert copy.format == ("PNG" if name.endswith(".png") else "JPEG")
            pixel = copy.convert("RGB").getpixel((32, 24))
            assert isinstance(pixel, tuple)
            assert max(abs(a - b) for a, b in zip(pixel, colour, strict=True)) < 12


def test_copies_of_several_roots_lie_under_each_roots_name(tmp_path: Path) -> None:
    roots = [str(tmp_path / "a" / "cam"), str(tmp_path / "b" / "cam"), str(tmp_path / "day")]
    copies = AnnotatedCopies(tmp_path / "out" / "images", roots)
    image = ImageRow(path=str(tmp_path / "b" / "cam" / "x.jpg"), root_index=1)
    assert copies.path_of(image) == tmp_path / "out" / "images" / "cam-2" / "x.jpg"  # type: ignore[arg-type]
    image = ImageRow(path=str(tmp_path / "day" / "x.jpg"), root_index=2)
    assert copies.path_of(image) == tmp_path / "out" / "images" / "day" / "x.jpg"  # type: ignore[arg-type]


def test_an_out_folder_whose_copies_would_land_in_the_input_is_refused(tmp_path: Path) -> None:
    photos = tmp_path / "data" / "images"
    photos.mkdir(parents=True)
    with pytest.raises(DetqError, match="overlaps"):
        check_copies_folder(tmp_path / "data", [photos])  # images/ is the input folder itself
    with pytest.raises(DetqError, match="overlaps"):
        check_copies_folder(photos / "results", [photos])  # copies a later scan would take for photos
    check_copies_folder(tmp_path / "results", [photos])


def test_the_closing_words_say_what_the_run_did_and_what_the_folder_holds(tmp_path: Path) -> None:
    began = datetime(2026, 12, 7, tzinfo=UTC)
    written = WrittenResults(
        images=126,
        detections=270,
        annotated=0,
        files=["detections.jsonl"],
        statuses={"done": 32, "pending": 90, "failed": 4},
        reasons=[("cannot read file: EIO", 4)],
    )
    # Given a run interrupted after 32 images in 16 s
    run = RunActivity(done=32, first_claim=began, last_finish=began + timedelta(seconds=16))
    lines = run_summary_lines(run, written, tmp_path)
    # Then it says what it did, at its own rate, and what the folder holds, pending ones included
    assert lines[0] == "this run: 32 done, 0 failed, 0 rejected in 16s (2.0 images/s)"
    assert lines[1] == "the folder: 126 images: 32 done, 4 failed, 90 pending; 270 detections"
    assert lines[3].split() == ["4", "x", "cannot", "read", "file:", "EIO"]
    assert folder_exit_code(written) == 4
    # And a rerun that had nothing to do says so; a folder of done images exits 0
    assert run_summary_lines(RunActivity(), written, tmp_path)[0] == "this run: no image to process"
    assert folder_exit_code(WrittenResults(2, 0, 0, [], statuses={"done": 2})) == 0
