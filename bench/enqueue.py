"""`detq enqueue` of a large folder: files per second, and the command's peak memory at two folder sizes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.deployments import redis_postgres
from tests.integration.harness import DETQ, Deployment

# Runs a command and prints its peak resident memory (KiB, Linux) after its own output.
_PEAK = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


LINKS_PER_FILE = 30_000  # ext4 allows 65,000 links to one file


def write_folder(folder: Path, count: int, sample: Path) -> Path:
    """count image files, hard links to copies of one JPEG: the scan sees count files, the disk a few."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        link = folder / f"{i // 1000:03d}" / f"img{i:06d}.jpg"
        link.parent.mkdir(exist_ok=True)
        if link.exists():
            continue
        source = folder.with_name(f"{folder.name}-source{i // LINKS_PER_FILE}.jpg")  # outside the scan
        if not source.exists():
            shutil.copyfile(sample, source)
        os.link(source, link)
    return folder


def enqueue_rate(deployment: Deployment, folder: Path, *options: str) -> tuple[float, float]:
    """(files/s, peak MiB) of one `detq enqueue --json` of the folder, process start-up included."""
    _, files_per_s, peak_mib = timed_enqueue(deployment, folder, *options)
    return files_per_s, peak_mib


def timed_enqueue(deployment: Deployment, folder: Path, *options: str) -> tuple[int, float, float]:
    """(job id, files/s, peak MiB) of one `detq enqueue FOLDER [options] --json`, start-up included."""
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *DETQ, "enqueue", str(folder), *options, "--json"],
        env=deployment.env(),
        capture_output=True,
        text=True,
        timeout=7200,
        check=True,
    )
    elapsed = time.perf_counter() - began
    lines = done.stdout.strip().splitlines()
    said = json.loads(lines[-2])
    return int(said["job_id"]), int(said["total"]) / elapsed, int(lines[-1]) / 1024


def enqueue_embedded(model: Path, folder: Path, base: Path) -> tuple[float, float]:
    return enqueue_rate(Deployment(data_dir=base / f"enqueue-{time.monotonic_ns()}", model=model), folder)


def enqueue_redis_postgres(model: Path, folder: Path, base: Path) -> tuple[float, float]:
    with redis_postgres(base, "enqueue-pg", model) as deployment:
        return enqueue_rate(deployment, folder)
