"""Repository functions for images and detections: inserting, loading, recording results, reading back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from db.bulk import insert_rows, next_ids
from db.job_counts_repo import count_recorded, move_counts
from db.jobs_repo import close_job_if_complete
from db.models import CANCELLED_REASON, Detection, Image, Job, table_of, utcnow
from detq.vocabulary import TERMINAL_STATUSES, ImageStatus


class NewImage(NamedTuple):
    """An image file found by a scan, about to become a row: pending in a batch, or refused at once.

    A named tuple: a large enqueue makes one per file, and a frozen dataclass costs 4x as much to build.
    """

    path: str
    size_bytes: int
    mtime: float
    root_index: int = 0
    batch_id: int | None = None
    rejected: str | None = None  # the reason, for a file refused before any worker sees it


class DetectionRow(NamedTuple):
    """One box of a result, in original image pixels: as a worker writes it, and as every reader of
    results gets it back (db/export_repo.py: an image's boxes in rank order).

    A named tuple: SSDlite makes 300 an image, and a frozen dataclass costs about 3x as much to build; an
    export of a large job reads millions (ORM objects took half of its time).
    """

    label_id: int
    label: str
    score: float
    x1: float
    y1: float
    x2: float
    y2: float


DETECTION_COLUMNS = ("image_id", "model_id", "rank", "label_id", "label", "score", "x1", "y1", "x2", "y2")


@dataclass(frozen=True)
class ImageResult:
    """The outcome of one image: DONE with its detections, or FAILED / REJECTED with a reason."""

    image_id: int
    status: ImageStatus
    reason: str | None = None
    width: int | None = None
    height: int | None = None
    detections: tuple[DetectionRow, ...] = ()
    decode_ms: float | None = None  # read, decode, and shrink to the model's input size
    infer_ms: float | None = None  # its share of its micro-batch's forward


@dataclass(frozen=True)
class PendingImage:
    """What a worker needs to process one image row."""

    id: int
    job_id: int
    path: str
    root_index: int
    status: str


# The columns a new image row is written with (COPY sets no defaults), and their values.
IMAGE_COLUMNS = tuple(
    "job_id path size_bytes mtime root_index batch_id status reason finished_at attempts".split()
)


_PENDING, _REJECTED = ImageStatus.PENDING.value, ImageStatus.REJECTED.value


def _image_row(job_id: int, image: NewImage, now: datetime) -> tuple[object, ...]:
    """Values of IMAGE_COLUMNS for one new image (a refused one ends rejected with its reason now)."""
    path, size, mtime, root, batch, rejected = image
    if rejected:
        return (job_id, path, size, mtime, root, batch, _REJECTED, rejected, now, 0)
    return (job_id, path, size, mtime, root, batch, _PENDING, None, None, 0)


def _count_new(session: Session, job_id: int, images: Sequence[NewImage]) -> None:
    refused = sum(1 for image in images if image.rejected)
    count_recorded(session, job_id, pending=len(images) - refused, rejected=refused)


def insert_images(session: Session, job_id: int, images: Sequence[NewImage]) -> list[int]:
    """Insert rows in one INSERT ... RETURNING; the new ids in the order of images (for a few rows)."""
    if not images:
        return []
    now = utcnow()
    rows = [dict(zip(IMAGE_COLUMNS, _image_row(job_id, image, now), strict=True)) for image in images]
    statement = insert(Image).returning(Image.id, sort_by_parameter_order=True)
    ids = list(session.scalars(statement, rows))
    _count_new(session, job_id, images)
    return ids


def insert_batched_images(session: Session, job_id: int, images: Sequence[NewImage]) -> dict[int, list[int]]:
    """Insert many rows in one bulk write (COPY on PostgreSQL); the new ids of each batch, ascending.

    The ids are taken first (next_ids) and written with the rows: no read back, and no ordered
    RETURNING, which makes SQLite insert row by row. Refused images (no batch) are inserted too.
    """
    if not images:
        return {}
    now = utcnow()
    table = table_of(Image)
    ids = next_ids(session, table, len(images))
    rows = [(image_id, *_image_row(job_id, image, now)) for image_id, image in zip(ids, images, strict=True)]
    insert_rows(session, table, ("id", *IMAGE_COLUMNS), rows)
    _count_new(session, job_id, images)
    by_batch: dict[int, list[int]] = {}
    for image_id, image in zip(ids, images, strict=True):
        if image.batch_id is not None:
            by_batch.setdefault(image.batch_id, []).append(image_id)
    return by_batch


_IMAGES = table_of(Image)
# Every batch runs these: built once (db/claims_repo.py). The images still pending among ids, locked in id
# order; and one image's result, run as an executemany.
# By the ids alone, the job and the status checked here: PostgreSQL with no statistics on a fresh job
# (never analysed: autovacuum off or late) combined the ids with the (job_id, status) index, reading every
# pending row of the job: 12 ms a batch at 1,000,000 queued, against 0.15 ms on the primary key alone.
_LOCK_PENDING = (
    select(_IMAGES.c.id, _IMAGES.c.job_id, _IMAGES.c.status)
    .where(_IMAGES.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(_IMAGES.c.id)
    .with_for_update()
)
# The job, read under a lock a cancel's (FOR UPDATE) waits for and that waits for a cancel: a batch written
# after a cancel commits sees it; one written before is counted by it. KEY SHARE, the weakest, so batches
# of one job do not wait for each other here, and the counters' update later (FOR NO KEY UPDATE) does not
# conflict with another batch's hold of it.
_JOBS = table_of(Job)
_JOB_CLOSED_AS = (
    select(_JOBS.c.closed_reason)
    .where(_JOBS.c.id == bindparam("job_id"))
    .with_for_update(read=True, key_share=True)  # FOR KEY SHARE (key_share alone: FOR NO KEY UPDATE)
)
_FINALISE = (
    update(_IMAGES)
    .where(_IMAGES.c.id == bindparam("image_id"))
    .values(
        status=bindparam("status"),
        reason=bindparam("reason"),
        width=bindparam("width"),
        height=bindparam("height"),
        decode_ms=bindparam("decode_ms"),
        infer_ms=bindparam("infer_ms"),
        worker=bindparam("by"),
        device=bindparam("on"),
        finished_at=bindparam("at"),
    )
)


def finalise_results(
    session: Session,
    job_id: int,
    model_id: int,
    results: Sequence[ImageResult],
    *,
    worker: str,
    device: str,
    now: datetime | None = None,
) -> set[int]:
    """Finalise pending images with their results, idempotently; returns the ids newly finalised (now:
    their finish time, this machine's clock by default).

    Only images still pending, locked first, move to their terminal state and get detections, so a batch
    delivered twice, or raced by two workers, writes each image's detections once and never overwrites a
    terminal state. Rows are locked in id order so that two transactions over overlapping batches lock them
    in the same order, not deadlock. A cancelled job's images are not written. One round trip per step: the
    job read, the locking SELECT, the UPDATEs (executemany), the detections (COPY on PostgreSQL).
    """
    for result in results:
        if result.status not in TERMINAL_STATUSES:
            raise ValueError(f"image {result.image_id}: a result must be terminal, not {result.status!r}")
    now = now or utcnow()
    if session.scalar(_JOB_CLOSED_AS, {"job_id": job_id}) == CANCELLED_REASON:
        return set()  # its pending images read cancelled, and are counted so (db/jobs_repo.py, cancel_job)
    ordered = sorted(results, key=lambda r: r.image_id)
    # Lock the images still pending, in id order; a racing transaction waits here and, once the first
    # commits, finds them terminal (PostgreSQL re-checks the WHERE of a FOR UPDATE on the new row version).
    # SQLite has no row locks: BEGIN IMMEDIATE (db.engine) already holds the database's write lock.
    ids = [r.image_id for r in ordered]
    pending = ImageStatus.PENDING.value
    locked = session.execute(_LOCK_PENDING, {"ids": ids}).all()
    still_pending = {row.id for row in locked if row.job_id == job_id and row.status == pending}
    finalised = [r for r in ordered if r.image_id in still_pending]
    if not finalised:
        return set()
    session.execute(
        _FINALISE,
        [
            {
                "image_id": r.image_id,
                "status": ImageStatus(r.status).value,
                "reason": r.reason,
                "width": r.width,
                "height": r.height,
                "decode_ms": r.decode_ms,
                "infer_ms": r.infer_ms,
                "by": worker,
                "on": device,
                "at": now,
            }
            for r in finalised
        ],
    )
    insert_rows(
        session,
        table_of(Detection),
        DETECTION_COLUMNS,
        [
            (r.image_id, model_id, rank, box.label_id, box.label, box.score, box.x1, box.y1, box.x2, box.y2)
            for r in finalised
            for rank, box in enumerate(r.detections)
        ],
    )
    move_counts(
        session,
        job_id,
        pending=-len(finalised),
        done=sum(1 for r in finalised if ImageStatus(r.status) is ImageStatus.DONE),
        failed=sum(1 for r in finalised if ImageStatus(r.status) is ImageStatus.FAILED),
        rejected=sum(1 for r in finalised if ImageStatus(r.status) is ImageStatus.REJECTED),
        detections=sum(len(r.detections) for r in finalised),
    )
    close_job_if_complete(session, job_id, now, started=True)
    return {r.image_id for r in finalised}
