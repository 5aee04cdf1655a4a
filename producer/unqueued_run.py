"""A scheduled run that could queue nothing (its folders or its model missing that night), recorded as its
job closed at once with the reason, so that `detq runs` shows the night and why."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from db.clock import ledger_now
from db.enqueue_repo import close_enqueue, open_enqueue
from db.jobs_repo import get_or_create_model, latest_model_at
from db.models import ModelRecord
from db.retry import in_transaction
from db.schedules_repo import RunKey, claim_run
from detq.inference_settings import DEFAULTS, InferenceSettings
from detq.modelfile import file_sha256, read_embedded_meta


class RunAlreadyClaimed(Exception):
    """The scheduled run of this key already has a job (another scheduler, or a redelivered message)."""


def record_unqueued_run(
    factory: sessionmaker[Session],
    run_key: RunKey,
    *,
    model_path: Path,
    model_file: Path | None,
    model_sha256: str | None,
    roots: Sequence[Path],
    pool: str,
    batch_size: int,
    reason: str,
    settings: InferenceSettings = DEFAULTS,
) -> int | None:
    """The run's job, made and closed at once with `reason`; its id. model_file is the usable model file,
    None when it is missing or no model: the run is then recorded under the newest model row made at that
    path, and when there is none (a model never run from there) not recorded: None, the log alone says.
    RunAlreadyClaimed if the run has a job."""
    sha256 = (model_sha256 or file_sha256(model_file)) if model_file is not None else ""
    meta = read_embedded_meta(model_file) if model_file is not None else {}

    def record(session: Session) -> tuple[bool, int | None]:
        model: ModelRecord | None
        if model_file is not None:
            size = model_file.stat().st_size
            model = get_or_create_model(
                session, sha256=sha256, path=str(model_file), size_bytes=size, meta=meta
            )
        else:
            model = latest_model_at(session, str(model_path.expanduser().resolve()))
        if model is None:
            return False, None
        roots_text = [str(r) for r in roots]
        job_id = claim_run(
            session,
            run_key,
            model_id=model.id,
            roots=roots_text,
            pool=pool,
            batch_size=batch_size,
            settings=settings,
        )
        if job_id is None:
            return True, None
        now = ledger_now(session)
        open_enqueue(session, job_id, now)  # made and closed by the ledger's clock
        close_enqueue(session, job_id, reason, now)
        return False, job_id

    claimed_before, job_id = in_transaction(factory, record)
    if claimed_before:
        raise RunAlreadyClaimed(f"{run_key.schedule_name} at {run_key.scheduled_for} already has a job")
    return job_id
