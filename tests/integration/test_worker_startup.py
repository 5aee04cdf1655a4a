"""Worker start-up: GPU-saved models on the CPU pool, broken models fail at start, no GPU pool without CUDA,
and the producer side never imports torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from demo.shapes import write_dataset
from detq.settings import BUNDLED_MODEL
from tests.integration.harness import LOADED_MARK, Deployment, running_worker
from tests.support import retag_archive_device

pytestmark = pytest.mark.integration


def _detections_by_file(deployment: Deployment, job_id: int) -> dict[str, list[dict[str, object]]]:
    out = deployment.run("export", str(job_id), "--format", "jsonl").stdout
    return {Path(r["path"]).name: r["detections"] for r in map(json.loads, out.splitlines())}


def test_cuda_saved_model_runs_on_the_cpu_pool(embedded: Deployment, tmp_path: Path) -> None:
    # Given the demo model re-tagged as if torch.jit.save had run on cuda:0
    cuda_model = tmp_path / "demo_cuda.pt"
    assert retag_archive_device(BUNDLED_MODEL, cuda_model) >= 1
    embedded.model = cuda_model
    images = tmp_path / "images"
    write_dataset(images, 8, seed=21)
    with running_worker(embedded, concurrency=2) as worker:
        # When the CPU pool starts with it and runs the same folder through it and through the CPU-saved file
        from_cuda = embedded.run_json("enqueue", str(images), "--model", str(cuda_model), "--wait")
        from_cpu = embedded.run_json("enqueue", str(images), "--model", str(BUNDLED_MODEL), "--wait")
        log = worker.log()
    # Then it loaded on cpu in each process and gives the same detections as the CPU-saved file
    assert log.count(f"{LOADED_MARK} demo_cuda.pt") == 2
    assert "on cpu" in log
    assert from_cuda["done"] == from_cpu["done"] == 8
    assert from_cuda["detections"] == from_cpu["detections"] > 0
    assert _detections_by_file(embedded, from_cuda["job_id"]) == _detections_by_file(
        embedded, from_cpu["job_id"]
    )
    # And each process put what it loaded at start out of the garbage collector's sight (its first batch
    # would otherwise pay a full collection of it)
    frozen = [int(n) for n in re.findall(r"\((\d+) long-lived objects frozen", log)]
    assert len(frozen) == 2 and min(frozen) > 50_000, frozen


def test_a_pool_at_half_precision_finds_the_boxes_the_full_precision_pool_finds(
    embedded: Deployment, tmp_path: Path
) -> None:
    # Given 8 scenes run through the demo model by a worker at the default fp32
    images = tmp_path / "images"
    write_dataset(images, 8, seed=21)
    with running_worker(embedded, concurrency=1):
        full = embedded.run_json("enqueue", str(images), "--wait")
    # When a worker with DETQ_PRECISION=fp16 runs them again (emulated on a CPU without fp16 units: slow)
    embedded.extra = {**embedded.extra, "DETQ_PRECISION": "fp16"}
    with running_worker(embedded, concurrency=1) as worker:
        half = embedded.run_json("enqueue", str(images), "--wait", "--timeout", "300")
        log = worker.log()
    # Then it ran at fp16, finished every image and wrote as many boxes per image, each within 2 pixels
    assert "on cpu at fp16" in log
    assert half["done"] == full["done"] == 8
    by_file_full = _detections_by_file(embedded, full["job_id"])
    by_file_half = _detections_by_file(embedded, half["job_id"])
    assert {name: len(boxes) for name, boxes in by_file_half.items()} == {
        name: len(boxes) for name, boxes in by_file_full.items()
    }
    for name, boxes in by_file_full.items():
        for a, b in zip(boxes, by_file_half[name], strict=True):
            assert a["label"] == b["label"], name
            assert max(abs(float(x) - float(y)) for x, y in zip(a["box"], b["box"], strict=True)) <= 2.0


def test_broken_model_stops_the_worker_at_start_up(embedded: Deployment, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"definitely not TorchScript")
    embedded.model = junk
    done = embedded.run("worker", "--pool", "cpu", "--concurrency", "1", timeout=120, codes=(3,))
    # One line, before any pool process starts: what the file is and what detq runs
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("detq worker:") and "junk.pt is a file of no kind detq knows" in line
    assert "not a model file detq runs (TorchScript or torch.export)" in line


def test_a_pinned_worker_refuses_a_model_file_with_another_hash(embedded: Deployment) -> None:
    embedded.extra["DETQ_MODEL_SHA256"] = "0" * 64
    done = embedded.run("worker", "--pool", "cpu", "--concurrency", "1", timeout=120, codes=(3,))
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("detq worker:") and "but DETQ_MODEL_SHA256 pins 0000" in line


def test_gpu_pool_refuses_to_start_without_cuda(embedded: Deployment) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    done = embedded.run("worker", "--pool", "gpu", timeout=120, codes=(3,))
    assert "no CUDA device" in done.stderr


def test_producer_commands_never_import_torch(embedded: Deployment, tmp_path: Path) -> None:
    # Given a folder, enqueue and status run in an interpreter that fails if anything imported torch
    write_dataset(tmp_path / "images", 2, seed=1)
    script = (
        "import sys\n"
        "from cli.main import main\n"
        f"assert main(['enqueue', {str(tmp_path / 'images')!r}, '--json']) == 0\n"
        "assert main(['status', '--json']) == 0\n"
        "assert main(['export', '1', '--format', 'jsonl']) == 0\n"
        "assert 'torch' not in sys.modules, 'producer imported torch'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=embedded.env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
