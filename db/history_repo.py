"""Repository functions for what a model already did to files: earlier outcomes, latest rows per path."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Image, Job, status_as_read
from detq.vocabulary import ImageStatus


@dataclass(frozen=True)
class PastOutcome:
    """One earlier image row of a file: the size and mtime it had then, and its status."""

    size_bytes: int
    mtime: float
    status: str


def past_outcomes(
    session: Session, model_id: int, settings_key: str, paths: Sequence[str]
) -> dict[str, list[PastOutcome]]:
    """Every earlier image row of these paths in jobs of this model at these settings (their key), its
    status as read (a cancelled job's pending rows: cancelled): one query on uq_images_path_job."""
    if not paths:
        return {}
    found: dict[str, list[PastOutcome]] = defaultdict(list)
    rows = session.execute(
        select(Image.path, Image.size_bytes, Image.mtime, status_as_read())
        .join(Job, Job.id == Image.job_id)
        .where(Job.model_id == model_id, Job.settings_key == settings_key, Image.path.in_(list(paths)))
    ).tuples()
    for path, size_bytes, mtime, status in rows:
        found[path].append(PastOutcome(size_bytes, mtime, status))
    return dict(found)


def jobs_over_roots(session: Session, model_id: int, settings_key: str, roots: Sequence[str]) -> list[Job]:
    """Jobs of this model at these settings (their key) over exactly these roots, newest first."""
    wanted = list(roots)
    query = select(Job).where(Job.model_id == model_id, Job.settings_key == settings_key)
    jobs = session.scalars(query.order_by(Job.id.desc()))
    return [job for job in jobs if list(job.roots) == wanted]


def latest_image_ids(
    session: Session, job_ids: Sequence[int], only: Sequence[str] | None = None
) -> list[int]:
    """Per path (of `only`, where given), the id of its row in the newest of these jobs that holds it (a
    finished row before a pending one), in path order: a few plain values a row, so a folder of a million
    files stays small."""
    if not job_ids:
        return []
    wanted = None if only is None else set(only)
    rank = {job_id: index for index, job_id in enumerate(job_ids)}  # job_ids newest first
    best: dict[str, tuple[tuple[bool, int], int]] = {}
    rows = session.execute(
        select(Image.path, status_as_read(), Image.job_id, Image.id)
        .join(Job, Job.id == Image.job_id)
        .where(Image.job_id.in_(list(job_ids)))
    ).tuples()
    for path, status, job_id, image_id in rows:
        if wanted is not None and path not in wanted:
            continue
        key = (status == ImageStatus.PENDING, rank[job_id])
        current = best.get(path)
        if current is None or key < current[0]:
            best[path] = (key, image_id)
    return [best[path][1] for path in sorted(best)]
