"""A loaded model's first forwards: at the micro-batch the worker will run, finding out whether it takes more
than one image."""

from __future__ import annotations

import logging
from typing import Any

import torch
from PIL import Image

from worker.models.formats import FormatAdapter
from worker.models.metadata import ModelMeta

log = logging.getLogger(__name__)

TORCHVISION_PROBE_SIZE = (320, 320)


def warm_up(module: Any, adapter: FormatAdapter, meta: ModelMeta, device: torch.device, count: int) -> None:
    """One forward of count grey images at the model's input size, its output read as its format."""
    height, width = meta.fixed_input_size() if meta.fixed_input else TORCHVISION_PROBE_SIZE
    images = [Image.new("RGB", (width, height), (114, 114, 114)) for _ in range(count)]
    inputs = adapter.collate([adapter.shrink(image) for image in images], device)
    with torch.inference_mode():
        adapter.parse(module(inputs), count)


def warm_up_and_probe_batch(
    module: Any, adapter: FormatAdapter, meta: ModelMeta, device: torch.device, micro_batch: int
) -> int | None:
    """Warm up at the micro-batch the worker will run; returns 1 when the model only takes batches of one
    (or too few for a micro-batch), else None (no limit).

    At one image, a process's first real micro-batch still paid for running the graph at that batch and
    for growing its heap to the batch's buffers: SSDlite's first batch of 8 took 1.2-1.9x the later ones
    in a worker. Fixed-input exports are often traced for batch 1: a batch of several finds out at
    start-up, not on every micro-batch; the single-image warm-up then runs only for those.
    """
    count = max(2, micro_batch) if meta.fixed_input else micro_batch
    if count <= 1:
        warm_up(module, adapter, meta, device, count=1)
        return None
    try:
        warm_up(module, adapter, meta, device, count=count)
        return None
    except Exception as exc:  # noqa: BLE001 - retried with one image below; a failure there is the real error
        warm_up(module, adapter, meta, device, count=1)
        if not meta.fixed_input:
            log.warning(
                "detq: a warm-up batch of %d failed (%s); forwards run one image at a time", count, exc
            )
        return 1
