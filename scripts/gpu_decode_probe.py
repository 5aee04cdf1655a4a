"""JPEG decode on a GPU (nvJPEG, through torchvision.io.decode_jpeg) against the GPU pool's own path (detq's
exact CPU decode on its decode threads, then the pixels to the device), on the bench's photos, each
reading the files itself: images/s of each, and how far nvJPEG's pixels are from the exact ones. One run
where a GPU is lent says whether GPU decode wins there, and whether it could be the default (the same
pixels) or only an opt-in (issue 10). Not part of `make test`:

    .venv/bin/python scripts/gpu_decode_probe.py [--images 128] [--size 1280x960] [--batch 32]
                                                 [--threads N] [--repeat 3] [--rehearse-on-cpu]

--rehearse-on-cpu decodes with torchvision on the CPU instead (no upload, no GPU figures): the suite runs
it (tests/scripts/test_gpu_decode_probe.py), so that a lent GPU's minutes go to the GPU. Prints one JSON
report: the best of --repeat timed passes each way, after one untimed pass (nvJPEG's first call sets up
its handles); exits 0 when every photo decoded to its size both ways, else 1 with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.photos import write_photos  # noqa: E402
from detq.settings import Settings  # noqa: E402
from detq.vocabulary import WorkerPool  # noqa: E402
from worker.decode import decode_image  # noqa: E402
from worker.devices import decode_threads_per_process  # noqa: E402
from worker.jpeg import exact_jpeg_decoder, opencv_rgb  # noqa: E402

T = TypeVar("T")


@dataclass(frozen=True)
class PixelGap:
    """How far one decode's pixels are from another's: the largest and mean absolute difference of a
    channel value (0 to 255), and the share of channel values that are equal."""

    max_abs: int
    mean_abs: float
    equal_fraction: float


def pixel_gap(ours: np.ndarray, theirs: np.ndarray) -> PixelGap:
    """The gap between two H x W x 3 uint8 decodes of the same file (ValueError if their shapes differ)."""
    if ours.shape != theirs.shape:
        raise ValueError(f"decoded to {theirs.shape}, not {ours.shape}")
    diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    return PixelGap(int(diff.max()), float(diff.mean()), float(np.count_nonzero(diff == 0) / diff.size))


def summarize(gaps: Sequence[PixelGap]) -> dict[str, Any]:
    """The gaps of every photo in one: the worst max, the mean of the means, the photos decoded alike."""
    return {
        "identical_images": sum(g.max_abs == 0 for g in gaps),
        "max_abs_diff": max((g.max_abs for g in gaps), default=0),
        "mean_abs_diff": round(sum(g.mean_abs for g in gaps) / len(gaps), 4) if gaps else 0.0,
        "equal_fraction_min": round(min((g.equal_fraction for g in gaps), default=1.0), 6),
    }


def best_of(repeat: int, run: Callable[[], T]) -> tuple[float, T]:
    """The fastest of `repeat` timed runs, after an untimed one, in seconds; and what the last returned."""
    found = run()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        found = run()
        times.append(time.perf_counter() - began)
    return min(times), found


def exact_decodes(photos: Sequence[Path], threads: int, device: Any) -> list[Any]:
    """The GPU pool's path: each file decoded as a pool process decodes it (worker.decode with the exact
    JPEG decoder, the default limits) on `threads` threads and its pixels sent to the device as the pool
    sends them (pinned, without blocking); waits until all have arrived."""
    import torch

    from worker.models.tensors import pixels_on, rgb_array

    limits = Settings(_env_file=None)

    def one(photo: Path) -> Any:
        decoded = decode_image(
            photo,
            target_size=None,
            max_pixels=limits.max_image_pixels,
            max_bytes=limits.max_file_bytes,
            jpeg=exact_jpeg_decoder(),
        )
        pixels = rgb_array(decoded.image)
        return pixels_on(pixels, device) if device.type == "cuda" else pixels

    with ThreadPoolExecutor(threads) as pool:
        found = list(pool.map(one, photos))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return found


def torchvision_decodes(photos: Sequence[Path], batch: int, device: Any) -> list[Any]:
    """torchvision.io.decode_jpeg over the files, read whole, `batch` a call, to RGB on the device (nvJPEG
    on cuda); waits until every batch is decoded."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    encoded = [torch.frombuffer(bytearray(photo.read_bytes()), dtype=torch.uint8) for photo in photos]
    found: list[Any] = []
    for start in range(0, len(encoded), batch):
        found.extend(decode_jpeg(encoded[start : start + batch], mode=ImageReadMode.RGB, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return found


def parse_size(text: str) -> tuple[int, int]:
    """WIDTHxHEIGHT as (width, height)."""
    width, _, height = text.lower().partition("x")
    return int(width), int(height)


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--size", type=parse_size, default=(1280, 960), help="WIDTHxHEIGHT")
    parser.add_argument("--batch", type=int, default=32, help="files per decode_jpeg call")
    parser.add_argument("--threads", type=int, default=None, help="CPU decode threads (default: the pool's)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rehearse-on-cpu", action="store_true", help="torchvision's CPU decode, no GPU")
    args = parser.parse_args()
    if not args.rehearse_on_cpu and not torch.cuda.is_available():
        print(json.dumps({"ok": False, "reason": "torch.cuda.is_available() is False"}))
        return 1
    device = torch.device("cpu" if args.rehearse_on_cpu else "cuda:0")
    gpus = 0 if args.rehearse_on_cpu else torch.cuda.device_count()
    threads = args.threads or decode_threads_per_process(
        WorkerPool.GPU, cores=os.cpu_count() or 1, concurrency=max(gpus, 1)
    )
    with tempfile.TemporaryDirectory() as tmp:
        photos = write_photos(Path(tmp), args.images, args.size)
        exact_s, exact = best_of(args.repeat, lambda: exact_decodes(photos, threads, device))
        tv_s, decoded = best_of(args.repeat, lambda: torchvision_decodes(photos, args.batch, device))
    report: dict[str, Any] = {
        "device": str(device),
        "gpu_name": None if args.rehearse_on_cpu else torch.cuda.get_device_name(0),
        "cores": os.cpu_count(),
        "images": len(photos),
        "size": list(args.size),
        "batch": args.batch,
        "threads": threads,
        "exact_decoder": "opencv" if exact_jpeg_decoder() is opencv_rgb else "pillow",
        "exact_then_to_device_images_per_s": round(len(photos) / exact_s, 1),
        "torchvision_images_per_s": round(len(photos) / tv_s, 1),
        "torchvision_vs_exact": round(exact_s / tv_s, 2),
    }
    try:
        gaps = [
            pixel_gap(_host(ours), _host(theirs.permute(1, 2, 0)))
            for ours, theirs in zip(exact, decoded, strict=True)
        ]
    except ValueError as exc:
        report.update(ok=False, reason=str(exc))
    else:
        report.update(summarize(gaps), ok=True)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


def _host(pixels: Any) -> np.ndarray:
    """H x W x 3 pixels, an array or a tensor on any device, as an array on the host."""
    return pixels if isinstance(pixels, np.ndarray) else pixels.cpu().numpy()


if __name__ == "__main__":
    sys.exit(main())
