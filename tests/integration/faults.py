"""Fault injection for the integration tests: a slow model, killing processes, and the ledger check."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from tests.integration.harness import Deployment, WorkerHandle

# Short timeouts so recovery happens within a test: heartbeats every second, a pass every two. One
# intra-op thread: the slow model keeps its pace on a busy machine (see ITERATIONS_PER_MS).
FAST_HEALING = {"DETQ_WORKER_TIMEOUT": "6", "DETQ_TORCH_THREADS": "1"}
READY_PIDS = re.compile(r"pool process \d+ \(pid (\d+)\) ready")


# Iterations of a 16x16 matmul and tanh per millisecond here, on one intra-op thread. With two threads
# and another process busy on one of the two cores, the same model ran 4 times slower (and a 256x256
# one 40 times): OpenMP threads waiting on a descheduled peer. Tests of it set DETQ_TORCH_THREADS=1.
ITERATIONS_PER_MS = 350


def save_slow_model(path: Path, ms_per_image: float, *, only_size: tuple[int, int] | None = None) -> Path:
    """A scripted torchvision-format model that computes for about ms_per_image per image, then boxes
    the middle half of the image with score 0.9. With only_size (height, width), only images of that size
    are slow: a pool process's start-up checks (how the model groups images, its speed-ups) run it on
    probes of several sizes, which at a heavy image's 12 s took each start 32 s. The warm-up's probe images
    (TORCHVISION_PROBE_SIZE) are never slow: a pool process warms up on a whole micro-batch of them, and
    these tests time what happens to the images of a job."""
    import torch

    from worker.models.loading import TORCHVISION_PROBE_SIZE

    class Slow(torch.nn.Module):
        def __init__(self, iters: int, only: tuple[int, int], probe: tuple[int, int]) -> None:
            super().__init__()
            self.iters = iters
            self.only = only  # (0, 0): every size
            self.probe = probe
            self.w = torch.nn.Parameter(torch.randn(16, 16) / 5, requires_grad=False)

        def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
            out: list[dict[str, torch.Tensor]] = []
            for img in images:
                y = self.w
                probe = img.shape[1] == self.probe[0] and img.shape[2] == self.probe[1]
                chosen = self.only[0] == 0 or (img.shape[1] == self.only[0] and img.shape[2] == self.only[1])
                if chosen and not probe:
                    for _ in range(self.iters):
                        y = torch.tanh(y @ self.w)
                h = float(img.shape[1])
                w = float(img.shape[2])
                box = torch.tensor([[0.25 * w, 0.25 * h, 0.75 * w, 0.75 * h]]) + y[0, 0] * 0
                out.append(
                    {
                        "boxes": box,
                        "labels": torch.ones(1, dtype=torch.int64),
                        "scores": torch.full((1,), 0.9),
                    }
                )
            return out

    meta = {"format": "torchvision", "classes": ["bg", "thing"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(
            torch.jit.script(
                Slow(
                    int(ms_per_image * ITERATIONS_PER_MS), only_size or (0, 0), TORCHVISION_PROBE_SIZE
                ).eval()
            ),
            str(path),
            _extra_files={"detq.json": json.dumps(meta)},
        )
    return path


def write_images(folder: Path, count: int, size: tuple[int, int] = (48, 40)) -> list[Path]:
    """count small PNGs, each a different colour."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"img_{i:04d}.png"
        Image.new("RGB", size, (i % 256, (i * 7) % 256, 90)).save(path)
        paths.append(path)
    return paths


def digests(paths: list[Path]) -> dict[str, str]:
    """sha256 of each file, to show inputs were never modified."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def pool_pids(worker: WorkerHandle) -> list[int]:
    """Pids of the worker's pool processes, from their ready lines."""
    return [int(pid) for pid in READY_PIDS.findall(worker.log())]


def kill_whole_worker(worker: WorkerHandle) -> float:
    """SIGKILL the worker and its pool processes at once; returns when (monotonic)."""
    os.killpg(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(timeout=30)
    return time.monotonic()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> float:
    """Poll predicate() until true; returns the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(interval)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


@dataclass(frozen=True)
class LedgerCheck:
    """The outcome of a job as the ledger tells it."""

    statuses: dict[str, str]
    reasons: dict[str, str | None]
    attempts: dict[str, int]


def check_ledger(
    deployment: Deployment,
    job_id: int,
    enqueued: list[Path],
    before: dict[str, str],
    boxes_per_image: int = 1,
) -> LedgerCheck:
    """Every image in exactly one terminal state with a reason when not done; the set processed equals
    the set enqueued; each done image has the model's one set of boxes, never two; inputs unchanged."""
    rows = [
        json.loads(line)
        for line in deployment.run("export", str(job_id), "--format", "jsonl").stdout.splitlines()
    ]
    paths = [row["path"] for row in rows]
    assert sorted(paths) == sorted(str(p) for p in enqueued), (
        "the set processed differs from the set enqueued"
    )
    assert len(paths) == len(set(paths)), "an image was recorded twice"
    for row in rows:
        assert row["status"] in ("done", "failed", "rejected"), f"{row['path']} is {row['status']}"
        assert row["status"] == "done" or row["reason"], f"{row['path']} {row['status']} without a reason"
        expected = boxes_per_image if row["status"] == "done" else 0
        assert len(row["detections"]) == expected, f"{row['path']}: {len(row['detections'])} boxes"
    status = deployment.run_json("status", str(job_id))
    assert status["state"] == "finished" and status["pending"] == 0
    assert digests(enqueued) == before, "an input file changed"
    return LedgerCheck(
        statuses={row["path"]: row["status"] for row in rows},
        reasons={row["path"]: row["reason"] for row in rows},
        attempts={row["path"]: row["attempts"] for row in rows},
    )
