"""Turn folders into a job: record the model, stream image rows into the ledger, send one task per batch."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from db.images_repo import NewImage, insert_images
from db.jobs_repo import create_job, finish_enqueue, get_or_create_model
from db.schedules_repo import RunCounts, RunKey, claim_run, set_run_counts
from detq.contract import TASK_PROCESS_BATCH, BatchMessage, batches_of, check_batch_size, queue_for_pool
from detq.errors import DetqError
from detq.modelfile import file_sha256, read_embedded_meta
from detq.vocabulary import Pool
from producer.incremental import DEFAULT_MAX_RETRIES, Tally, select_files
from producer.scan import scan_roots

log = logging.getLogger(__name__)

# Image rows are inserted (and committed) in chunks of this many before their tasks are sent, so the
# producer's memory stays flat on folders of millions of files and workers start while scanning goes on.
INSERT_CHUNK = 2000


class EnqueueError(DetqError, ValueError):
    """The request cannot become a job (missing folder, model, or a root outside the allowed roots)."""


class RunAlreadyClaimed(Exception):
    """The scheduled run of this key already has a job (another scheduler, or a redelivered message)."""


@dataclass(frozen=True)
class EnqueueResult:
    """A job that was created and queued."""

    job_id: int
    total: int
    batches: int
    model_sha256: str
    counts: RunCounts | None = None  # what an incremental (only_new) scan found


def check_roots(
    roots: Sequence[Path], allowed_roots: Sequence[Path], *, recursive: bool = True
) -> list[Path]:
    """Resolve roots; each must be an existing folder inside the allowed roots when those are set.

    Scanned recursively, a root inside another given root would list its files twice: it is dropped.
    """
    resolved = []
    for root in roots:
        path = root.expanduser().resolve()
        if not path.is_dir():
            raise EnqueueError(f"not a folder: {root}")
        if allowed_roots and not any(path.is_relative_to(a) for a in allowed_roots):
            raise EnqueueError(
                f"{path} is outside DETQ_ALLOWED_ROOTS; workers would reject every image in it"
            )
        if path not in resolved:
            resolved.append(path)
    if not resolved:
        raise EnqueueError("no folder given")
    if recursive:
        resolved = [r for r in resolved if not any(r != o and r.is_relative_to(o) for o in resolved)]
    return resolved


def enqueue_folders(
    factory: sessionmaker[Session],
    app: Celery,
    *,
    roots: Sequence[Path],
    model_path: Path,
    pool: Pool,
    batch_size: int,
    recursive: bool = True,
    allowed_roots: Sequence[Path] = (),
    on_progress: Callable[[int, int], None] | None = None,
    only_new: bool = False,
    max_retries: int = DEFAULT_MAX_RETRIES,
    run_key: RunKey | None = None,
) -> EnqueueResult:
    """Create a job for the image files under `roots` and queue them in batches of `batch_size` ids.

    only_new queues only files new or changed since this model last processed them, and earlier failures
    up to max_retries (producer/incremental.py). run_key makes the job a scheduled run, created only if no
    job has that key yet (else RunAlreadyClaimed).
    """
    queue = queue_for_pool(pool)
    try:
        check_batch_size(batch_size)
    except ValueError as exc:
        raise EnqueueError(str(exc)) from None
    resolved = check_roots(roots, allowed_roots, recursive=recursive)
    model_file = model_path.expanduser().resolve()
    if not model_file.is_file():
        raise EnqueueError(f"model file not found: {model_path}")
    sha256 = file_sha256(model_file)
    meta = read_embedded_meta(model_file)

    with factory() as session, session.begin():
        model = get_or_create_model(
            session, sha256=sha256, path=str(model_file), size_bytes=model_file.stat().st_size, meta=meta
        )
        model_id, roots_text = model.id, [str(r) for r in resolved]
        if run_key is None:
            job_id = create_job(
                session, model_id=model_id, roots=roots_text, pool=pool, batch_size=batch_size
            ).id
        else:
            claimed = claim_run(
                session, run_key, model_id=model_id, roots=roots_text, pool=pool, batch_size=batch_size
            )
            if claimed is None:
                raise RunAlreadyClaimed(
                    f"{run_key.schedule_name} at {run_key.scheduled_for} already has a job"
                )
            job_id = claimed

    total = 0
    batches = 0
    tally = Tally() if only_new else None
    files = scan_roots(resolved, recursive=recursive)
    with app.producer_or_acquire() as producer:
        while chunk := list(islice(files, INSERT_CHUNK)):
            with factory() as session, session.begin():
                if tally is not None:
                    # Looked up in the insert's transaction: on SQLite no other run's rows slip in between.
                    chunk = select_files(session, model_id, chunk, max_retries, tally)
                rows = [NewImage(f.path, f.size_bytes, f.mtime, f.root_index) for f in chunk]
                ids = insert_images(session, job_id, rows)
            for batch in batches_of(ids, batch_size):
                app.send_task(
                    TASK_PROCESS_BATCH,
                    args=BatchMessage(job_id, batch).args(),
                    queue=queue,
                    routing_key=queue,
                    producer=producer,
                )
                batches += 1
            total += len(ids)
            if on_progress is not None:
                on_progress(total, batches)
    counts = tally.counts() if tally is not None else None
    with factory() as session, session.begin():
        if counts is not None:
            set_run_counts(session, job_id, counts)
        finish_enqueue(session, job_id, total)
    log.info("job %d: %d images in %d batches queued on %r", job_id, total, batches, queue)
    return EnqueueResult(job_id=job_id, total=total, batches=batches, model_sha256=sha256, counts=counts)
