"""Repository function for incremental scans: the earlier outcomes of files, by path, under one model."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Image, Job


@dataclass(frozen=True)
class PastOutcome:
    """One earlier image row of a file: the size and mtime it had then, and its status."""

    size_bytes: int
    mtime: float
    status: str


def past_outcomes(session: Session, model_id: int, paths: Sequence[str]) -> dict[str, list[PastOutcome]]:
    """Every earlier image row of these paths in jobs of this model: one query on ix_images_path."""
    if not paths:
        return {}
    found: dict[str, list[PastOutcome]] = defaultdict(list)
    rows = session.execute(
        select(Image.path, Image.size_bytes, Image.mtime, Image.status)
        .join(Job, Job.id == Image.job_id)
        .where(Job.model_id == model_id, Image.path.in_(list(paths)))
    ).tuples()
    for path, size_bytes, mtime, status in rows:
        found[path].append(PastOutcome(size_bytes, mtime, status))
    return dict(found)
