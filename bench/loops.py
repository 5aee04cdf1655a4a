"""What detq is measured against: a seed-style loop, and the in-process ceiling (no queue, no database)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Iterator, Sequence
from multiprocessing.synchronize import Barrier
from operator import itemgetter
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from detq.settings import get_settings
from worker.allocator import keep_large_buffers
from worker.decode import Geometry, decode_image
from worker.jpeg import exact_jpeg_decoder
from worker.models.formats import ModelInput
from worker.models.loading import LoadedModel, load_model_for_device
from worker.pipeline import (
    decoded_rows,
    forward_batches,
    forward_images,
    pixel_budget,
    run_model,
    to_detection_rows,
)

MAX_PIX, MAX_BYTES = 10**9, 10**10  # no policy limit on the benchmark photos


def naive_loop(model_path: Path, photos: Sequence[Path]) -> float:
    """Images/s of the loop people write first: Pillow full decode, one image at a time, the model, rows
    (the model as it was saved, its own transform on the whole image: none of the exact rewrites at load,
    which people's first loop does not try)."""
    model = load_model_for_device(
        model_path, "cpu", channels_last=False, sampled_resize=False, selected_detections=False
    )
    began = time.perf_counter()
    for photo in photos:
        with Image.open(photo) as img:
            rgb = img.convert("RGB")
        (raw,) = forward_images(model, [rgb])
        to_detection_rows(
            raw,
            scale_x=1.0,
            scale_y=1.0,
            width=rgb.width,
            height=rgb.height,
            meta=model.meta,
            score_threshold=model.meta.score_threshold,
        )
    return len(photos) / (time.perf_counter() - began)


def _detect_share(model: LoadedModel, photos: Sequence[Path], micro_batch: int, fast: bool) -> None:
    """As a pool process: each photo decoded and shrunk to the model's input, in forwards as the worker
    gathers them (worker.pipeline.forward_batches)."""
    target = model.decode_target if fast else None
    jpeg = exact_jpeg_decoder()
    cpu_pixels = get_settings().cpu_forward_pixels

    def shrunk() -> Iterator[tuple[Geometry, ModelInput]]:
        for photo in photos:
            dec = decode_image(photo, target_size=target, max_pixels=MAX_PIX, max_bytes=MAX_BYTES, jpeg=jpeg)
            yield dec.geometry(), model.adapter.shrink(dec.image)
            del dec  # its full-size pixels go before the next photo's decode, as in worker.pipeline

    budget = pixel_budget(model, cpu_pixels)
    for batch in forward_batches(shrunk(), itemgetter(1), micro_batch, budget, model.grouping.key):
        outcomes = run_model(model, [i for _, i in batch], micro_batch, cpu_pixels)
        for (geometry, _), outcome in zip(batch, outcomes, strict=True):
            if outcome.detections is None:
                raise RuntimeError(f"the ceiling's forward failed: {outcome.error}")
            decoded_rows(outcome.detections, geometry, model.meta)


def _ceiling_process(
    model_path: Path, photos: list[Path], micro_batch: int, fast: bool, barrier: Barrier, out: Any
) -> None:
    keep_large_buffers()  # as each pool process does (worker/bootstrap.py)
    torch.set_num_threads(1)
    model = load_model_for_device(model_path, "cpu")
    # Warmed on the workload's photos, as detq's workers are by a first job (deployments.warm_up_folder).
    _detect_share(model, photos[:micro_batch], micro_batch, fast)
    barrier.wait()
    began = time.perf_counter()
    _detect_share(model, photos, micro_batch, fast)
    out.put(time.perf_counter() - began)


def ceiling(model_path: Path, photos: Sequence[Path], micro_batch: int = 8, fast: bool = False) -> float:
    """Images/s of one single-threaded process per core, each over its share in micro-batches, with detq's
    own decode and model code and nothing else: what detq could reach with zero framework cost."""
    cores = len(os.sched_getaffinity(0))
    context = multiprocessing.get_context("spawn")
    barrier, out = context.Barrier(cores), context.Queue()
    shares = [list(photos[i::cores]) for i in range(cores)]
    processes = [
        context.Process(target=_ceiling_process, args=(model_path, share, micro_batch, fast, barrier, out))
        for share in shares
    ]
    for process in processes:
        process.start()
    elapsed = _results(out, processes)
    for process in processes:
        process.join()
    return len(photos) / max(elapsed)


def _results(out: Any, processes: Sequence[Any], timeout_s: float = 3600) -> list[float]:
    """One elapsed time per process; raises at once when one exits without its result (it crashed)."""
    found: list[float] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < len(processes):
        try:
            found.append(out.get(timeout=1))
            continue
        except queue.Empty:
            pass
        dead = [p for p in processes if not p.is_alive() and p.exitcode != 0]
        if dead:
            for process in processes:
                process.terminate()
            raise RuntimeError(f"a ceiling process exited with code {dead[0].exitcode} before its result")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the ceiling's processes gave no result in {timeout_s:.0f} s")
    return found
