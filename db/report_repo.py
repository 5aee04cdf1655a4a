"""Repository functions for a report: the model file a job ran (the rest it reads in its one pass)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import Job, ModelRecord


def job_model_file(session: Session, job_id: int) -> tuple[str, list[str]] | None:
    """The path the job's model was recorded at and the classes its metadata names (None: no such job)."""
    row = session.execute(
        select(ModelRecord.path, ModelRecord.meta)
        .join(Job, Job.model_id == ModelRecord.id)
        .where(Job.id == job_id)
    ).first()
    if row is None:
        return None
    classes = (row.meta or {}).get("classes") or []
    return str(row.path), [str(c) for c in classes] if isinstance(classes, list) else []
