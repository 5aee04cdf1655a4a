"""What an image costs as the queue deepens: `make bench`'s scale table, or `python -m bench.scale`.

For each deployment and each number of files queued: `detq enqueue` of a folder of hard links to one small
JPEG (files/s, peak memory), one reconciler pass with and without its read limit, `detq status`'s query,
two pool processes' images/s over a trivial model while that many images wait, and `detq cancel` of what
is left. Only detq's own costs show: the model and the decode take next to nothing. Then the peak memory
of `detq export` of a job with 300 boxes an image, and of a pool process given a 99.8 MP photo.

python -m bench.scale [--sizes 10000,100000] [--deployments embedded,redis+postgres]
                      [--window 20] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from PIL import Image as PILImage

from bench.deployments import redis_postgres
from bench.enqueue import _PEAK, timed_enqueue, write_folder
from tests.integration.harness import DETQ, Deployment, running_worker
from tests.support import save_fixed_box_model

DEPLOYMENTS = ("embedded", "redis+postgres")
BATCH_SIZE = 16
PROCESSES = 2


def _settings(deployment: Deployment) -> Any:
    from detq.settings import SETTING_NAMES, Settings

    given = {k[len("DETQ_") :].lower(): v for k, v in deployment.env().items() if k.startswith("DETQ_")}
    return Settings(_env_file=None, **{k: v for k, v in given.items() if k in SETTING_NAMES})


def _median_s(call: Callable[[], object], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _enqueue(deployment: Deployment, folder: Path) -> tuple[int, float, float]:
    """(job id, files/s, peak MiB) of one enqueue of the folder to the cpu queue in batches of 16."""
    return timed_enqueue(deployment, folder, "--pool", "cpu", "--batch-size", str(BATCH_SIZE))


def _images_done(deployment: Deployment, job_id: int) -> int:
    """The job's images done: an index range as long as the count (never the pending ones)."""
    from sqlalchemy import func, select

    from db.ledger import open_ledger
    from db.models import Image

    with open_ledger(_settings(deployment), check_schema=False) as led, led.reads() as session:
        done = select(func.count()).select_from(Image).where(Image.job_id == job_id, Image.status == "done")
        return int(session.scalar(done) or 0)


def _reconciler_pass_s(deployment: Deployment, read_limit: int | None) -> float:
    from db.ledger import open_ledger
    from detq.celery_app import make_celery_app
    from dispatch.reconcile import reconcile

    settings = _settings(deployment)
    app = make_celery_app(settings)
    try:
        with open_ledger(settings, check_schema=False) as led:
            return _median_s(lambda: reconcile(led, app, settings, read_limit=read_limit))
    finally:
        app.close()


def _status_s(deployment: Deployment, job_id: int) -> float:
    from db.ledger import open_ledger
    from producer.status import job_status

    with open_ledger(_settings(deployment), check_schema=False) as led:

        def read() -> None:
            with led.reads() as session:
                job_status(session, job_id)

        return _median_s(read)


def measure(deployment: Deployment, folder: Path, files: int, window_s: float) -> dict[str, Any]:
    """One row of the table: this deployment with `files` images queued."""
    from dispatch.broker import READ_LIMIT

    job_id, files_per_s, peak_mib = _enqueue(deployment, folder)
    row: dict[str, Any] = {
        "files": files,
        "enqueue_files_per_s": round(files_per_s),
        "enqueue_peak_mib": round(peak_mib, 1),
        "reconciler_pass_s": round(_reconciler_pass_s(deployment, READ_LIMIT), 3),
        "reconciler_full_read_s": round(_reconciler_pass_s(deployment, None), 3),
        "status_s": round(_status_s(deployment, job_id), 3),
    }
    with running_worker(deployment, concurrency=PROCESSES):
        deadline = time.monotonic() + 120
        while (first := _images_done(deployment, job_id)) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        # Over the window, or until half the files are done: the queue stays at least half as deep.
        began, done = time.monotonic(), first
        while time.monotonic() - began < window_s and done - first < files // 2:
            time.sleep(0.25)
            done = _images_done(deployment, job_id)
        row["images_per_s"] = round((done - first) / (time.monotonic() - began), 1)
    began = time.perf_counter()
    deployment.run("cancel", str(job_id), timeout=3600)
    row["cancel_s"] = round(time.perf_counter() - began, 2)
    row["status_after_s"] = round(_status_s(deployment, job_id), 3)
    return row


@contextmanager
def _deployment(kind: str, base: Path, model: Path) -> Iterator[Deployment]:
    if kind == "embedded":
        yield Deployment(data_dir=base / f"scale-{time.monotonic_ns()}", model=model)
        return
    with redis_postgres(base, "scale", model) as deployment:
        yield deployment


def scale_table(work: Path, sizes: list[int], kinds: list[str], window_s: float) -> list[dict[str, Any]]:
    """Every deployment at every size, the folders made once (hard links, so a million cost a few files)."""
    work.mkdir(parents=True, exist_ok=True)
    model = save_fixed_box_model(work / "fixed.pt")
    sample = work / "sample.jpg"
    PILImage.new("RGB", (64, 48), (90, 120, 150)).save(sample, quality=80)
    rows: list[dict[str, Any]] = []
    for files in sizes:
        folder = write_folder(work / f"files-{files}", files, sample)
        for kind in kinds:
            with _deployment(kind, work, model) as deployment:
                row = {"deployment": kind, **measure(deployment, folder, files, window_s)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def export_peak(work: Path, images: int = 4000, boxes: int = 300) -> dict[str, Any]:
    """`detq export --format jsonl` of a job of `images` images with `boxes` boxes each (the embedded
    ledger, written by the repository's own functions): its peak memory and time."""
    from db.images_repo import DetectionRow, ImageResult, NewImage, finalise_results, insert_images
    from db.jobs_repo import create_job, finish_enqueue, get_or_create_model
    from db.ledger import open_ledger
    from detq.vocabulary import ImageStatus

    deployment = Deployment(data_dir=work / f"export-{time.monotonic_ns()}")
    led = open_ledger(_settings(deployment))
    found = tuple(
        DetectionRow(label_id=i % 80, label=f"class{i % 80}", score=0.5, x1=i, y1=2, x2=3 + i, y2=4)
        for i in range(boxes)
    )
    with led.sessions() as session, session.begin():
        model = get_or_create_model(session, sha256="a" * 64, path="/m.pt", size_bytes=1, meta={})
        job_id = create_job(session, model_id=model.id, roots=["/d"], pool="cpu", batch_size=8).id
    for start in range(0, images, 500):
        with led.sessions() as session, session.begin():
            new = [NewImage(f"/d/{i:07d}.jpg", 1, 1.0) for i in range(start, min(images, start + 500))]
            ids = insert_images(session, job_id, new)
            results = [ImageResult(image_id=i, status=ImageStatus.DONE, detections=found) for i in ids]
            finalise_results(session, job_id, model.id, results, worker="w", device="cpu")
    with led.sessions() as session, session.begin():
        finish_enqueue(session, job_id, images)
    led.close()
    began = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PEAK,
            *DETQ,
            "export",
            str(job_id),
            "--format",
            "jsonl",
            "-o",
            str(work / "e.jsonl"),
        ],
        env=deployment.env(),
        capture_output=True,
        text=True,
        timeout=3600,
        check=True,
    )
    return {
        "images": images,
        "boxes_per_image": boxes,
        "export_s": round(time.perf_counter() - began, 2),
        "export_peak_mib": round(int(done.stdout.strip().splitlines()[-1]) / 1024, 1),
    }


def one_folder_enqueue(work: Path, sample: Path, files: int = 1_000_000) -> dict[str, Any]:
    """`detq enqueue` of `files` hard links in one folder (no subfolders): files/s and peak memory."""
    folder = work / f"one-folder-{files}"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        link = folder / f"img{i:07d}.jpg"
        source = work / f"one-folder-source{i // 30_000}.jpg"  # ext4 allows 65,000 links to one file
        if not source.exists():
            shutil.copyfile(sample, source)
        if not link.exists():
            os.link(source, link)
    deployment = Deployment(data_dir=work / f"one-folder-{time.monotonic_ns()}", model=work / "fixed.pt")
    _, files_per_s, peak_mib = _enqueue(deployment, folder)
    return {"files": files, "enqueue_files_per_s": round(files_per_s), "enqueue_peak_mib": round(peak_mib, 1)}


def large_image_peak(work: Path, size: tuple[int, int] = (11550, 8640)) -> dict[str, Any]:
    """`detq run` over one photo just under the default pixel limit (99.8 MP), a scripted SSDlite, one
    pool process: the largest process's peak memory (its first forward is checked against the model as
    saved, at full size), and the run's time."""
    import numpy as np

    from tests.support import save_torchvision_detector

    folder = work / "large"
    folder.mkdir(parents=True, exist_ok=True)
    width, height = size
    noise = np.random.default_rng(0).integers(0, 255, (height // 8, width // 8, 3), dtype=np.uint8)
    PILImage.fromarray(noise).resize((width, height), PILImage.Resampling.BILINEAR).save(folder / "large.jpg")
    model = save_torchvision_detector(work / "ssdlite-large.pt", "ssdlite", calibrated=True)
    deployment = Deployment(data_dir=work / f"large-{time.monotonic_ns()}", model=model)
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *DETQ, "run", str(folder), "--out", str(work / "large-out")],
        env=deployment.env() | {"DETQ_WORKER_CONCURRENCY": "1"},
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    return {
        "megapixels": round(width * height / 1e6, 1),
        "run_s": round(time.perf_counter() - began, 1),
        "largest_process_peak_mib": round(int(done.stdout.strip().splitlines()[-1]) / 1024),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table as docs/benchmarks.md shows it."""
    head = (
        "| deployment | files queued | images/s (2 processes) | enqueue files/s | enqueue peak MiB |"
        " reconciler pass s (full read) | status s | cancel s |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [
        f"| {r['deployment']} | {r['files']:,} | {r['images_per_s']} | {r['enqueue_files_per_s']:,} |"
        f" {r['enqueue_peak_mib']} | {r['reconciler_pass_s']} ({r['reconciler_full_read_s']}) |"
        f" {r['status_s']} | {r['cancel_s']} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000", help="files queued, comma-separated")
    parser.add_argument("--deployments", default=",".join(DEPLOYMENTS))
    parser.add_argument("--window", type=float, default=20.0, help="seconds over which images/s is counted")
    parser.add_argument(
        "--work", type=Path, default=None, help="folder for the files (default: a temporary one)"
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    kinds = [kind for kind in args.deployments.split(",") if kind]
    with tempfile.TemporaryDirectory(prefix="detq-scale-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        rows = scale_table(work, sizes, kinds, args.window)
        extras = {
            "export_at_300_boxes": export_peak(work),
            "one_folder": one_folder_enqueue(work, work / "sample.jpg", max(sizes)),
            "largest_image": large_image_peak(work),
        }
    print(markdown(rows))
    print(json.dumps(extras))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
