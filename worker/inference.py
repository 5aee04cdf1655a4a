"""Run a loaded model over decoded images in micro-batches, isolating an image whose forward fails."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from worker.adapters import RawDetections, parse_torchvision_output
from worker.loading import LoadedModel


@dataclass(frozen=True)
class InferenceOutcome:
    """Per image: detections, or the error that made its forward fail; plus its share of compute time."""

    detections: RawDetections | None
    error: str | None
    infer_ms: float


def to_tensor(image: Image.Image) -> torch.Tensor:
    """RGB PIL image to a CHW float tensor in [0, 1]."""
    array = np.asarray(image, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255.0)


def _forward(model: LoadedModel, tensors: Sequence[torch.Tensor]) -> list[RawDetections]:
    batch = [t.to(model.device, non_blocking=True) for t in tensors]
    with torch.inference_mode():
        output = model.module(batch)
        return parse_torchvision_output(output, expected=len(batch))


def run_model(model: LoadedModel, images: Sequence[Image.Image], micro_batch: int) -> list[InferenceOutcome]:
    """Detections per image; a failing micro-batch is rerun image by image so one bad input fails alone."""
    outcomes: list[InferenceOutcome] = []
    for start in range(0, len(images), micro_batch):
        chunk = [to_tensor(img) for img in images[start : start + micro_batch]]
        began = time.perf_counter()
        try:
            results = _forward(model, chunk)
        except Exception:  # noqa: BLE001 - isolate the culprit below
            outcomes.extend(_forward_one_by_one(model, chunk))
            continue
        share = (time.perf_counter() - began) * 1000 / len(chunk)
        outcomes.extend(InferenceOutcome(detections=r, error=None, infer_ms=share) for r in results)
    return outcomes


def _forward_one_by_one(model: LoadedModel, tensors: Sequence[torch.Tensor]) -> list[InferenceOutcome]:
    outcomes = []
    for tensor in tensors:
        began = time.perf_counter()
        try:
            (result,) = _forward(model, [tensor])
        except Exception as exc:  # noqa: BLE001 - recorded as this image's failure reason
            elapsed = (time.perf_counter() - began) * 1000
            outcomes.append(InferenceOutcome(None, f"inference failed: {type(exc).__name__}: {exc}", elapsed))
            continue
        outcomes.append(InferenceOutcome(result, None, (time.perf_counter() - began) * 1000))
    return outcomes
