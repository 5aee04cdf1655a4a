"""A job's images with their boxes, read in chunks as plain rows: what exports, reports and pictures read."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from db.images_repo import DetectionRow
from db.models import CANCELLED_REASON, Detection, Image, Job
from detq.vocabulary import ImageStatus

# In the detections' key order: an image's boxes are all of its job's model, so this is rank order.
_BOXES = select(
    Detection.image_id,
    Detection.label_id,
    Detection.label,
    Detection.score,
    Detection.x1,
    Detection.y1,
    Detection.x2,
    Detection.y2,
).order_by(Detection.image_id, Detection.model_id, Detection.rank)


_STREAMED_ROWS = 2000  # boxes fetched at a time by iter_ledger


def _grouped(
    session: Session, query: Select[int, int, str, float, float, float, float, float]
) -> dict[int, list[DetectionRow]]:
    found: dict[int, list[DetectionRow]] = defaultdict(list)
    make = DetectionRow._make
    for row in session.execute(query):
        found[row[0]].append(make(row[1:]))
    return found


def _cancelled_jobs(session: Session, job_ids: Sequence[int]) -> dict[int, datetime | None]:
    """Of these jobs, the cancelled ones, with when they finished."""
    rows = session.execute(
        select(Job.id, Job.finished_at).where(
            Job.id.in_(sorted(set(job_ids))), Job.closed_reason == CANCELLED_REASON
        )
    ).tuples()
    return dict(rows.all())


def _as_read(images: Sequence[Image], cancelled: dict[int, datetime | None]) -> None:
    """A cancelled job's pending images as every reader takes them (db.models.status_as_read): cancelled,
    finished with their job. Set as loaded, not as a change: nothing is written back."""
    if not cancelled:
        return
    for image in images:
        if image.status == ImageStatus.PENDING.value and image.job_id in cancelled:
            set_committed_value(image, "status", ImageStatus.CANCELLED.value)
            set_committed_value(image, "reason", CANCELLED_REASON)
            set_committed_value(image, "finished_at", cancelled[image.job_id])


def iter_ledger(
    session: Session, job_id: int, chunk: int = 1000, *, boxes: bool = True
) -> Iterator[tuple[Image, list[DetectionRow]]]:
    """Every image of the job by id with its boxes by rank (boxes=False: none read): a query of a chunk of
    images, keyset on id, and one of their boxes, streamed alongside them. Memory holds a chunk of images
    and one image's boxes, whatever the job's size or its boxes an image (read a chunk's boxes whole, 300
    an image took an export to 400 MB)."""
    if chunk < 1:
        raise ValueError(f"chunk must be positive, not {chunk}")
    cancelled = _cancelled_jobs(session, [job_id])
    after: int | None = None
    while True:
        query = select(Image).where(Image.job_id == job_id).order_by(Image.id).limit(chunk)
        if after is not None:
            query = query.where(Image.id > after)
        images = list(session.scalars(query))
        if not images:
            return
        _as_read(images, cancelled)
        first, last = images[0].id, images[-1].id
        if boxes:
            yield from _with_boxes(session, images, first, last)
        else:
            for image in images:
                yield image, []
        if len(images) < chunk:
            return
        after = last


def _with_boxes(
    session: Session, images: list[Image], first: int, last: int
) -> Iterator[tuple[Image, list[DetectionRow]]]:
    """The images (by id) each with its boxes, from one streamed read of the boxes in their id range.

    The range runs along the detections' key, with no join on images: joined, SQLite walked every image of
    the job for each chunk (100,000 images: 10 s of a 21 s export). Boxes of another job's images in the
    range are read and passed over.
    """
    rows = session.execute(
        _BOXES.where(Detection.image_id >= first, Detection.image_id <= last).execution_options(
            yield_per=_STREAMED_ROWS
        )
    )
    make = DetectionRow._make
    try:
        row = next(rows, None)
        for image in images:
            found: list[DetectionRow] = []
            while row is not None and row[0] <= image.id:
                if row[0] == image.id:
                    found.append(make(row[1:]))
                row = next(rows, None)
            yield image, found
    finally:
        rows.close()


def images_with_boxes(
    session: Session, image_ids: Sequence[int], chunk: int = 1000
) -> Iterator[tuple[Image, list[DetectionRow]]]:
    """These images, in the order given, each with its boxes by rank: two queries per chunk of ids. An id
    whose row is gone since it was listed (its job deleted meanwhile) is passed over."""
    ids = list(image_ids)
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        images = {image.id: image for image in session.scalars(select(Image).where(Image.id.in_(part)))}
        _as_read(list(images.values()), _cancelled_jobs(session, [i.job_id for i in images.values()]))
        found = boxes_of(session, part, chunk)
        for image_id in part:
            if (image := images.get(image_id)) is not None:
                yield image, found.get(image_id, [])


def boxes_of(session: Session, image_ids: Sequence[int], chunk: int = 1000) -> dict[int, list[DetectionRow]]:
    """The boxes of these images, by image id, in rank order."""
    found: dict[int, list[DetectionRow]] = {}
    ids = list(image_ids)
    for start in range(0, len(ids), chunk):
        found.update(_grouped(session, _BOXES.where(Detection.image_id.in_(ids[start : start + chunk]))))
    return found


def label_names(session: Session, job_id: int) -> dict[int, str]:
    """label_id -> label among the job's detections."""
    rows = session.execute(
        select(Detection.label_id, func.min(Detection.label))
        .join(Image, Detection.image_id == Image.id)
        .where(Image.job_id == job_id)
        .group_by(Detection.label_id)
        .order_by(Detection.label_id)
    ).tuples()
    return {label_id: label for label_id, label in rows}
