"""Ray Data's way (read_images + map_batches, the model loaded once per actor), when ray is installed."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def available() -> bool:
    try:
        import ray.data  # noqa: F401
    except ImportError:
        return False
    return True


class _Detector:
    """One per Ray actor: the model loaded once, detq's own input and output code around it."""

    def __init__(self, model_path: str) -> None:
        import torch

        from worker.models.loading import load_model_for_device

        torch.set_num_threads(1)
        self.model = load_model_for_device(
            Path(model_path), "cpu", channels_last=False, sampled_resize=False, selected_detections=False
        )  # as saved

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from PIL import Image

        from worker.pipeline import forward_images

        images = [Image.fromarray(pixels) for pixels in batch["image"]]
        found = forward_images(self.model, images)
        return {"boxes": [len(raw.scores) for raw in found]}


def ray_data(model_path: Path, photos: Sequence[Path], batch_size: int = 8) -> float:
    """Images/s of a whole run over the photos, from reading to the last batch's boxes, on every core."""
    import ray
    import ray.data

    cores = len(os.sched_getaffinity(0))
    ray.init(
        num_cpus=cores,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        ignore_reinit_error=True,
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    try:
        began = time.perf_counter()
        # One model actor per core, reads beside them: with a whole CPU each, the actors hold every CPU
        # and the reads wait for ever. (The best of the splits tried on 2 cores; see docs/benchmarks.md.)
        dataset = ray.data.read_images([str(p) for p in photos], mode="RGB", num_cpus=0.25)
        counted = dataset.map_batches(
            _Detector,
            fn_constructor_args=(str(model_path),),
            batch_size=batch_size,
            compute=ray.data.ActorPoolStrategy(size=cores),
            num_cpus=0.75,
        ).take_all()
        elapsed = time.perf_counter() - began
        assert len(counted) == len(photos), (len(counted), len(photos))
    finally:
        ray.shutdown()
    return len(photos) / elapsed
