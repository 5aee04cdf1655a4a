"""Run a loaded model over decoded images in micro-batches, isolating an image whose forward fails."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Generic, TypeVar

import torch
from celery.exceptions import SoftTimeLimitExceeded

from worker.models.batching import Rule
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
    items: Iterable[T],
    input_of: Callable[[T], ModelInput],
    micro_batch: int,
    max_pixels: float,
    key: Callable[[ModelInput], Hashable] | None = None,
) -> Iterator[list[T]]:
    """Items gathered into forwards as they come: at most micro_batch of them and max_pixels of input (an
    item larger on its own goes alone), and only items of one key together (worker.models.batching: the
    model's grouping, under which no image's detections depend on its batch-mates). A forward is handed
    on as soon as it is full, or as another item of the size of its last would not fit, not when the next
    item's decode shows it. Items of several keys wait for mates, at most micro_batch of them and
    max_pixels in all: past that, the forward begun first goes as it is."""
    waiting: dict[Hashable, _Forward[T]] = {}  # in the order each forward began
    held = _Forward[T]()  # what all of them hold: counts only

    def hand_on(group: Hashable) -> list[T]:
        forward = waiting.pop(group)
        held.count -= len(forward.items)
        held.pixels -= forward.pixels
        return forward.items

    for item in items:
        model_input = input_of(item)
        size = input_pixels(model_input)
        group = None if key is None else key(model_input)
        forward = waiting.get(group)
        if forward is not None and forward.pixels + size > max_pixels:
            yield hand_on(group)
            forward = None
        if forward is None:
            forward = waiting[group] = _Forward()
        forward.add(item, size)
        held.count += 1
        held.pixels += size
        if len(forward.items) >= micro_batch or forward.pixels + size > max_pixels:
            yield hand_on(group)
        elif len(waiting) > 1 and (held.count > micro_batch or held.pixels > max_pixels):
            yield hand_on(next(iter(waiting)))
    for group in list(waiting):
        yield hand_on(group)


@dataclass
class _Forward(Generic[T]):
    """Items gathered for one forward, and their input pixels."""

    items: list[T] = field(default_factory=list)
    count: int = 0
    pixels: int = 0

    def add(self, item: T, size: int) -> None:
        self.items.append(item)
        self.pixels += size


def forward_step(model: LoadedModel, micro_batch: int) -> int:
    """The most images one forward takes: the micro-batch, or fewer where the model is fixed to fewer or
    its grouping runs one image at a time."""
    if model.grouping.rule is Rule.ONE:
        return 1
    return max(1, min(micro_batch, model.max_batch or micro_batch))


def run_model(
    model: LoadedModel, inputs: Sequence[ModelInput], micro_batch: int, cpu_pixels: int | None = None
) -> list[InferenceOutcome]:
    """Detections per image, in input order, from forwards of at most micro_batch images (and cpu_pixels
    of input on a CPU: pixel_budget) that the model's grouping lets share a forward; a failing forward is
    rerun image by image so one bad input fails alone."""
    step = forward_step(model, micro_batch)
    outcomes: dict[int, InferenceOutcome] = {}
    indexed = list(enumerate(inputs))
    budget = pixel_budget(model, cpu_pixels)
    for chunk in forward_batches(indexed, itemgetter(1), step, budget, model.grouping.key):
        chunk_inputs = [item for _, item in chunk]
        began = time.perf_counter()
        try:
            results = forward_inputs(model, chunk_inputs)
        except SoftTimeLimitExceeded:
            raise  # the batch's time is up: no image is to blame
        except Exception:  # noqa: BLE001 - isolate the culprit below
            outcomes.update(zip([i for i, _ in chunk], _forward_one_by_one(model, chunk_inputs), strict=True))
            continue
        share = (time.perf_counter() - began) * 1000 / len(chunk)
        for (index, _), result in zip(chunk, results, strict=True):
            outcomes[index] = InferenceOutcome(detections=result, error=None, infer_ms=share)
    return [outcomes[index] for index in range(len(inputs))]


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
