"""Turn a model's raw output into per-image boxes, labels and scores, then into rows in original pixels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from db.repository import DetectionRow
from worker.metadata import ModelMeta


class ModelOutputError(ValueError):
    """The model's output does not follow the expected contract."""


@dataclass(frozen=True)
class RawDetections:
    """One image's detections in model-input (decoded) pixels, on the CPU."""

    boxes: torch.Tensor  # float [N, 4] x1, y1, x2, y2
    labels: torch.Tensor  # int64 [N]
    scores: torch.Tensor  # float [N]


def parse_torchvision_output(output: Any, expected: int) -> list[RawDetections]:
    """Accept torchvision's list of dicts, or the (losses, detections) tuple of scripted detectors."""
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[0], dict):
        output = output[1]
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


def to_detection_rows(
    raw: RawDetections,
    *,
    scale_x: float,
    scale_y: float,
    width: int,
    height: int,
    meta: ModelMeta,
    score_threshold: float | None,
) -> tuple[DetectionRow, ...]:
    """Scale boxes to original pixels, clamp them to the image, drop low scores, sort by score."""
    keep = torch.isfinite(raw.scores) & torch.isfinite(raw.boxes).all(dim=1)
    if score_threshold is not None:
        keep &= raw.scores >= score_threshold
    boxes = raw.boxes[keep].clone()
    labels = raw.labels[keep]
    scores = raw.scores[keep]
    boxes[:, 0::2] = (boxes[:, 0::2] * scale_x).clamp(0, width)
    boxes[:, 1::2] = (boxes[:, 1::2] * scale_y).clamp(0, height)
    order = torch.argsort(scores, descending=True, stable=True)
    return tuple(
        DetectionRow(
            label_id=label_id, label=meta.label_name(label_id), score=score, x1=x1, y1=y1, x2=x2, y2=y2
        )
        for (x1, y1, x2, y2), label_id, score in zip(
            boxes[order].tolist(), labels[order].tolist(), scores[order].tolist(), strict=True
        )
    )
