"""A scanned chunk of files recorded as image rows, in batches tapered for the live pool processes."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from db.batches_repo import create_batches
from db.images_repo import NewImage, insert_batched_images
from db.models import utcnow
from producer.scan import ScannedFile
from producer.taper import tapered_sizes


def record_chunk(
    session: Session, job_id: int, chunk: Sequence[ScannedFile], batch_size: int, processes: int
) -> tuple[list[tuple[int, list[int]]], int]:
    """Insert a chunk's rows (refused names as rejected) in batches, tapered for `processes` (0: full
    batches); (batch id, image ids) to send."""
    now = utcnow()
    refused = [
        NewImage(f.path, f.size_bytes, f.mtime, f.root_index, rejected=f.refused) for f in chunk if f.refused
    ]
    accepted = [f for f in chunk if not f.refused]
    groups: list[list[ScannedFile]] = []
    start = 0
    for size in tapered_sizes(len(accepted), batch_size, processes):
        groups.append(accepted[start : start + size])
        start += size
    batch_ids = create_batches(session, job_id, [len(g) for g in groups], now)
    rows = [
        NewImage(f.path, f.size_bytes, f.mtime, f.root_index, batch_id=batch_id)
        for batch_id, group in zip(batch_ids, groups, strict=True)
        for f in group
    ]
    ids = insert_batched_images(session, job_id, [*rows, *refused])
    out = [(batch_id, ids[batch_id]) for batch_id in batch_ids]
    return out, len(refused)
