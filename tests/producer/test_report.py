"""The HTML report of a real job renders in headless Chromium: images, charts, no console errors."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from PIL import Image

from db.images_repo import DetectionRow, ImageResult, NewImage, insert_images, record_results
from db.jobs_repo import create_job, finish_enqueue, get_or_create_model
from db.ledger import Ledger, open_ledger
from detq.settings import Settings
from detq.vocabulary import ImageStatus
from producer.report import THUMBNAIL_TRIES, render_report, throughput_series
from tests.conftest import service_missing


@pytest.fixture()
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = open_ledger(Settings(_env_file=None, data_dir=tmp_path / "data"))
    yield opened
    opened.close()


def _job(ledger: Ledger, folder: Path) -> int:
    """A finished job of six images: five done with two boxes each (two classes), one failed."""
    folder.mkdir()
    names = [f"{i}.png" for i in range(6)]
    for i, name in enumerate(names):
        Image.new("RGB", (200, 150), (40 * i, 120, 200 - 30 * i)).save(folder / name)
    with ledger.sessions() as s, s.begin():
        model = get_or_create_model(
            s, sha256="e" * 64, path="/m.pt", size_bytes=1, meta={"classes": ["cat", "dog"]}
        )
        job = create_job(s, model_id=model.id, roots=[str(folder)], pool="cpu", batch_size=8)
        ids = insert_images(s, job.id, [NewImage(str(folder / n), 1, 1.0, 0) for n in names])
        boxes = (
            DetectionRow(0, "cat", 0.91, 10, 10, 80, 70),
            DetectionRow(1, "dog", 0.42, 90, 40, 190, 140),
        )
        results = [
            ImageResult(image_id=i, status=ImageStatus.DONE, width=200, height=150, detections=boxes)
            for i in ids[:5]
        ]
        results.append(ImageResult(image_id=ids[5], status=ImageStatus.FAILED, reason="cannot decode image"))
        record_results(s, job.id, model.id, results, worker="host:1", device="cpu")
        finish_enqueue(s, job.id, len(ids))
        return job.id


def test_the_report_holds_every_section_and_inlines_its_images(ledger: Ledger, tmp_path: Path) -> None:
    job_id = _job(ledger, tmp_path / "images")
    with ledger.sessions() as session:
        page = render_report(session, job_id)
    assert page.count("data:image/jpeg;base64,") == 5
    for text in ("detq job 1", "Detections per class", "cat", "dog", "Scores", "Throughput per worker"):
        assert text in page
    assert "cannot decode image" in page
    assert "m.pt (/m.pt; sha256 eeeeeeeeeeeeeeee); classes: cat, dog" in page  # the model by its name
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")


def test_a_job_whose_files_moved_away_is_reported_without_opening_each_one(
    ledger: Ledger, tmp_path: Path
) -> None:
    # Given a job of done images with boxes, all moved away but the last, which lies past the images tried
    folder = tmp_path / "moved"
    folder.mkdir()
    names = [f"{i:03d}.png" for i in range(THUMBNAIL_TRIES + 1)]
    Image.new("RGB", (64, 48), (10, 120, 200)).save(folder / names[-1])
    box = (DetectionRow(0, "cat", 0.9, 1, 1, 30, 30),)
    with ledger.sessions() as s, s.begin():
        model = get_or_create_model(s, sha256="f" * 64, path="/m.pt", size_bytes=1, meta={})
        job = create_job(s, model_id=model.id, roots=[str(folder)], pool="cpu", batch_size=8).id
        ids = insert_images(s, job, [NewImage(str(folder / n), 1, 1.0, 0) for n in names])
        done = [ImageResult(i, ImageStatus.DONE, width=64, height=48, detections=box) for i in ids]
        record_results(s, job, model.id, done, worker="host:1", device="cpu")
        finish_enqueue(s, job, len(ids))
    # When its report renders, Then it gives up on thumbnails after THUMBNAIL_TRIES images, and says the rest
    with ledger.sessions() as session:
        page = render_report(session, job)
    assert "data:image/jpeg;base64," not in page
    assert f"{len(names)}: {len(names)} done" in page


def test_the_report_renders_in_headless_chromium(ledger: Ledger, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        service_missing("chromium", FileNotFoundError("chromium not on PATH (apt-get install chromium)"))
    job_id = _job(ledger, tmp_path / "images")
    with ledger.sessions() as session:
        (tmp_path / "report.html").write_text(render_report(session, job_id), encoding="utf-8")
    shot = tmp_path / "report.png"
    # When Chromium opens the page and takes a screenshot, logging the page's console to stderr
    done = subprocess.run(
        [
            str(browser),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1100,1800",
            f"--screenshot={shot}",
            (tmp_path / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Then the screenshot shows the page, with the colours of its thumbnails and charts, and no errors
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Failed to load" in line]
    assert console == []
    with Image.open(shot) as picture:
        colours = picture.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, "the page is blank or has no pictures"


def test_render_draws_each_done_image_and_report_writes_one_file(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from detq.cli.main import main
    from detq.settings import get_settings

    # Given a job of five done images and one failed, in the ledger `detq` reads
    job_id = _job(ledger, tmp_path / "images")
    monkeypatch.setenv("DETQ_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    try:
        # When its images are rendered and its report written
        assert main(["render", str(job_id), "--out", str(tmp_path / "drawn"), "--json"]) == 0
        rendered = capsys.readouterr().out
        assert main(["report", str(job_id), "-o", str(tmp_path / "report.html")]) == 0
        assert main(["report", "99", "-o", str(tmp_path / "other.html")]) == 1
    finally:
        get_settings.cache_clear()
    # Then each done image has an annotated copy with its boxes drawn in the class colours
    assert '"written": 5' in rendered
    drawn = sorted((tmp_path / "drawn").glob("*.jpg"))
    assert len(drawn) == 5
    with Image.open(drawn[0]) as picture:
        red = picture.convert("RGB").getpixel((10, 40))  # on the left edge of the cat's box
    assert red[0] > red[1] + 60 and red[0] > red[2] + 60  # the first palette colour, #ff3b30, after JPEG
    assert (tmp_path / "report.html").read_text().startswith("<!doctype html>")
    assert not (tmp_path / "other.html").exists()


def test_throughput_buckets_times_in_any_order_over_the_jobs_span() -> None:
    start = datetime(2026, 12, 5, 2, tzinfo=UTC)
    at = [start + timedelta(seconds=s) for s in (0, 1, 9, 10, 11, 39, 40)]
    times = [("w1", at[3]), ("w2", at[0]), ("w1", at[6]), ("w1", at[1]), ("w2", at[5]), ("w1", at[2])]
    series, bucket_s = throughput_series(iter(times), (start, at[6]), buckets=4)
    assert bucket_s == 10.0
    assert series == {"w1": [0.2, 0.1, 0.0, 0.1], "w2": [0.1, 0.0, 0.0, 0.1]}
    assert throughput_series(iter([]), None) == ({}, 1.0)
