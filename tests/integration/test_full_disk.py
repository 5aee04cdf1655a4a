"""A full disk is the environment's, never an image's: on the embedded default (its ledger and broker on a
real filesystem that fills up mid-run), no image fails for it, no attempt is counted for it, commands say
so in one line, and the job completes once space returns."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import service_missing
from tests.integration.faults import (
    FAST_HEALING,
    check_ledger,
    digests,
    save_slow_model,
    wait_until,
    write_images,
)
from tests.integration.harness import Deployment, running_worker

pytestmark = pytest.mark.integration


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs of this test's own (mounting one needs root, as CI runs)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        service_missing("a tmpfs of the test's own", RuntimeError(mounted.stderr.strip() or "mount failed"))
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(disk: Path) -> Path:
    """Fill the disk to its last byte with one file; returns it."""
    filler = disk / "filler"
    with filler.open("wb") as out:
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                out.write(chunk)
                out.flush()
        except OSError:
            pass
    return filler


def test_a_full_disk_fails_no_image_and_the_job_completes_once_space_returns(
    small_disk: Path, tmp_path: Path
) -> None:
    # Given the embedded default on a small disk, and a job of 240 images running on two pool processes
    deployment = Deployment(data_dir=small_disk / "data")
    deployment.model = save_slow_model(tmp_path / "slow.pt", 40)
    deployment.extra.update(FAST_HEALING | {"DETQ_BATCH_SIZE": "8"})
    images = write_images(tmp_path / "in", 240)
    before = digests(images)
    with running_worker(deployment, concurrency=2) as worker:
        job = deployment.run_json("enqueue", str(tmp_path / "in"))["job_id"]
        wait_until(lambda: deployment.job_status(job)["done"] >= 16, 120, "a first few images done")
        # When the disk fills up mid-run, for longer than the workers' timeout
        filler = _fill(small_disk)
        full_since = time.monotonic()
        # Then a command that must write says so in one line, and loses nothing
        refused = deployment.run("enqueue", str(tmp_path / "in"), codes=(1,))
        assert refused.stderr.strip().splitlines() == [
            "detq enqueue: the ledger is unavailable: database or disk is full; nothing was lost: try again"
            " once it is back"
        ]
        # And `detq status` says why no worker is heard from, rather than that none listens
        time.sleep(max(0.0, 10 - (time.monotonic() - full_since)))
        status = deployment.run("status", str(job)).stdout
        assert "running" in status, status
        assert "the disk of the ledger" in status and "no worker is listening" not in status, status
        # When space returns
        filler.unlink()
        wait_until(lambda: deployment.job_status(job)["state"] == "finished", 180, "the job to finish")
        log = worker.log()
    # Then every image is done, none failed for the disk, and no attempt was counted for it
    outcome = check_ledger(deployment, job, images, before)
    assert set(outcome.statuses.values()) == {"done"}
    assert set(outcome.attempts.values()) == {1}, json.dumps(outcome.attempts)[:300]
    assert "database or disk is full" in log  # the workers met it, and waited


def test_run_whose_out_folder_is_full_or_fills_says_so_in_one_line_and_writes_once_there_is_room(
    small_disk: Path, embedded: Deployment, tmp_path: Path
) -> None:
    # Given a folder of two large photos (noise: their annotated copies take about 12 MB each), and --out
    # on a disk that is full
    (tmp_path / "in").mkdir()
    noise = np.random.default_rng(0).integers(0, 256, (2000, 2000, 3), dtype=np.uint8)
    for i in range(2):
        Image.fromarray(noise).save(tmp_path / "in" / f"big_{i}.png")
    out = small_disk / "results"
    filler = _fill(small_disk)
    command = ["run", str(tmp_path / "in"), "--out", str(out), "--workers", "1", "--save-images"]
    # When detq run starts
    full = embedded.run(*command, codes=(1,))
    # Then it says in one line that --out's disk is full, before any worker starts or any job is made
    assert full.stderr.strip().splitlines() == [
        f"detq run: --out {out} is on a disk with 0.0 MiB free (the results and the workers' log need at"
        " least 8 MiB): free some space or choose another --out"
    ]
    assert embedded.run_json("jobs", "--all") == []
    # When the disk has 10 MiB free, too little for the annotated copies
    os.truncate(filler, filler.stat().st_size - (10 << 20))
    short = embedded.run(*command, codes=(1,))
    # Then the images run, and writing their results fails in one line saying where, and that nothing is
    # lost; no half-written file is left
    last = short.stderr.strip().splitlines()[-1]
    assert last.startswith(f"detq run: cannot write the results to {out}: No space left on device"), (
        short.stderr
    )
    assert "every image's result is kept in the ledger" in last and "Traceback" not in short.stderr
    assert not (out / "detections.jsonl").exists() and not list(out.glob("*.tmp*"))
    # When there is room again and the same command runs
    filler.unlink()
    again = embedded.run(*command)
    # Then nothing is run again, and the results are written
    assert "nothing new to queue: 2 images found" in again.stderr
    rows = [json.loads(line) for line in (out / "detections.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(row["status"] == "done" for row in rows)
    assert len(list((out / "images").glob("*.png"))) == 2
