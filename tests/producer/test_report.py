"""The HTML report of a real job: every section, every image in its list (paged and filtered in headless
Chromium, by the address's fragment), charts with ticks, throughput smoothed."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from db.images_repo import DetectionRow, ImageResult, NewImage, finalise_results, insert_images
from db.jobs_repo import create_job, finish_enqueue, get_or_create_model
from db.ledger import Ledger, open_ledger
from detq.settings import Settings
from detq.vocabulary import ImageStatus
from producer.report import PAGE_SIZE, THUMBNAIL_TRIES, throughput_series, write_job_report
from tests.conftest import service_missing


@pytest.fixture()
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = open_ledger(Settings(_env_file=None, data_dir=tmp_path / "data"))
    yield opened
    opened.close()


def _page(ledger: Ledger, job_id: int, folder: Path) -> str:
    with ledger.sessions() as session:
        out = io.StringIO()
        write_job_report(session, job_id, out, folder)
    return out.getvalue()


def _job(ledger: Ledger, folder: Path, done: int = 5) -> int:
    """A finished job of `done` + 1 images: each done one with two boxes (a cat, and a dog in every other
    one), the last failed."""
    folder.mkdir()
    names = [f"{i:03d}.png" for i in range(done + 1)]
    for i, name in enumerate(names):
        Image.new("RGB", (200, 150), (40 * i, 120, 200 - 30 * i)).save(folder / name)
    with ledger.sessions() as s, s.begin():
        model = get_or_create_model(
            s, sha256="e" * 64, path="/m.pt", size_bytes=1, meta={"classes": ["cat", "dog"]}
        )
        job = create_job(s, model_id=model.id, roots=[str(folder)], pool="cpu", batch_size=8)
        ids = insert_images(s, job.id, [NewImage(str(folder / n), 1, 1.0, 0) for n in names])
        cat = DetectionRow(0, "cat", 0.91, 10, 10, 80, 70)
        dog = DetectionRow(1, "dog", 0.42, 90, 40, 190, 140)
        results = [
            ImageResult(
                image_id=image_id,
                status=ImageStatus.DONE,
                width=200,
                height=150,
                detections=(cat, dog) if n % 2 == 0 else (cat, DetectionRow(0, "cat", 0.3, 5, 5, 9, 9)),
            )
            for n, image_id in enumerate(ids[:done])
        ]
        results.append(
            ImageResult(image_id=ids[done], status=ImageStatus.FAILED, reason="cannot decode image")
        )
        finalise_results(s, job.id, model.id, results, worker="host:1", device="cpu")
        finish_enqueue(s, job.id, len(ids))
        return job.id


def test_the_report_holds_every_section_and_inlines_its_images(ledger: Ledger, tmp_path: Path) -> None:
    job_id = _job(ledger, tmp_path / "images")
    page = _page(ledger, job_id, tmp_path)
    assert page.count("data:image/jpeg;base64,") == 5
    for text in ("detq job 1", "Detections per class", "cat", "dog", "Scores", "Throughput per worker"):
        assert text in page
    assert "cannot decode image" in page
    assert "m.pt (/m.pt; sha256 eeeeeeeeeeeeeeee); classes: cat, dog" in page  # the model by its name
    assert "6: 5 done, 1 failed; 10 detections" in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from the web
    # Every image is in the list's data: its name, status and classes (count and best score)
    listed = page.split('id="report-images">')[1].split("</script>")[0].split("\n")[1:-1]
    assert [line.split('"n":"')[1].split('"')[0] for line in listed] == [f"{i:03d}.png" for i in range(6)]
    assert '"c":[[0,1,0.91],[1,1,0.42]]' in listed[0] and '"c":[[0,2,0.91]]' in listed[1]
    assert '"s":"failed","r":"cannot decode image"' in listed[5]


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
        finalise_results(s, job, model.id, done, worker="host:1", device="cpu")
        finish_enqueue(s, job, len(ids))
    # When its report renders, Then it gives up on thumbnails after THUMBNAIL_TRIES images, and says the rest
    page = _page(ledger, job, tmp_path)
    assert "data:image/jpeg;base64," not in page
    assert f"{len(names)}: {len(names)} done" in page


def _chromium() -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        service_missing("chromium", FileNotFoundError("chromium not on PATH (apt-get install chromium)"))
    return str(browser)


def _open(page: Path, *args: str, fragment: str = "") -> subprocess.CompletedProcess[str]:
    """Chromium opens the page (at #fragment), logging its console to stderr."""
    return subprocess.run(
        [
            _chromium(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            *args,
            page.as_uri() + (f"#{fragment}" if fragment else ""),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _console(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Failed to load" in line]


@pytest.mark.slow
def test_the_report_renders_in_headless_chromium(ledger: Ledger, tmp_path: Path) -> None:
    job_id = _job(ledger, tmp_path / "images")
    (tmp_path / "report.html").write_text(_page(ledger, job_id, tmp_path), encoding="utf-8")
    shot = tmp_path / "report.png"
    # When Chromium opens the page and takes a screenshot
    done = _open(tmp_path / "report.html", "--window-size=1100,3000", f"--screenshot={shot}")
    # Then the screenshot shows the page, with the colours of its thumbnails and charts, and no errors
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    assert _console(done) == []
    with Image.open(shot) as picture:
        colours = picture.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, "the page is blank or has no pictures"


def _rows(dom: str) -> list[str]:
    """The names of the list's rows as the page's script drew them."""
    return re.findall(r'<tr data-name="([^"]+)"', dom)


@pytest.mark.slow
def test_the_list_pages_and_filters_every_image_in_chromium(ledger: Ledger, tmp_path: Path) -> None:
    # Given a job of 60 done images (a dog in every other one) and one failed: more than a page
    job_id = _job(ledger, tmp_path / "images", done=60)
    report = tmp_path / "report.html"
    report.write_text(_page(ledger, job_id, tmp_path), encoding="utf-8")
    names = [f"{i:03d}.png" for i in range(61)]
    # When Chromium opens it, then at its second page, then filtered by class, score, status and name
    views = {
        fragment: _open(report, "--dump-dom", fragment=fragment)
        for fragment in ("", "page=2", "class=1", "class=0&score=0.5&page=2", "status=failed", "q=05")
    }
    for done in views.values():
        assert done.returncode == 0 and _console(done) == [], done.stderr[-2000:]
    # Then each view lists the images it should, a page at a time, and says how many match
    assert _rows(views[""].stdout) == names[:PAGE_SIZE]
    assert "61 of 61 images match; page 1 of 2" in views[""].stdout
    assert _rows(views["page=2"].stdout) == names[PAGE_SIZE:]
    assert _rows(views["class=1"].stdout) == names[0:60:2]  # the dogs
    assert _rows(views["class=0&score=0.5&page=2"].stdout) == names[PAGE_SIZE:60]  # a cat at 0.91 each
    assert _rows(views["status=failed"].stdout) == ["060.png"]
    assert _rows(views["q=05"].stdout) == [n for n in names if "05" in n]
    # Each done image is drawn from its file with its boxes over it, in its class's colour
    first = views[""].stdout.split('<tr data-name="000.png">')[1].split("</tr>")[0]
    assert (tmp_path / "images" / "000.png").as_uri() in first
    assert first.count("<span ") == 2 and "border-color:#ff3b30" in first


def test_render_draws_each_done_image_and_report_writes_one_file(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main
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


def test_throughput_is_smoothed_over_batches_and_summed_over_workers() -> None:
    # Given two workers, each finishing a batch of 8 images together every second for 30 s
    times = [
        (worker, float(second) + offset)
        for second in range(31)
        for worker, offset in (("w1", 0.0), ("w2", 0.5))
        for _ in range(8)
    ]
    series, span = throughput_series(times, points=31)
    # Then each draws a level line at its rate, 8 images/s (not a spike at each batch), the sum at 16
    assert span == 30.5 and set(series) == {"w1", "w2", "all workers"}
    for name, rate in (("w1", 8.0), ("w2", 8.0), ("all workers", 16.0)):
        assert all(abs(value - rate) <= 0.25 * rate for value in series[name]), (name, series[name])
    assert throughput_series([]) == throughput_series([("w1", 1.0), ("w1", 2.0)]) == ({}, 0.0)
