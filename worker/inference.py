"""Run a loaded model over decoded images in micro-batches, isolating an image whose forward fails."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from celery.exceptions import SoftTimeLimitExceeded

from worker.models.formats import ModelInput, to_source_pixels
from worker.models.loading import LoadedModel
from worker.models.outputs import RawDetections
from worker.models.tensors import Pixels, size_of

T = TypeVar("T")


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


def input_pixels(item: ModelInput) -> int:
    """Pixels of one model input: the model's input, or a full-size image where a torchvision model
    resizes it itself."""
    width, height = size_of(item.pixels)
    return width * height


def pixel_budget(model: LoadedModel, cpu_pixels: int | None) -> float:
    """Input pixels one forward may take: cpu_pixels on a CPU, no limit elsewhere.

    On a CPU, small forwards run faster. A torchvision detector takes full-size images and makes float
    copies of each (ours, then its transform's normalisation): a micro-batch of eight 12 MP photos is
    over 1 GB of them, past the 512 MB of free heap a pool process then kept (worker/allocator.py), so
    every forward faulted its buffers in afresh, and one photo at a time ran the in-process ceiling 2.2x
    as fast. Smaller forwards keep a model's activations in the caches too: SSDlite on 1280x960 photos
    and a YOLOv8n export ran faster two to six images a forward than eight. On a GPU the caching
    allocator keeps the buffers and large batches fill the device.
    """
    if cpu_pixels is None or model.device.type != "cpu":
        return float("inf")
    return cpu_pixels


def forward_batches(
    items: Iterable[T], input_of: Callable[[T], ModelInput], micro_batch: int, max_pixels: float
) -> Iterator[list[T]]:
    """Items gathered into forwards as they come: at most micro_batch of them and max_pixels of input (an
    item larger on its own goes alone). A forward is handed on as soon as it is full, or as another item
    of the size of its last would not fit, not when the next item's decode shows it."""
    batch: list[T] = []
    pixels = 0
    for item in items:
        size = input_pixels(input_of(item))
        if batch and pixels + size > max_pixels:
            yield batch
            batch, pixels = [], 0
        batch.append(item)
        pixels += size
        if len(batch) >= micro_batch or pixels + size > max_pixels:
            yield batch
            batch, pixels = [], 0
    if batch:
        yield batch


def forward_step(model: LoadedModel, micro_batch: int) -> int:
    """The most images one forward takes: the micro-batch, or fewer where the model is fixed to fewer."""
    return max(1, min(micro_batch, model.max_batch or micro_batch))


def run_model(
    model: LoadedModel, inputs: Sequence[ModelInput], micro_batch: int, cpu_pixels: int | None = None
) -> list[InferenceOutcome]:
    """Detections per image, in forwards of at most micro_batch images (and cpu_pixels of input on a
    CPU: pixel_budget); a failing forward is rerun image by image so one bad input fails alone."""
    step = forward_step(model, micro_batch)
    outcomes: list[InferenceOutcome] = []
    for chunk in forward_batches(inputs, _same, step, pixel_budget(model, cpu_pixels)):
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


def _same(item: ModelInput) -> ModelInput:
    return item


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
