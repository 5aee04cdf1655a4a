"""The job an enqueue fills: its model recorded, the job (or the scheduled run) made, its producer alive."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from db.clock import ledger_now
from db.enqueue_repo import open_enqueue
from db.jobs_repo import create_job, get_or_create_model
from db.schedules_repo import RunKey, claim_run
from detq.inference_settings import InferenceSettings
from detq.vocabulary import JobPool
from producer.unqueued_run import RunAlreadyClaimed


def create_enqueue_job(
    factory: sessionmaker[Session],
    model_file: Path,
    sha256: str,
    meta: dict[str, object],
    roots: Sequence[Path],
    pool: JobPool,
    batch_size: int,
    run_key: RunKey | None,
    settings: InferenceSettings,
) -> tuple[int, int]:
    """The job an enqueue fills, with its inference settings, made under its model's row (a scheduled
    run's once: RunAlreadyClaimed if it exists), alive by the database's clock from its first moment;
    (job id, model id)."""
    with factory() as session, session.begin():
        model = get_or_create_model(
            session, sha256=sha256, path=str(model_file), size_bytes=model_file.stat().st_size, meta=meta
        )
        roots_text = [str(r) for r in roots]
        if run_key is None:
            job_id = create_job(
                session,
                model_id=model.id,
                roots=roots_text,
                pool=pool,
                batch_size=batch_size,
                settings=settings,
            ).id
        else:
            claimed = claim_run(
                session,
                run_key,
                model_id=model.id,
                roots=roots_text,
                pool=pool,
                batch_size=batch_size,
                settings=settings,
            )
            if claimed is None:
                raise RunAlreadyClaimed(
                    f"{run_key.schedule_name} at {run_key.scheduled_for} already has a job"
                )
            job_id = claimed
        # Made and alive by the clock the reconciler judges it by, and `detq status` times it by.
        open_enqueue(session, job_id, ledger_now(session))
        return job_id, model.id
