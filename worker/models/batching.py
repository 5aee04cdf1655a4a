"""Which images may share a forward: an image's detections never depend on what else is in its batch.

A torchvision detector that keeps the aspect ratio (Faster R-CNN, RetinaNet, FCOS, Mask R-CNN) resizes
each image toward its min_size and max_size, then pads a batch to its largest image, rounded up to a
multiple of size_divisible. An image padded beyond its own size sees other feature maps and anchors: a
scripted Faster R-CNN's boxes moved by hundreds of pixels beside a batch-mate of another size, while
images whose padding is the same as alone gave the same answers bit for bit. So forwards are grouped by
construction, by a key under which batch-mates pad every image exactly as it is padded alone:

- ANY: every image becomes the same size before the model (a fixed-input export's letterbox, an SSD's
  fixed_size): one key for all.
- PADDED: the size the model's own transform pads an image to when alone, computed from its min_size,
  max_size and size_divisible as torchvision computes it (the exact input size where the arithmetic is
  too close to a rounding step to be sure).
- SAME_SIZE: a list-of-images model whose transform cannot be read: images of the same input size only.
- ONE: one image a forward (a model that takes one, a micro-batch of one, or a model whose answers a
  batch of the same size still changed).

choose_grouping checks the rule at load: a probe image alone, then beside a batch-mate the rule lets
share its forward; where its detections differ (worker.models.agreement), the next stricter rule is
tried. The choice is a note of the loaded model (`detq model inspect`, the worker log).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeGuard

import numpy as np
import torch

from worker.models.agreement import agreement
from worker.models.formats import FormatAdapter, ModelInput, TorchvisionAdapter
from worker.models.tensors import size_of

log = logging.getLogger(__name__)


class Rule(StrEnum):
    """How forwards are grouped (module docstring)."""

    ANY = "any"
    PADDED = "padded size"
    SAME_SIZE = "same size"
    ONE = "one"


@dataclass(frozen=True)
class Padding:
    """A torchvision GeneralizedRCNNTransform's resize and padding, read from the loaded model."""

    min_size: int
    max_size: int
    size_divisible: int
    fixed_size: tuple[int, int] | None = None  # (height, width)

    def padded(self, width: int, height: int) -> tuple[int, int] | None:
        """(height, width) the transform pads this image to when it is alone, None where a rounding step
        is too close to say."""
        if self.fixed_size is not None:
            return self._pad(*self.fixed_size)
        short, long = np.float32(min(width, height)), np.float32(max(width, height))
        # torchvision: torch.min(min_size / short, max_size / long) in float32, .item(), then
        # interpolate(scale_factor=..., recompute_scale_factor=True): floor(side * scale) per side.
        scale = float(min(np.float32(self.min_size) / short, np.float32(self.max_size) / long))
        seen = {
            self._pad(math.floor(height * factor), math.floor(width * factor))
            for factor in (scale * (1 - 1e-6), scale, scale * (1 + 1e-6))
        }
        return seen.pop() if len(seen) == 1 else None

    def _pad(self, height: int, width: int) -> tuple[int, int]:
        step = self.size_divisible
        return math.ceil(height / step) * step, math.ceil(width / step) * step


def padding_of(module: Any) -> Padding | None:
    """The resize and padding of a torchvision detector's transform; None for any other model."""
    transform = getattr(module, "transform", None)
    if getattr(transform, "original_name", None) != "GeneralizedRCNNTransform" and not (
        transform is not None and type(transform).__name__ == "GeneralizedRCNNTransform"
    ):
        return None
    min_sizes = getattr(transform, "min_size", None)
    max_size = getattr(transform, "max_size", None)
    divisible = getattr(transform, "size_divisible", None)
    fixed = getattr(transform, "fixed_size", None)
    if not isinstance(min_sizes, tuple | list) or not min_sizes:
        return None
    smallest = min_sizes[-1]  # torchvision resizes toward the last in eval
    if not (_positive(smallest) and _positive(max_size) and _positive(divisible)):
        return None
    fixed_hw = (int(fixed[1]), int(fixed[0])) if isinstance(fixed, tuple | list) and len(fixed) == 2 else None
    return Padding(smallest, max_size, divisible, fixed_hw)


def _positive(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and value > 0


@dataclass(frozen=True)
class Grouping:
    """The rule the worker groups forwards by, and why it was chosen."""

    rule: Rule
    padding: Padding | None = None
    note: str = ""

    def key(self, item: ModelInput) -> Hashable:
        """Inputs of one key may share a forward."""
        if self.rule is Rule.ANY:
            return None
        width, height = size_of(item.pixels)
        if self.rule is Rule.PADDED and self.padding is not None:
            padded = self.padding.padded(width, height)
            if padded is not None:
                return padded
        return (width, height)


ONE_AT_A_TIME = Grouping(Rule.ONE)


def rule_by_construction(adapter: FormatAdapter, padding: Padding | None) -> Rule:
    """The loosest rule the model's input path allows: what its transform does with a batch."""
    if not isinstance(adapter, TorchvisionAdapter):
        return Rule.ANY  # fixed-input formats: every image letterboxed or stretched to the input size
    if padding is None:
        return Rule.SAME_SIZE
    return Rule.ANY if padding.fixed_size is not None else Rule.PADDED


STRICTER = {Rule.ANY: Rule.SAME_SIZE, Rule.PADDED: Rule.SAME_SIZE, Rule.SAME_SIZE: Rule.ONE}

# Probe sizes (height, width): the first alone and with the second; the second is the first's size for
# SAME_SIZE, another size of the same padding for PADDED, another size for ANY.
PROBE_SIZE = (240, 320)


def _mate_size(rule: Rule, padding: Padding | None) -> tuple[int, int]:
    height, width = PROBE_SIZE
    if rule is Rule.ANY:
        return 200, 352
    if rule is Rule.PADDED and padding is not None:
        target = padding.padded(width, height)
        for dh, dw in ((-3, -5), (-1, -2), (2, 3), (-5, 0)):
            if padding.padded(width + dw, height + dh) == target:
                return height + dh, width + dw
    return PROBE_SIZE


def _noise(size: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def _forward(module: Any, adapter: FormatAdapter, images: Sequence[np.ndarray], device: torch.device) -> Any:
    inputs = [adapter.shrink(image) for image in images]
    with torch.inference_mode():
        return adapter.parse(module(adapter.collate(inputs, device)), len(inputs))


def _probe(
    module: Any, adapter: FormatAdapter, device: torch.device, rule: Rule, padding: Padding | None
) -> tuple[bool, int]:
    """Whether the probe's detections alone and beside a mate the rule allows agree; how many boxes."""
    probe, mate = _noise(PROBE_SIZE, 1), _noise(_mate_size(rule, padding), 2)
    (alone,) = _forward(module, adapter, [probe], device)
    together = _forward(module, adapter, [probe, mate], device)[0]
    return agreement(alone, together).agrees, int(alone.boxes.shape[0])


DESCRIBED = {
    Rule.ANY: "any images together (each becomes the model's input size before the model)",
    Rule.PADDED: "images of one padded size together (the model's transform pads a batch to its largest)",
    Rule.SAME_SIZE: "images of one size together (a batch-mate of another size could move the boxes)",
    Rule.ONE: "one image at a time",
}


MATES = {Rule.ANY: "mixed sizes", Rule.PADDED: "one padded size", Rule.SAME_SIZE: "one size"}


def choose_grouping(
    module: Any, adapter: FormatAdapter, device: torch.device, micro_batch: int, max_batch: int | None
) -> Grouping:
    """The loosest rule under which a probe's detections are the same alone and in a batch (module
    docstring); without a probe where forwards hold one image anyway."""
    if max_batch == 1:
        return Grouping(Rule.ONE, note="forwards: one image at a time (the model takes one)")
    padding = padding_of(module) if isinstance(adapter, TorchvisionAdapter) else None
    loosest = rule_by_construction(adapter, padding)
    if micro_batch <= 1:
        return Grouping(loosest, padding, f"forwards: {DESCRIBED[loosest]} (not probed: DETQ_MICRO_BATCH=1)")
    rule: Rule | None = loosest
    refused: list[Rule] = []
    while rule is not None and rule is not Rule.ONE:
        try:
            agrees, boxes = _probe(module, adapter, device, rule, padding)
        except Exception as exc:  # noqa: BLE001 - a batch the model refuses: one image a forward
            log.warning("detq: a probe batch failed (%s); forwards run one image at a time", exc)
            return Grouping(Rule.ONE, note=f"forwards: one image at a time (a batch failed: {exc})")
        if agrees:
            checked = (
                f"a probe's {boxes} detections the same alone and in a batch"
                if boxes
                else "the probe found nothing to compare"
            )
            refused_note = "".join(f"; a batch of {MATES[r]} changed them" for r in refused)
            return Grouping(rule, padding, f"forwards: {DESCRIBED[rule]} ({checked}{refused_note})")
        refused.append(rule)
        rule = STRICTER.get(rule)
    log.warning("detq: a batch changes this model's detections on a probe; forwards run one image at a time")
    return Grouping(
        Rule.ONE, note="forwards: one image at a time (a batch of one size changed the probe's detections)"
    )
