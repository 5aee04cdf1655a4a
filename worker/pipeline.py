"""An image's way through the model in a pool process: preprocess -> inference -> postprocess.

1. **Preprocess** (prepare_image, ready): the file opened only inside its job's root (worker.paths),
   decoded with EXIF orientation (worker.decode; JPEGs by OpenCV where its pixels are Pillow's), then
   shrunk to the model's input at once, on a decode thread a micro-batch ahead of the model (map_ahead).
2. **Inference** (forward_batches, run_model): forwards as soon as one is full, of at most a micro-batch
   (and on a CPU DETQ_CPU_FORWARD_PIXELS of input), of images the model's grouping lets share a forward
   (worker.models.batching), so no image's detections depend on its batch-mates. A forward that fails is
   run again image by image, so one bad input fails alone.
3. **Postprocess** (result_for, to_detection_rows): boxes back in the original image's pixels, clamped,
   thresholded, classes kept, sorted by score: the image's terminal result.

detect_images runs the three over a batch's images, and while the rewrites made at load are not yet
verified on real forwards, runs each forward by the model as saved too (checked). Where it stands is
kept on a Progress the caller owns: at the soft time limit, the batch (worker.batch) reads there what
finished and which images were in flight.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import islice
from operator import itemgetter
from typing import Generic, TypeVar

import torch
from celery.exceptions import SoftTimeLimitExceeded

from db.images_repo import DetectionRow, ImageResult, PendingImage
from detq.vocabulary import ImageStatus
from worker.decode import DecodedImage, Geometry, ImageRejected, ImageUnreadable, decode_image
from worker.jpeg import exact_jpeg_decoder
from worker.models.batching import Rule
from worker.models.formats import ModelInput, TorchvisionAdapter, to_source_pixels
from worker.models.loading import LoadedModel
from worker.models.metadata import ModelMeta
from worker.models.outputs import RawDetections
from worker.models.tensors import Pixels, size_of
from worker.models.verify import RewriteCheck
from worker.paths import PathRejected, open_confined
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# 1. Preprocess: the file, confined and decoded, shrunk to the model's input ahead of the model.


def prepare_image(
    runtime: WorkerRuntime,
    model: LoadedModel,
    image: PendingImage,
    roots: Sequence[str],
    *,
    fast_decode: bool = False,
) -> DecodedImage | ImageResult:
    """Decode one image or say why it ends here (rejected by policy, or failed with a reason); with
    fast_decode (a job's setting), a JPEG at a reduced DCT scale near the model's input."""
    settings = runtime.settings
    try:
        if not 0 <= image.root_index < len(roots):
            raise PathRejected(f"image names root #{image.root_index}, the job has {len(roots)}")
        with open_confined(image.path, roots[image.root_index], runtime.allowed_roots) as opened:
            return decode_image(
                opened.handle,
                target_size=model.decode_target if fast_decode else None,
                max_pixels=settings.max_image_pixels,
                max_bytes=settings.max_file_bytes,
                jpeg=exact_jpeg_decoder(),
            )
    except SoftTimeLimitExceeded:
        raise  # the batch's time is up: never one image's decode error
    # Rejected: the file itself (refused by policy, or its content no image): the same until it changes,
    # so incremental runs leave it be. Failed: a read that may work next time, retried by later runs.
    except (PathRejected, ImageRejected, ImageUnreadable) as exc:
        return ImageResult(image_id=image.id, status=ImageStatus.REJECTED, reason=str(exc))
    except FileNotFoundError:
        return ImageResult(image_id=image.id, status=ImageStatus.FAILED, reason="file not found")
    except OSError as exc:
        return ImageResult(image_id=image.id, status=ImageStatus.FAILED, reason=f"cannot read file: {exc}")
    except Exception as exc:  # noqa: BLE001 - Pillow raises struct.error, IndexError... on malformed files
        reason = f"cannot decode image: {type(exc).__name__}: {exc}"
        return ImageResult(image_id=image.id, status=ImageStatus.REJECTED, reason=reason)


@dataclass(frozen=True)
class Ready:
    """A decoded image in its model's input (its full-size pixels already let go), and its geometry."""

    model_input: ModelInput
    geometry: Geometry


def ready(model: LoadedModel, image: PendingImage, decoded: DecodedImage) -> Ready | ImageResult:
    """Shrink a decoded image to its model's input right away, on the decoding thread: a micro-batch of
    12 MP photos no longer lives in memory at once (672 MB a process at micro-batch 8), and each photo's
    buffers are reused by the next. Fails the image alone where its resize does."""
    try:
        return Ready(model.adapter.shrink(decoded.image), decoded.geometry())
    except SoftTimeLimitExceeded:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded as this image's failure reason
        reason = f"cannot resize image for the model: {type(exc).__name__}: {exc}"
        return ImageResult(image_id=image.id, status=ImageStatus.FAILED, reason=reason)


def map_ahead(executor: Executor, fn: Callable[[T], R], items: Iterable[T], ahead: int) -> Iterator[R]:
    """fn over items on executor, results in order, with at most `ahead` of them submitted and not yet
    taken by the caller (Executor.map submits every item at once).

    A batch's decoded photos are such results: taken at the model's pace, read ahead without a bound they
    pile up in memory wherever decoding outruns the model (full-size 12 MP photos for a torchvision model,
    36 MB each). A caller that stops early (an exception, a closed generator) cancels those not started.
    """
    pending: deque[Future[R]] = deque()
    source = iter(items)
    try:
        pending.extend(executor.submit(fn, item) for item in islice(source, max(1, ahead)))
        while pending:
            result = pending.popleft().result()
            # One more in flight before this result is handed over.
            pending.extend(executor.submit(fn, item) for item in islice(source, 1))
            yield result
    finally:
        for future in pending:
            future.cancel()


# 2. Inference: forwards of images that may share one, a failing forward run again image by image.


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


# 3. Postprocess: an image's detections as ledger rows in its own pixels, its terminal result.


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
    """Scale boxes to original pixels, clamp them to the image, drop low scores and classes not kept
    (meta.keep_classes), sort by score."""
    keep = torch.isfinite(raw.boxes).all(dim=1).logical_and_(torch.isfinite(raw.scores))
    if score_threshold is not None:
        keep.logical_and_(raw.scores >= score_threshold)
    kept_ids = meta.kept_label_ids
    if kept_ids is not None:
        keep.logical_and_(torch.isin(raw.labels, torch.tensor(sorted(kept_ids), dtype=raw.labels.dtype)))
    scores = raw.scores[keep]
    order = torch.argsort(scores, descending=True, stable=True)
    # One index into the kept rows, in score order: the boxes, labels and scores gathered once each.
    taken = keep.nonzero().squeeze(1)[order]
    boxes = raw.boxes[taken]  # a copy: the views below scale and clamp it in place
    boxes[:, 0::2].mul_(scale_x).clamp_(0, width)
    boxes[:, 1::2].mul_(scale_y).clamp_(0, height)
    label_name = meta.label_name
    return tuple(
        DetectionRow(label_id, label_name(label_id), score, x1, y1, x2, y2)
        for (x1, y1, x2, y2), label_id, score in zip(
            boxes.tolist(), raw.labels[taken].tolist(), scores[order].tolist(), strict=True
        )
    )


def decoded_rows(raw: RawDetections, decoded: Geometry, meta: ModelMeta) -> tuple[DetectionRow, ...]:
    """One decoded image's detections as ledger rows, at the model's score threshold (overrides folded in)."""
    return to_detection_rows(
        raw,
        scale_x=decoded.scale_x,
        scale_y=decoded.scale_y,
        width=decoded.width,
        height=decoded.height,
        meta=meta,
        score_threshold=meta.score_threshold,
    )


def result_for(
    image: PendingImage, dec: Geometry, decode_ms: float, outcome: InferenceOutcome, model: LoadedModel
) -> ImageResult:
    """One image's terminal result from its forward: done with rows in original pixels, or failed."""
    if outcome.detections is None:
        return ImageResult(
            image_id=image.id,
            status=ImageStatus.FAILED,
            reason=outcome.error,
            width=dec.width,
            height=dec.height,
            decode_ms=decode_ms,
            infer_ms=outcome.infer_ms,
        )
    rows = decoded_rows(outcome.detections, dec, model.meta)  # settings and CLI overrides folded into meta
    return ImageResult(
        image_id=image.id,
        status=ImageStatus.DONE,
        width=dec.width,
        height=dec.height,
        detections=rows,
        decode_ms=decode_ms,
        infer_ms=outcome.infer_ms,
    )


# The three over a batch's images, the rewrites made at load checked on its first forwards.


@dataclass
class Progress:
    """Where a batch's detection stands, kept by detect_images for its caller: the results finished (by
    image id) and the ids its own thread is on (awaiting one's decode, or a forward). At the soft time
    limit these say what to write and which images are the likely cause (worker.batch)."""

    results: dict[int, ImageResult] = field(default_factory=dict)
    on_now: list[int] = field(default_factory=list)

    @property
    def in_flight(self) -> list[int]:
        """The images the detection was on and had no result for."""
        return [i for i in self.on_now if i not in self.results]


def detect_images(
    runtime: WorkerRuntime,
    model: LoadedModel,
    images: Sequence[PendingImage],
    roots: Sequence[str],
    *,
    fast_decode: bool = False,
    progress: Progress | None = None,
) -> list[ImageResult]:
    """Results for every image given, good or bad, in input order (fast_decode: prepare_image's).

    Each image is decoded and shrunk to the model's input (ready), with decode threads (where there are
    several) a micro-batch ahead in the background while the model runs on the one already prepared
    (Pillow and OpenCV release the GIL).
    Decoded images go to the model in forwards as soon as one is full (forward_batches: the micro-batch,
    on a CPU DETQ_CPU_FORWARD_PIXELS, and only images the model's grouping lets share a forward).
    While the rewrites made at load are still to be verified on real forwards, each forward is also run
    by the model as saved, which answers where they differ (checked, worker.models.verify).
    progress (the caller's) holds the results so far and the images in flight, where an exception (the
    soft time limit) leaves them.
    """
    state = progress if progress is not None else Progress()
    results = state.results
    cpu_pixels = runtime.settings.cpu_forward_pixels

    def prepare(image: PendingImage) -> tuple[Ready | ImageResult, float]:
        log.debug("detq: pid %d starts image %d: %s", os.getpid(), image.id, image.path)
        began = time.perf_counter()
        decoded = prepare_image(runtime, model, image, roots, fast_decode=fast_decode)
        prepared = decoded if isinstance(decoded, ImageResult) else ready(model, image, decoded)
        return prepared, (time.perf_counter() - began) * 1000

    def decoded() -> Iterator[tuple[PendingImage, Ready, float]]:
        """The images that decoded, in order; the others' results recorded on the way."""
        executor = runtime.decode_executor
        # Decode threads read one forward ahead (the next micro-batch decodes while the model runs this
        # one), and at least one image a thread, so none of them idles for want of work.
        ahead = max(runtime.settings.micro_batch, runtime.decode_threads)
        prepared_all = (
            map(prepare, images) if executor is None else map_ahead(executor, prepare, images, ahead)
        )
        taken = iter(prepared_all)
        for image in images:
            state.on_now = [image.id]
            prepared, decode_ms = next(taken)
            state.on_now = []
            if isinstance(prepared, ImageResult):
                results[image.id] = prepared
            else:
                yield image, prepared, decode_ms

    # Forwards the model takes whole: each one's results are recorded as it ends (at the time limit, the
    # images in flight are those of one forward).
    step = forward_step(model, runtime.settings.micro_batch)
    batches = forward_batches(
        decoded(), _model_input, step, pixel_budget(model, cpu_pixels), model.grouping.key
    )
    rewrites = model.rewrite_check

    def again(
        chunk: list[tuple[PendingImage, Ready, float]], check: RewriteCheck
    ) -> tuple[list[InferenceOutcome], bool]:
        images_again = [image for image, _, _ in chunk]
        return as_saved_outcomes(runtime, model, check, images_again, roots, fast_decode=fast_decode)

    for chunk in batches:
        state.on_now = [image.id for image, _, _ in chunk]
        if rewrites is not None and rewrites.fell_back:
            outcomes, _ = again(chunk, rewrites)
        elif rewrites is not None and rewrites.pending:
            exercised = rewrites.exercised()
            outcomes = run_model(model, [r.model_input for _, r, _ in chunk], len(chunk), cpu_pixels)
            outcomes = checked(rewrites, chunk, outcomes, partial(again, chunk, rewrites), exercised)
        else:
            outcomes = run_model(model, [r.model_input for _, r, _ in chunk], len(chunk), cpu_pixels)
        for (image, done, decode_ms), outcome in zip(chunk, outcomes, strict=True):
            results[image.id] = result_for(image, done.geometry, decode_ms, outcome, model)
        state.on_now = []
    return [results[image.id] for image in images]


def as_saved_outcomes(
    runtime: WorkerRuntime,
    model: LoadedModel,
    check: RewriteCheck,
    images: Sequence[PendingImage],
    roots: Sequence[str],
    *,
    fast_decode: bool = False,
) -> tuple[list[InferenceOutcome], bool]:
    """The model as saved (none of the rewrites, answering as model does) over these images, each decoded
    again from its file; one that no longer decodes is an error outcome with the reason. Returns them, and
    whether every image decoded again."""
    adapter = TorchvisionAdapter() if isinstance(model.adapter, TorchvisionAdapter) else model.adapter
    as_saved = replace(check.reference(), meta=model.meta, adapter=adapter)
    outcomes: dict[int, InferenceOutcome] = {}
    inputs: list[tuple[int, ModelInput]] = []
    for index, image in enumerate(images):
        decoded = prepare_image(runtime, as_saved, image, roots, fast_decode=fast_decode)
        if isinstance(decoded, ImageResult):
            outcomes[index] = InferenceOutcome(None, decoded.reason or "cannot decode image again", 0.0)
        else:
            inputs.append((index, adapter.shrink(decoded.image)))
    found = run_model(
        as_saved, [item for _, item in inputs], len(inputs), runtime.settings.cpu_forward_pixels
    )
    outcomes.update((index, outcome) for (index, _), outcome in zip(inputs, found, strict=True))
    return [outcomes[index] for index in range(len(images))], len(inputs) == len(images)


def checked(
    check: RewriteCheck,
    chunk: Sequence[tuple[PendingImage, Ready, float]],
    outcomes: list[InferenceOutcome],
    as_saved: Callable[[], tuple[list[InferenceOutcome], bool]],
    exercised_before: int,
) -> list[InferenceOutcome]:
    """One forward's outcomes checked against the model as saved's on the same images: the rewritten
    model's where they are the same, else the model as saved's (its time in infer_ms). A forward with an
    image that failed either way, or no longer decodes, is not counted as a check."""
    if any(outcome.detections is None for outcome in outcomes):
        return outcomes
    expected, all_decoded = as_saved()
    if not all_decoded:
        return outcomes
    exercised = check.exercised() > exercised_before
    found = [o.detections for o in outcomes if o.detections is not None]
    paths = [image.path for image, _, _ in chunk]
    same = check.judge(found, [e.detections for e in expected], paths, exercised)
    if same:
        return outcomes
    return [replace(e, infer_ms=o.infer_ms + e.infer_ms) for o, e in zip(outcomes, expected, strict=True)]


def _model_input(item: tuple[PendingImage, Ready, float]) -> ModelInput:
    return item[1].model_input
