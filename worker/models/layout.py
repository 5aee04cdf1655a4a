"""Convolution weights in channels_last on a CPU, kept only where the outputs stay bit for bit the same.

oneDNN then runs the convolutions on NHWC activations without reordering them at every layer: SSDlite's
forward ran 1.05x to 1.13x as fast here at one to eight images (about 1.03x end to end with two pool
processes), its boxes, scores and labels identical. Where the layout changes the arithmetic (a YOLOv8n
export's outputs moved by 0.05 px) or is slower, the model stays as it was: the choice is made per model at
load, on probe inputs of random pixels at the batch sizes the worker runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from worker.models.formats import FormatAdapter
from worker.models.optimize import alternated_medians
from worker.models.outputs import same_outputs

log = logging.getLogger(__name__)

# channels_last is given up where its probe forward is this much slower than the model as it was. Outputs
# the same bit for bit point to the same arithmetic, the layout saving only reorders, and more so at larger
# batches (SSDlite: 1.05x at one image, 1.10x at 4, 1.13x at 8), so a single image's timing only guards
# against a loss.
MAX_LOSS = 0.05
# The start of the note where the weights were left in channels_last (not "... but slower").
CHANNELS_LAST_KEPT = "channels_last: the same outputs ("
WARM_CALLS, TIMED_CALLS = 1, 3


def conv_weights(module: Any) -> list[torch.Tensor]:
    """The module's 4-D floating-point parameters: convolution weights."""
    return [p for p in module.parameters() if p.dim() == 4 and p.is_floating_point()]


def relayout(weights: Sequence[torch.Tensor], memory_format: torch.memory_format) -> None:
    """Store each weight in memory_format, in place (the module keeps its parameter objects)."""
    with torch.no_grad():
        for weight in weights:
            weight.data = weight.data.contiguous(memory_format=memory_format)


def _changes_outputs(
    module: Any, weights: Sequence[torch.Tensor], runs: Sequence[Callable[[Any], Any]]
) -> bool:
    """Whether any probe's outputs differ between the two layouts (the cheapest probe first, so a model
    that changes is told after one image); the weights are left in channels_last."""
    for run in runs:
        relayout(weights, torch.contiguous_format)
        expected = run(module)
        relayout(weights, torch.channels_last)
        if not same_outputs(expected, run(module)):
            return True
    return False


LAYOUTS = (torch.contiguous_format, torch.channels_last)


def _timed(
    module: Any, weights: Sequence[torch.Tensor], run: Callable[[Any], Any], clock: Callable[[], float]
) -> list[float]:
    """Median seconds of run as the weights were and in channels_last, alternated (optimize's timing);
    the weights are left in channels_last."""
    return alternated_medians(
        [lambda: run(module)] * 2,
        clock,
        warm=WARM_CALLS,
        timed=TIMED_CALLS,
        enter=lambda index: relayout(weights, LAYOUTS[index]),
    )


def probe_forwards(
    adapter: FormatAdapter, size: tuple[int, int], device: torch.device, counts: Sequence[int]
) -> list[Callable[[Any], Any]]:
    """A forward for each count: that many images of seeded random pixels of size (height, width), fed
    as the worker feeds them (the format's shrink and collate)."""
    return [_forward_of(_noise_batch(adapter, size, device, count)) for count in counts]


def _noise_batch(adapter: FormatAdapter, size: tuple[int, int], device: torch.device, count: int) -> Any:
    pixels = np.random.default_rng(count).integers(0, 256, (count, size[0], size[1], 3), dtype=np.uint8)
    return adapter.collate([adapter.shrink(Image.fromarray(p)) for p in pixels], device)


def _forward_of(inputs: Any) -> Callable[[Any], Any]:
    return lambda module: module(inputs)


def channels_last_where_exact(
    module: Any,
    runs: Sequence[Callable[[Any], Any]],
    name: str,
    clock: Callable[[], float] = time.perf_counter,
) -> str:
    """Leave the module's convolution weights in channels_last where every probe in runs (cheapest first)
    gives the same outputs bit for bit and the first is not MAX_LOSS slower; else as they were. Returns a
    note of what was chosen ("" when the module has no convolution weights)."""
    weights = conv_weights(module)
    if not weights or not runs:
        return ""
    try:
        with torch.inference_mode():
            changed = _changes_outputs(module, weights, runs)
            seconds = None if changed else _timed(module, weights, runs[0], clock)
    except Exception as exc:  # noqa: BLE001 - a graph that cannot take the layout runs as it was
        relayout(weights, torch.contiguous_format)
        log.warning("detq: %s cannot run in channels_last, running it as it was: %s", name, exc)
        return f"channels_last: fails here ({type(exc).__name__}), left as it was"
    if seconds is None:
        relayout(weights, torch.contiguous_format)
        return "channels_last: would change the outputs, left as it was"
    before, after = seconds
    verdict = f"{before * 1000:.0f} ms a probe forward as it was, {after * 1000:.0f} ms in channels_last"
    if after <= before * (1 + MAX_LOSS):
        return f"{CHANNELS_LAST_KEPT}{verdict})"
    relayout(weights, torch.contiguous_format)
    return f"channels_last: the same outputs but slower, left as it was ({verdict})"
