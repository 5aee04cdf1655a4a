"""Benchmark: end-to-end images/s of CPU pool layouts side by side, and JPEG draft vs full decode.

Run: .venv/bin/python scripts/bench_throughput.py [--images 200] [--repeat 2]
Each configuration runs real `detq worker` processes on the embedded default (SQLite + filesystem broker),
in one invocation, so the ratios compare like with like on a noisy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.shapes import write_dataset  # noqa: E402
from tests.integration.harness import Deployment, running_worker  # noqa: E402
from worker.decode import decode_image  # noqa: E402


def bench_layout(images: Path, processes: int, base: Path, extra: dict[str, str]) -> float:
    """Images/s for one worker layout, measured from enqueue to the job's end."""
    deployment = Deployment(data_dir=base / f"data-{processes}-{time.monotonic_ns()}", extra=extra)
    with running_worker(deployment, concurrency=processes):
        began = time.perf_counter()
        status = deployment.run_json("enqueue", str(images), "--pool", "cpu", "--wait", "--timeout", "900")
        elapsed = time.perf_counter() - began
    assert status["done"] == status["total"], status
    return float(status["total"]) / elapsed


def bench_decode(tmp: Path, repeat: int = 15) -> tuple[float, float]:
    """Milliseconds to decode a 12-megapixel JPEG fully and with draft toward 320x240."""
    path = tmp / "12mp.jpg"
    Image.effect_noise((4000, 3000), 40).convert("RGB").save(path, quality=90)
    limits = {"max_pixels": 10**8, "max_bytes": 10**9}

    def timed(target: tuple[int, int] | None) -> float:
        runs = []
        for _ in range(repeat):
            began = time.perf_counter()
            decode_image(path, target_size=target, **limits)
            runs.append((time.perf_counter() - began) * 1000)
        return statistics.median(runs)

    return timed(None), timed((240, 320))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        images = tmp / "images"
        write_dataset(images, args.images, seed=99)
        full_ms, draft_ms = bench_decode(tmp)
        layouts = {f"{cores} processes x 1 thread": cores, f"1 process x {cores} threads": 1}
        results: dict[str, list[float]] = {name: [] for name in layouts}
        for _ in range(args.repeat):  # interleaved, so drift in machine load hits both alike
            for name, processes in layouts.items():
                results[name].append(bench_layout(images, processes, tmp, {}))
    best = {name: max(rates) for name, rates in results.items()}
    first, second = list(best)
    report = {
        "images": args.images,
        "cores": cores,
        "images_per_s": {k: [round(r, 1) for r in v] for k, v in results.items()},
        "layout_ratio": round(best[first] / best[second], 2),
        "decode_12mp_full_ms": round(full_ms, 1),
        "decode_12mp_draft_320x240_ms": round(draft_ms, 1),
        "decode_ratio": round(full_ms / draft_ms, 2),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
