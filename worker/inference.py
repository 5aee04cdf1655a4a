"""Run a loaded model over decoded images in micro-batches, isolating an image whose forward fails."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from celery.exceptions import SoftTimeLimitExceeded

from worker.models.formats import ModelInput, to_source_pixels
from worker.models.loading import LoadedModel
from worker.models.outputs import RawDetections
from worker.models.tensors import Pixels


@dataclass(frozen=True)
class InferenceOutcome:
    """Per image: detections in decoded-image pixels, or why its forward failed; plus its share of compute."""

    detections: RawDetections | None
    error: str | None
    infer_ms: float


def forward_images(model: LoadedModel, images: Sequence[Pixels]) -> list[RawDetections]:
    """One forward over decoded images (each shrunk to the model's input first)."""
    return forward_inputs(model, [model.adapter.shrink(image) for image in images])


def forward_inputs(model: LoadedModel, inputs: Sequence[ModelInput]) -> list[RawDetections]:
    """One forward: the format's batch, the model, the format's output, mapped back to image pixels."""
    batch = model.adapter.collate(inputs, model.device)
    with torch.inference_mode():
        output = model.module(batch)
    parsed = model.adapter.parse(output, len(inputs))
    return [to_source_pixels(raw, item.transform) for raw, item in zip(parsed, inputs, strict=True)]


def run_model(model: LoadedModel, inputs: Sequence[ModelInput], micro_batch: int) -> list[InferenceOutcome]:
    """Detections per image; a failing micro-batch is rerun image by image so one bad input fails alone."""
    step = max(1, min(micro_batch, model.max_batch or micro_batch))
    outcomes: list[InferenceOutcome] = []
    for start in range(0, len(inputs), step):
        chunk = inputs[start : start + step]
        began = time.perf_counter()
        try:
            results = forward_inputs(model, chunk)
        except SoftTimeLimitExceeded:
            raise  # the batch's time is up: no image is to blame
        except Exception:  # noqa: BLE001 - isolate the culprit below
            outcomes.extend(_forward_one_by_one(model, chunk))
            continue
        share = (time.perf_counter() - began) * 1000 / len(chunk)
        outcomes.extend(InferenceOutcome(detections=r, error=None, infer_ms=share) for r in results)
    return outcomes


MAX_REASON_CHARS = 300


def short_reason(error: BaseException) -> str:
    """An exception as one line for the ledger: TorchScript errors carry their whole serialized-code
    traceback in the message, of which the last line says what went wrong."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    text = lines[-1] if "Traceback of TorchScript" in str(error) else lines[0]
    if not text.startswith(type(error).__name__) and ":" not in text[:40]:
        text = f"{type(error).__name__}: {text}"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _forward_one_by_one(model: LoadedModel, inputs: Sequence[ModelInput]) -> list[InferenceOutcome]:
    outcomes = []
    for item in inputs:
        began = time.perf_counter()
        try:
            (result,) = forward_inputs(model, [item])
        except SoftTimeLimitExceeded:
            raise
        except Exception as exc:  # noqa: BLE001 - recorded as this image's failure reason
            elapsed = (time.perf_counter() - began) * 1000
            outcomes.append(InferenceOutcome(None, f"inference failed: {short_reason(exc)}", elapsed))
            continue
        outcomes.append(InferenceOutcome(result, None, (time.perf_counter() - began) * 1000))
    return outcomes
