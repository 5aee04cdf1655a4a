"""Process one batch of image ids: confine, decode, detect, and write every image's terminal state."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sqlalchemy.orm import Session, sessionmaker

from db.engine import is_transient_error
from db.models import ImageStatus
from db.repository import ImageResult, PendingImage, get_job, load_images, record_results
from worker.adapters import to_detection_rows
from worker.decode import DecodedImage, ImageRejected, ImageUnreadable, decode_image
from worker.inference import InferenceOutcome, run_model
from worker.loading import LoadedModel, ModelLoadError
from worker.paths import PathRejected, resolve_confined
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

T = TypeVar("T")
DB_ATTEMPTS = 6


@dataclass(frozen=True)
class BatchReport:
    """What a batch did: images newly finalised, and those already terminal (a redelivery)."""

    written: int
    skipped: int
    done: int
    failed: int
    rejected: int


@dataclass(frozen=True)
class _JobView:
    roots: list[str]
    model_id: int
    model_sha256: str
    model_path: str


def with_db_retry(factory: sessionmaker[Session], work: Callable[[Session], T]) -> T:
    """Run `work` in its own transaction, retrying transient errors (locks, failovers) with backoff."""
    delay = 0.1
    for attempt in range(1, DB_ATTEMPTS + 1):
        try:
            with factory() as session, session.begin():
                return work(session)
        except Exception as exc:
            if attempt == DB_ATTEMPTS or not is_transient_error(exc):
                raise
            log.warning("transient database error (attempt %d/%d): %s", attempt, DB_ATTEMPTS, exc)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


def _read_batch(
    session: Session, job_id: int, image_ids: Sequence[int]
) -> tuple[_JobView, list[PendingImage]]:
    job = get_job(session, job_id)
    if job is None:
        raise LookupError(f"job {job_id} does not exist")
    view = _JobView(
        roots=list(job.roots), model_id=job.model_id, model_sha256=job.model.sha256, model_path=job.model.path
    )
    return view, load_images(session, job_id, image_ids)


def _prepare(
    runtime: WorkerRuntime, model: LoadedModel, image: PendingImage, roots: list[str]
) -> DecodedImage | ImageResult:
    """Decode one image or say why it ends here."""
    settings = runtime.settings
    try:
        if not 0 <= image.root_index < len(roots):
            raise PathRejected(f"image names root #{image.root_index}, the job has {len(roots)}")
        path = resolve_confined(image.path, roots[image.root_index], settings.allowed_root_paths)
        return decode_image(
            Path(path),
            target_size=model.decode_target,
            max_pixels=settings.max_image_pixels,
            max_bytes=settings.max_file_bytes,
        )
    except (PathRejected, ImageRejected) as exc:
        return ImageResult(image_id=image.id, status=ImageStatus.REJECTED, reason=str(exc))
    except FileNotFoundError:
        return ImageResult(image_id=image.id, status=ImageStatus.FAILED, reason="file not found")
    except ImageUnreadable as exc:
        return ImageResult(image_id=image.id, status=ImageStatus.FAILED, reason=str(exc))
    except OSError as exc:
        return ImageResult(image_id=image.id, status=ImageStatus.FAILED, reason=f"cannot read file: {exc}")
    except Exception as exc:  # noqa: BLE001 - Pillow raises struct.error, IndexError... on malformed files
        reason = f"cannot decode image: {type(exc).__name__}: {exc}"
        return ImageResult(image_id=image.id, status=ImageStatus.FAILED, reason=reason)


def detect_images(
    runtime: WorkerRuntime, model: LoadedModel, images: Sequence[PendingImage], roots: list[str]
) -> list[ImageResult]:
    """Results for every image given, good or bad, in input order.

    With decode threads, images are decoded ahead in the background while the model runs on the
    micro-batch already decoded (Pillow releases the GIL while decoding).
    """
    results: dict[int, ImageResult] = {}
    chunk: list[tuple[PendingImage, DecodedImage, float]] = []

    def prepare(image: PendingImage) -> tuple[DecodedImage | ImageResult, float]:
        began = time.perf_counter()
        prepared = _prepare(runtime, model, image, roots)
        return prepared, (time.perf_counter() - began) * 1000

    def flush() -> None:
        outcomes = run_model(model, [d.image for _, d, _ in chunk], len(chunk))
        for (image, dec, decode_ms), outcome in zip(chunk, outcomes, strict=True):
            results[image.id] = _result_for(image, dec, decode_ms, outcome, model)
        chunk.clear()

    executor = runtime.decode_executor
    prepared_all = executor.map(prepare, images) if executor is not None else map(prepare, images)
    for image, (prepared, decode_ms) in zip(images, prepared_all, strict=True):
        if isinstance(prepared, ImageResult):
            results[image.id] = prepared
            continue
        chunk.append((image, prepared, decode_ms))
        if len(chunk) >= runtime.settings.micro_batch:
            flush()
    if chunk:
        flush()
    return [results[image.id] for image in images]


def _result_for(
    image: PendingImage, dec: DecodedImage, decode_ms: float, outcome: InferenceOutcome, model: LoadedModel
) -> ImageResult:
    failed = outcome.detections is None
    rows = (
        ()
        if outcome.detections is None
        else to_detection_rows(
            outcome.detections,
            scale_x=dec.scale_x,
            scale_y=dec.scale_y,
            width=dec.width,
            height=dec.height,
            meta=model.meta,
            score_threshold=model.meta.score_threshold,  # settings and CLI overrides are folded in
        )
    )
    return ImageResult(
        image_id=image.id,
        status=ImageStatus.FAILED if failed else ImageStatus.DONE,
        reason=outcome.error if failed else None,
        width=dec.width,
        height=dec.height,
        detections=rows,
        decode_ms=decode_ms,
        infer_ms=outcome.infer_ms,
    )


def process_batch(runtime: WorkerRuntime, job_id: int, image_ids: Sequence[int]) -> BatchReport:
    """Bring every pending image of this batch to a terminal state; already-terminal images are skipped."""
    factory = runtime.session_factory
    job, images = with_db_retry(factory, lambda s: _read_batch(s, job_id, image_ids))
    pending = [image for image in images if image.status == ImageStatus.PENDING]
    skipped = len(images) - len(pending)
    if not pending:
        return BatchReport(written=0, skipped=skipped, done=0, failed=0, rejected=0)
    try:
        model = runtime.model_for(job.model_sha256, job.model_path)
        results = detect_images(runtime, model, pending, job.roots)
    except ModelLoadError as exc:
        results = [ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=str(exc)) for i in pending]
    written = with_db_retry(
        factory,
        lambda s: record_results(
            s, job_id, job.model_id, results, worker=runtime.worker_name, device=runtime.device
        ),
    )
    return BatchReport(
        written=written,
        skipped=skipped,
        done=sum(r.status == ImageStatus.DONE for r in results),
        failed=sum(r.status == ImageStatus.FAILED for r in results),
        rejected=sum(r.status == ImageStatus.REJECTED for r in results),
    )


def fail_pending(runtime: WorkerRuntime, job_id: int, image_ids: Sequence[int], reason: str) -> int:
    """Last resort when a batch cannot finish: give its still-pending images a terminal state and reason."""
    factory = runtime.session_factory

    def work(session: Session) -> int:
        job = get_job(session, job_id)
        if job is None:
            return 0
        images = load_images(session, job_id, image_ids)
        results = [
            ImageResult(image_id=i.id, status=ImageStatus.FAILED, reason=reason)
            for i in images
            if i.status == ImageStatus.PENDING
        ]
        return record_results(
            session, job_id, job.model_id, results, worker=runtime.worker_name, device=runtime.device
        )

    return with_db_retry(factory, work)
