"""What a model returns, read into per-image boxes, labels and scores; the error for a broken contract;
whether two outputs are the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class ModelOutputError(ValueError):
    """The model's output does not follow the expected contract."""


@dataclass(frozen=True)
class RawDetections:
    """One image's detections in model-input (decoded) pixels, on the CPU."""

    boxes: torch.Tensor  # float [N, 4] x1, y1, x2, y2
    labels: torch.Tensor  # int64 [N]
    scores: torch.Tensor  # float [N]


def torchvision_detections(output: Any) -> Any:
    """The list of dicts of a torchvision detector's output (scripted ones return (losses, detections))."""
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[0], dict):
        return output[1]
    return output


def parse_torchvision_output(output: Any, expected: int) -> list[RawDetections]:
    """Accept torchvision's list of dicts, or the (losses, detections) tuple of scripted detectors."""
    output = torchvision_detections(output)
    if not isinstance(output, list | tuple) or len(output) != expected:
        raise ModelOutputError(
            f"expected a list of {expected} dicts with boxes/labels/scores, got {type(output).__name__}"
            + (f" of length {len(output)}" if isinstance(output, list | tuple) else "")
        )
    parsed: list[RawDetections] = []
    for item in output:
        if not isinstance(item, dict) or not {"boxes", "labels", "scores"} <= item.keys():
            raise ModelOutputError("each output item must be a dict with 'boxes', 'labels' and 'scores'")
        boxes = item["boxes"].detach().to("cpu", torch.float32)
        labels = item["labels"].detach().to("cpu", torch.int64)
        scores = item["scores"].detach().to("cpu", torch.float32)
        n = boxes.shape[0]
        if boxes.dim() != 2 or boxes.shape[1] != 4 or labels.shape != (n,) or scores.shape != (n,):
            raise ModelOutputError(
                f"bad shapes: boxes {tuple(boxes.shape)}, labels {tuple(labels.shape)}, "
                f"scores {tuple(scores.shape)}"
            )
        parsed.append(RawDetections(boxes=boxes, labels=labels, scores=scores))
    return parsed


def same_outputs(a: Any, b: Any) -> bool:
    """Whether two model outputs (tensors in lists, tuples and dicts) are equal bit for bit."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_outputs(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_outputs(a[k], b[k]) for k in a)
    return bool(a == b)
