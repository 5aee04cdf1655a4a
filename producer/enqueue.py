"""Turn folders into a job: record the model, stream image rows into the ledger, send one task per batch."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from celery import Celery
from kombu import exceptions as kombu_errors
from sqlalchemy.orm import Session, sessionmaker

from db.batches_repo import mark_sent
from db.clock import ledger_now
from db.enqueue_repo import close_enqueue, lock_open_enqueue, take_back_producer_gone
from db.jobs_repo import finish_enqueue, get_job, set_unreadable_folders
from db.retry import in_transaction
from db.schedules_repo import RunCounts, RunKey, set_run_counts
from detq.contract import check_batch_size, queue_for_pool
from detq.errors import DetqError
from detq.inference_settings import DEFAULTS, InferenceSettings
from detq.modelfile import file_sha256, identify_model_file, read_embedded_meta
from detq.vocabulary import JobPool
from dispatch.send import broker_error_reason, check_broker
from producer.enqueue_watch import EnqueueWatch
from producer.fleet import processes_on_queue
from producer.incremental import DEFAULT_MAX_RETRIES, Tally, select_files
from producer.new_job import create_enqueue_job
from producer.read_ahead import ChunksAhead
from producer.record_chunk import record_chunk
from producer.scan import ScannedFile, ScanNotes, scan_files, scan_roots
from producer.sender import ChunkSender
from producer.unqueued_run import record_unqueued_run

log = logging.getLogger(__name__)

# Image rows are inserted (and committed) in chunks of this many before their tasks are sent, so the
# producer's memory stays flat on folders of millions of files and workers start while scanning goes on.
INSERT_CHUNK = 2000
# What a broker that cannot be reached raises: kombu wraps connection errors (a pipelined publish's in
# BatchPublishError), sockets raise OSError.
BROKER_ERRORS = (
    kombu_errors.OperationalError,
    kombu_errors.BatchPublishError,  # type: ignore[attr-defined]  # (its stubs predate kombu 5.7)
    ConnectionError,
    TimeoutError,
)


class EnqueueError(DetqError, ValueError):
    """The request cannot become a job (missing folder, model, or a root outside the allowed roots)."""


class UnusableRoots(EnqueueError):
    """A root that is not a folder, or lies outside the allowed roots: nothing of the job can be scanned."""


@dataclass(frozen=True)
class EnqueueResult:
    """A job that was created and queued."""

    job_id: int
    total: int  # images queued
    batches: int
    model_sha256: str
    counts: RunCounts | None = None  # what an incremental (only_new) scan found
    refused: int = 0  # files recorded as rejected at once (a name that is not UTF-8, a path too long)
    notes: ScanNotes = field(default_factory=ScanNotes)  # what the scan passed over (unreadable folders)


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
            raise UnusableRoots(f"not a folder: {root}")
        if allowed_roots and not any(path.is_relative_to(a) for a in allowed_roots):
            raise UnusableRoots(
                f"{path} is outside DETQ_ALLOWED_ROOTS; workers would reject every image in it"
            )
        if path not in resolved:
            resolved.append(path)
    if not resolved:
        raise UnusableRoots("no folder given")
    if recursive:
        resolved = [r for r in resolved if not any(r != o and r.is_relative_to(o) for o in resolved)]
    return resolved


def enqueue_folders(
    factory: sessionmaker[Session],
    app: Celery,
    *,
    roots: Sequence[Path],
    model_path: Path,
    pool: JobPool,
    batch_size: int,
    recursive: bool = True,
    allowed_roots: Sequence[Path] = (),
    on_progress: Callable[[int, int], None] | None = None,
    only_new: bool = False,
    max_retries: int = DEFAULT_MAX_RETRIES,
    run_key: RunKey | None = None,
    heartbeat_s: float = 5.0,
    model_sha256: str | None = None,
    worker_timeout_s: float | None = None,
    settings: InferenceSettings = DEFAULTS,
    files: Sequence[Path] | None = None,
) -> EnqueueResult:
    """Create a job for the image files under `roots` and queue them in batches of `batch_size` ids; with
    files (absolute, under the roots), for those files only (`detq run a.jpg 'b/*.png'`).

    The job records the inference settings its workers apply. only_new queues only files new or changed
    since this model processed them at these settings, and earlier failures up to max_retries
    (producer/incremental.py). run_key makes the job a scheduled run, created only if no
    job has that key yet (else RunAlreadyClaimed). model_sha256 spares hashing a model the caller hashed.
    With worker_timeout_s, the job's last batches taper for the pool processes heard from within it
    (producer/taper.py); without, every batch is full.
    """
    queue = queue_for_pool(pool)
    try:
        check_batch_size(batch_size)
    except ValueError as exc:
        raise EnqueueError(str(exc)) from None
    try:
        resolved = check_roots(roots, allowed_roots, recursive=recursive)
        model_file = check_model_file(model_path)
    except EnqueueError as exc:
        if run_key is not None:  # a scheduled run says in the ledger why it queued nothing
            _record_unqueued_run(
                factory, model_path, model_sha256, run_key, (roots, pool, batch_size, settings), exc
            )
        raise
    try:
        check_broker(app)
    except BROKER_ERRORS as exc:
        raise EnqueueError(
            f"cannot reach the broker: {broker_error_reason(exc)}; nothing was queued"
        ) from None
    sha256 = model_sha256 or file_sha256(model_file)
    meta = read_embedded_meta(model_file)
    check_classes(settings.classes, meta, model_file)
    job_id, model_id = create_enqueue_job(
        factory, model_file, sha256, meta, resolved, pool, batch_size, run_key, settings
    )
    processes = 0
    if worker_timeout_s is not None:
        with factory() as session:
            processes = processes_on_queue(session, queue, ledger_now(session), timeout_s=worker_timeout_s)

    tally = Tally() if only_new else None
    recorded = 0  # rows, refused names included
    notes = ScanNotes()  # filled by the scan's thread, read once it has ended
    found = (
        scan_roots(resolved, recursive=recursive, notes=notes)
        if files is None
        else scan_files(files, resolved, notes)
    )
    with (
        EnqueueWatch(factory, job_id, heartbeat_s),
        ChunksAhead(found, INSERT_CHUNK) as chunks,
        ChunkSender(app, job_id, pool) as sender,
    ):
        try:
            sent: list[int] = []  # batches whose messages are out, marked in the next transaction
            # Files selected but not recorded yet: the part of a chunk short of a whole batch, recorded
            # with the next chunk's, so that a run that finds a few new files in every chunk cuts whole
            # batches across chunks (at most batch_size - 1 files, held while the next chunk is scanned).
            carried: list[ScannedFile] = []

            def record(chunk: list[ScannedFile], last: bool) -> None:
                nonlocal sent, recorded, carried
                with factory() as session, session.begin():
                    mark_sent(session, sent, ledger_now(session))
                    # Kept open until this chunk commits: a reconciler that took this producer for a dead
                    # one, or `detq cancel`, counts the chunk or comes first and keeps it out.
                    still_open = lock_open_enqueue(session, job_id)
                    if still_open:
                        if tally is not None and chunk:
                            # Looked up in the insert's transaction: on SQLite no other run's rows slip in.
                            chunk = select_files(session, (model_id, settings.key), chunk, max_retries, tally)
                        chunk, carried = _carry_part_batch([*carried, *chunk], batch_size, last)
                        batches, refused = record_chunk(
                            session, job_id, chunk, batch_size, processes if last else 0
                        )
                if not still_open:
                    raise _closed_under_it(factory, job_id, recorded)
                recorded += refused + sum(len(ids) for _, ids in batches)
                sent = sender.submit(batches)  # sent while the next chunk is scanned and recorded
                if on_progress is not None:
                    on_progress(sender.images, sender.batches)

            for chunk in chunks:
                # A short chunk is the last: its batches taper (a folder of an exact multiple of
                # INSERT_CHUNK files ends on a full chunk, and what it carried is recorded after it).
                record(chunk, last=len(chunk) < INSERT_CHUNK)
            if carried:
                record([], last=True)
            sent += sender.finish()
        except BROKER_ERRORS as exc:
            # The broker away is nothing of the images': those recorded stay pending, and any reconciler
            # (in every worker and scheduler) sends their batches once the broker is back.
            why = f"the broker became unreachable during enqueue ({broker_error_reason(exc)})"
            reason = f"enqueue interrupted: {why}; the images recorded run once it is back"
            kept = in_transaction(factory, lambda s: close_enqueue(s, job_id, reason, ledger_now(s)))
            raise EnqueueError(
                f"job {job_id} closed with the {kept} images recorded, which run once the broker is back:"
                f" {why}; enqueue the folders again with --only-new for the rest"
            ) from None
    counts = tally.counts() if tally is not None else None
    with factory() as session, session.begin():
        now = ledger_now(session)  # the job's times are the ledger's, as `detq status` reads them
        mark_sent(session, sent, now)
        # Closed since its last chunk? By a reconciler that took this producer, stalled past the timeout,
        # for a dead one: its close counted every file, and its reason is taken back. By `detq cancel`:
        # said below.
        finished = lock_open_enqueue(session, job_id) or take_back_producer_gone(session, job_id)
        if counts is not None:
            set_run_counts(session, job_id, counts)
        if notes.unreadable_count:
            set_unreadable_folders(session, job_id, notes.unreadable_count, notes.unreadable)
        if finished:
            finish_enqueue(session, job_id, recorded, now)
    if not finished:
        raise _closed_under_it(factory, job_id, recorded, scanned=True)
    if on_progress is not None:
        on_progress(sender.images, sender.batches)
    log.info("job %d: %d images in %d batches queued on %r", job_id, sender.images, sender.batches, queue)
    return EnqueueResult(
        job_id=job_id,
        total=sender.images,
        batches=sender.batches,
        model_sha256=sha256,
        counts=counts,
        refused=recorded - sender.images,
        notes=notes,
    )


def check_classes(classes: Sequence[str], meta: dict[str, object], model_file: Path) -> None:
    """Refuse class names the model does not have (a typo would keep no detection at all), where its
    embedded metadata names its classes; label ids are always taken."""
    known = meta.get("classes")
    if not classes or not isinstance(known, list) or not known:
        return
    unknown = [c for c in classes if not c.isdigit() and c not in known]
    if unknown:
        names = ", ".join(map(str, known[:40])) + (", ..." if len(known) > 40 else "")
        raise EnqueueError(
            f"{model_file.name} has no class {', '.join(map(repr, unknown))}; its classes are: {names}"
        )


def check_model_file(model_path: Path) -> Path:
    """The resolved model file; EnqueueError unless it is a TorchScript or torch.export archive, saying
    what it is instead (a state_dict, a pickled module, an Ultralytics checkpoint, ONNX...) and the command
    that converts it: read without torch or unpickling, before any job or worker exists."""
    model_file = model_path.expanduser().resolve()
    if not model_file.is_file():
        raise EnqueueError(f"model file not found: {model_path}")
    found = identify_model_file(model_file)
    if not found.runs:
        raise EnqueueError(found.refusal(str(model_path)))
    return model_file


def _closed_under_it(
    factory: sessionmaker[Session], job_id: int, recorded: int, *, scanned: bool = False
) -> EnqueueError:
    """The error of an enqueue whose job was closed under it: by whom, what is left, what to do;
    scanned: after its last file was recorded."""
    with factory() as session:
        job = get_job(session, job_id)
        reason = job.closed_reason if job is not None else None
    closed = f'job {job_id} was closed while it was being enqueued: "{reason or "deleted"}"'
    if scanned:
        return EnqueueError(f"{closed}, after all its {recorded} files were recorded")
    return EnqueueError(
        f"{closed}; its images are the {recorded} files recorded before; enqueue the folders again with"
        " --only-new for the rest"
    )


def _record_unqueued_run(
    factory: sessionmaker[Session],
    model_path: Path,
    model_sha256: str | None,
    run_key: RunKey,
    job: tuple[Sequence[Path], JobPool, int, InferenceSettings],
    error: EnqueueError,
) -> None:
    """The scheduled run's job, closed at once with the reason it could not start (a share not mounted
    that night, a model file moved away); job: its roots, pool, batch size and settings;
    RunAlreadyClaimed if it exists."""
    roots, pool, batch_size, settings = job
    try:
        model_file: Path | None = check_model_file(model_path)
    except EnqueueError:
        model_file = None
    record_unqueued_run(
        factory,
        run_key,
        model_path=model_path,
        model_file=model_file,
        model_sha256=model_sha256,
        roots=roots,
        pool=pool,
        batch_size=batch_size,
        reason=f"nothing queued: {error}",
        settings=settings,
    )


def _carry_part_batch(
    files: list[ScannedFile], batch_size: int, last: bool
) -> tuple[list[ScannedFile], list[ScannedFile]]:
    """(to record now, to carry to the next chunk): the accepted files past the last whole batch wait for
    the next chunk's, unless this chunk is the last. Refused files are recorded at once (no batch)."""
    if last:
        return files, []
    accepted = [f for f in files if not f.refused]
    keep = len(accepted) - len(accepted) % batch_size
    carried = accepted[keep:]
    if not carried:
        return files, []
    held = {id(f) for f in carried}
    return [f for f in files if id(f) not in held], carried
