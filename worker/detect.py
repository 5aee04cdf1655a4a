"""Images of a batch to results: confine and decode each (ahead, on threads), detect in micro-batches."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from celery.exceptions import SoftTimeLimitExceeded

from db.images_repo import ImageResult, PendingImage
from detq.vocabulary import ImageStatus
from worker.ahead import map_ahead
from worker.decode import DecodedImage, Geometry, ImageRejected, ImageUnreadable, decode_image
from worker.inference import InferenceOutcome, forward_batches, forward_step, pixel_budget, run_model
from worker.jpeg import exact_jpeg_decoder
from worker.models.formats import ModelInput, TorchvisionAdapter
from worker.models.loading import LoadedModel
from worker.models.verify import RewriteCheck
from worker.paths import PathRejected, open_confined
from worker.rows import decoded_rows
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)


class DetectionTimedOut(SoftTimeLimitExceeded):
    """The batch's soft time limit fired while its images were being detected: the results finished
    before it, and the images the detection was on when it fired (an awaited decode, or the forward in
    hand): the likely cause, where the others had not started or were only decoded ahead."""

    def __init__(self, results: list[ImageResult], in_flight: list[int]) -> None:
        super().__init__(f"soft time limit with {len(in_flight)} images in flight")
        self.results = results
        self.in_flight = in_flight


@dataclass
class _OnNow:
    """The image ids the detection's own thread is on: awaiting one's decode, or a forward."""

    ids: list[int] = field(default_factory=list)


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


def detect_images(
    runtime: WorkerRuntime,
    model: LoadedModel,
    images: Sequence[PendingImage],
    roots: Sequence[str],
    *,
    fast_decode: bool = False,
) -> list[ImageResult]:
    """Results for every image given, good or bad, in input order (fast_decode: prepare_image's).

    Each image is decoded and shrunk to the model's input (ready), with decode threads (where there are
    several) a micro-batch ahead in the background while the model runs on the one already prepared
    (Pillow and OpenCV release the GIL).
    Decoded images go to the model in forwards as soon as one is full (forward_batches: the micro-batch,
    on a CPU DETQ_CPU_FORWARD_PIXELS, and only images the model's grouping lets share a forward).
    While the rewrites made at load are still to be verified on real forwards, each forward is also run
    by the model as saved, which answers where they differ (checked, worker.models.verify).
    At the soft time limit, DetectionTimedOut carries the results so far and the images in flight.
    """
    results: dict[int, ImageResult] = {}
    cpu_pixels = runtime.settings.cpu_forward_pixels
    on_now = _OnNow()

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
            on_now.ids = [image.id]
            prepared, decode_ms = next(taken)
            on_now.ids = []
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

    try:
        for chunk in batches:
            on_now.ids = [image.id for image, _, _ in chunk]
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
            on_now.ids = []
    except SoftTimeLimitExceeded as exc:
        in_flight = [i for i in on_now.ids if i not in results]
        raise DetectionTimedOut(list(results.values()), in_flight) from exc
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
