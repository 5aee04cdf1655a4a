"""A torchvision detector's own normalise-and-resize, done ahead on only the pixels its resize reads.

An SSD or SSDlite (a GeneralizedRCNNTransform with a fixed_size) takes a full-size image, normalises every
pixel as floats, then resizes bilinearly, without antialiasing, to its fixed size: each output pixel reads
four input pixels. On a 12 MP photo that is three 144 MB float passes (the float copy, the normalisation,
the resize kernel's copy into channels_last) for 100,000 output pixels: 170 ms of a 210 ms forward on one
core. Here the same steps run on the rows and columns the resize reads, gathered from the uint8 pixels and
normalised as the model does, then written into an otherwise untouched channels_last buffer of the full
size, which the same torch kernel resizes reading only those: the same floats. The model is then left to
normalise with mean 0 and std 1 and to resize its fixed size to itself, both exact identities, and its
boxes are scaled back as its own postprocess does. take_over checks all of it at load on probe images, bit
for bit; where anything differs, the model keeps its transform.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling

from worker.models.introspect import torchvision_fixed_size
from worker.models.outputs import parse_torchvision_output
from worker.models.tensors import Pixels, rgb_array, to_tensor

log = logging.getLogger(__name__)

# Seeded-noise probe sizes (height, width): a downscale by a ratio that is no integer, one by integers (3
# and 4 for a 320 model: source points on pixel centres), an upscale, and a wide one.
PROBE_SIZES = ((481, 643), (960, 1280), (199, 251), (97, 1021))
NEUTRAL_MEAN, NEUTRAL_STD = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]


def read_indices(size_in: int, size_out: int) -> np.ndarray:
    """The indices along one side that a bilinear resize (align_corners=False, no antialiasing) from
    size_in to size_out reads: both neighbours of each output's source point, that point computed as torch
    does, in float32 with each step rounded and with the last two fused (a few more than it reads where
    the two differ, never fewer)."""
    scale = np.float32(size_in) / np.float32(size_out)  # torch's own scale, a float32 quotient
    centres = np.arange(size_out, dtype=np.float32) + np.float32(0.5)
    stepwise = (scale * centres - np.float32(0.5)).astype(np.float64)
    fused = np.float64(scale) * centres.astype(np.float64) - 0.5
    sources = np.concatenate([stepwise, fused, fused.astype(np.float32).astype(np.float64)])
    first = np.minimum(np.floor(np.maximum(sources, 0.0)).astype(np.int64), size_in - 1)
    return np.unique(np.concatenate([first, np.minimum(first + 1, size_in - 1)]))


class _Scratch:
    """Each thread's buffer of the size it last resized from, kept: the pages of the rows written stay
    mapped from photo to photo. Allocated afresh, a 12 MP photo's 144 MB came from mmap on a decode thread
    (its malloc arena holds at most 64 MB), and faulting its rows in again cost about 10 ms a photo."""

    def __init__(self) -> None:
        self._held: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()

    def buffer(self, shape: tuple[int, int, int]) -> torch.Tensor:
        """This thread's buffer of that shape, its contents whatever they were."""
        thread = threading.get_ident()
        with self._lock:
            held = self._held.get(thread)
        if held is None or tuple(held.shape) != shape:
            held = torch.empty(shape)
            with self._lock:
                self._held[thread] = held
        return held

    def release(self) -> None:
        """Let every thread's buffer go (an idle process gives its memory back)."""
        with self._lock:
            self._held.clear()


SCRATCH = _Scratch()


@dataclass(frozen=True)
class ScaledBack:
    """Boxes from the model's fixed size to the image's pixels, as torchvision's resize_boxes scales them:
    by float32 ratios of the sizes."""

    ratio_x: float
    ratio_y: float

    def to_source(self, boxes: torch.Tensor) -> torch.Tensor:
        """[N, 4] x1, y1, x2, y2 boxes scaled to the image (a new tensor)."""
        ratios = torch.tensor([self.ratio_x, self.ratio_y, self.ratio_x, self.ratio_y], dtype=torch.float32)
        return boxes.to(torch.float32) * ratios


def _ratio(size: int, fixed: int) -> float:
    return float(np.float32(size) / np.float32(fixed))


@dataclass(frozen=True)
class SampledResize:
    """What the model's transform does to every image: normalise by mean and std, resize to height x width."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    height: int
    width: int

    def input_of(self, image: Pixels, fill: float | None = None) -> tuple[torch.Tensor, ScaledBack]:
        """The model's input for an image (3 x height x width floats, as its transform would make them)
        and how its boxes map back; `fill`: the unread pixels' value (probes use NaN: a read of one shows),
        else whatever memory held."""
        pixels = rgb_array(image)
        size_h, size_w = int(pixels.shape[0]), int(pixels.shape[1])
        rows, cols = read_indices(size_h, self.height), read_indices(size_w, self.width)
        mean = torch.tensor(self.mean, dtype=torch.float32)
        std = torch.tensor(self.std, dtype=torch.float32)
        source = torch.from_numpy(pixels)
        if 2 * len(rows) * len(cols) > size_h * size_w:  # it reads most pixels: all of them, without a gather
            whole = (source.float().div_(255.0) - mean) / std
        else:
            row_index, col_index = torch.from_numpy(rows), torch.from_numpy(cols)
            picked = source.index_select(0, row_index).index_select(1, col_index)
            values = (picked.float().div_(255.0) - mean) / std
            shape = (size_h, size_w, 3)
            whole = SCRATCH.buffer(shape) if fill is None else torch.full(shape, fill)
            at = (row_index[:, None] * size_w + col_index[None, :]).reshape(-1)
            whole.view(-1, 3).index_copy_(0, at, values.view(-1, 3))
        planes = whole.permute(2, 0, 1)[None]  # N x C x H x W over channels_last memory: no copy to resize
        resized = F.interpolate(planes, size=[self.height, self.width], mode="bilinear", align_corners=False)
        back = ScaledBack(ratio_x=_ratio(size_w, self.width), ratio_y=_ratio(size_h, self.height))
        return resized[0].contiguous(), back


def plan_for(module: Any) -> SampledResize | None:
    """The resize a TorchScript torchvision detector with a fixed size does, read from its transform;
    None for any other model."""
    transform = getattr(module, "transform", None)
    size = torchvision_fixed_size(module)
    if size is None or getattr(transform, "original_name", None) != "GeneralizedRCNNTransform":
        return None
    mean = _three_floats(getattr(transform, "image_mean", None))
    std = _three_floats(getattr(transform, "image_std", None))
    if mean is None or std is None:
        return None
    return SampledResize(mean=mean, std=std, height=size[0], width=size[1])


def _three_floats(values: Any) -> tuple[float, ...] | None:
    """A list of three floats as a tuple, else None."""
    if isinstance(values, list) and len(values) == 3 and all(isinstance(v, float) for v in values):
        return tuple(values)
    return None


def probe_images() -> list[np.ndarray]:
    """Seeded noise at PROBE_SIZES."""
    rng = np.random.default_rng(20261203)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in PROBE_SIZES]


def take_over(module: Any, name: str) -> tuple[SampledResize | None, str]:
    """Leave a fixed-size torchvision detector to normalise with mean 0 and std 1 and to resize its own
    size to itself, where its transform's outputs and its detections on the probes are then bit for bit
    those it gives on the whole images; a note on what was done (empty for other models)."""
    plan = plan_for(module)
    if plan is None:
        return None, ""
    transform, probes = module.transform, probe_images()
    try:
        with torch.inference_mode():
            expected = [transform.resize(transform.normalize(to_tensor(p)), None)[0] for p in probes]
            found = parse_torchvision_output(module([to_tensor(probes[0])]), expected=1)[0]
            transform.image_mean, transform.image_std = NEUTRAL_MEAN, NEUTRAL_STD
            same = _same_inputs(transform, plan, probes, expected) and _same_detections(
                module, plan, probes[0], found
            )
    except Exception as exc:  # noqa: BLE001 - any failure leaves the model as it was
        _restore(transform, plan)
        log.warning("detq: %s's resize cannot be made ahead, leaving it to the model: %s", name, exc)
        return None, f"sampled resize: fails here ({type(exc).__name__}), left to the model"
    if not same:
        _restore(transform, plan)
        return None, "sampled resize: would change the model's input, left to the model"
    return plan, (
        f"sampled resize: {name}'s input normalised and resized ahead from the pixels its resize reads "
        "(the same floats, checked on probes)"
    )


def _restore(transform: Any, plan: SampledResize) -> None:
    transform.image_mean, transform.image_std = list(plan.mean), list(plan.std)


def _same_inputs(
    transform: Any, plan: SampledResize, probes: Sequence[np.ndarray], expected: Sequence[torch.Tensor]
) -> bool:
    """Whether the neutral transform turns each probe's input into the tensor the model's own made."""
    for probe, want in zip(probes, expected, strict=True):
        made, _ = plan.input_of(probe, fill=float("nan"))
        got = transform.resize(transform.normalize(made), None)[0]
        if not torch.equal(got, want):
            return False
    return True


def _same_detections(module: Any, plan: SampledResize, probe: np.ndarray, found: Any) -> bool:
    """Whether the model finds the same boxes, labels and scores from the probe's input made ahead."""
    made, back = plan.input_of(probe, fill=float("nan"))
    got = parse_torchvision_output(module([made]), expected=1)[0]
    return (
        torch.equal(back.to_source(got.boxes), found.boxes)
        and torch.equal(got.labels, found.labels)
        and torch.equal(got.scores, found.scores)
    )
