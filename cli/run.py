"""`detq run`: process folders on this machine in one command, results in a folder; resumable."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import click

from cli.base import (
    DetqCommand,
    as_saved_option,
    examples,
    inference_options,
    load_settings,
    with_inference_flags,
)
from cli.following import follow
from cli.output import print_json
from db.clock import ledger_now
from db.history_repo import jobs_over_roots
from db.job_counts_repo import run_activity
from db.jobs_repo import delete_job, get_or_create_model
from db.ledger import Ledger, open_ledger
from db.models import ModelRecord
from detq.celery_app import make_celery_app
from detq.errors import DetqError
from detq.host import usable_cores
from detq.inference_settings import InferenceSettings
from detq.modelfile import file_sha256, read_embedded_meta
from detq.settings import Settings
from detq.vocabulary import JobPool, WorkerPool
from dispatch.reconcile import reconcile
from producer.enqueue import check_model_file, check_roots, enqueue_folders
from producer.local_workers import LocalWorkers, LocalWorkersFailed
from producer.progress import (
    EXIT_FINISHED_WITH_FAILURES,
    EXIT_TIMED_OUT,
    PercentLine,
    WaitTimeout,
    exit_code_for,
)
from producer.results import (
    check_copies_folder,
    check_out_folder,
    folder_exit_code,
    run_summary_lines,
    write_results,
)
from producer.scan import select_paths
from producer.status import JobStatus, job_status

EXIT_INTERRUPTED = 130


@click.command(
    cls=DetqCommand,
    epilog=examples(
        "detq run ~/photos/2026-11-30",
        "detq run /data/cam1 /data/cam2 --model detector.pt --out results --save-images",
        "detq run ~/photos --conf 0.5 --classes person,dog",
        "detq run ~/photos/IMG_0042.jpg 'cams/**/*.png'   # files, and a glob detq expands",
        "DETQ_BROKER_URL=redis://queue:6379/0 detq run /mnt/images --pool gpu   # on a fleet",
    ),
)
@click.argument("paths", nargs=-1, required=True, metavar="DIR|FILE|GLOB...")
@click.option(
    "--model", type=click.Path(path_type=Path, dir_okay=False), help="Model file (default: DETQ_MODEL)."
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("detq-results"),
    show_default=True,
    help="Folder for detections.jsonl, coco_results.json, coco_dataset.json (and images/).",
)
@click.option(
    "--save-images",
    is_flag=True,
    help="Also write annotated copies of the images to OUT/images, at their paths in the folder.",
)
@click.option(
    "--workers", type=click.IntRange(min=1), help="Local worker processes (default: cores, or GPUs)."
)
@click.option(
    "--pool",
    type=click.Choice([WorkerPool.CPU.value, WorkerPool.GPU.value]),
    default=WorkerPool.CPU.value,
    show_default=True,
    help="Which pool runs the images, and which local workers start.",
)
@click.option(
    "--local-workers/--no-local-workers",
    default=None,
    help="Start workers here (default: yes on the embedded default, no when DETQ_BROKER_URL names a fleet).",
)
@click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS", help="Give up after this."
)
@inference_options
@as_saved_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object at the end instead of text.")
def run(
    paths: tuple[str, ...],
    model: Path | None,
    out: Path,
    save_images: bool,
    workers: int | None,
    pool: str,
    local_workers: bool | None,
    timeout: float | None,
    conf: float | None,
    classes: str | None,
    imgsz: str | None,
    force: bool,
    as_saved: bool,
    as_json: bool,
) -> None:
    """Run the model over folders (or image files and globs) here and write the results to a folder.

    Starts the workers it needs, queues what is not done yet by this model at these settings (--conf,
    --classes, --imgsz; --force: every file), shows progress, and writes one line per image, COCO results
    and, with --save-images, annotated copies. Ctrl-C stops the workers cleanly; the same command again
    resumes. Exit 0: every image done, 4: finished with failures, 5: timed out.
    """
    settings = with_inference_flags(load_settings(), conf, classes, imgsz)
    settings = settings.replace(model=check_model_file(model or settings.model), **_as_saved(as_saved))
    inference = InferenceSettings.from_settings(settings)
    selection = select_paths(paths)
    roots = check_roots(selection.roots, settings.allowed_root_paths)
    check_out_folder(out)
    if save_images:
        check_copies_folder(out, roots)
    worker_pool = WorkerPool(pool)
    start_here = settings.is_embedded_broker if local_workers is None else local_workers
    processes = workers or (usable_cores() if worker_pool is WorkerPool.CPU else None)
    helpers = LocalWorkers(settings, worker_pool, processes, out / "worker.log") if start_here else None
    code, unread, followed = 0, 0, []
    # --timeout bounds the whole run: the workers' start, the scan and every job followed.
    deadline = None if timeout is None else time.monotonic() + timeout
    sha256 = file_sha256(settings.model)  # once: a detector file can be hundreds of MB
    with open_ledger(settings) as led:
        model_id = _model_id(led, settings.model, sha256)
        with led.reads() as session:
            began = ledger_now(session)  # what this run did is what finished since, by the ledger's clock
        try:
            if helpers is not None:
                if not as_json:
                    click.echo(
                        f"starting {processes or 'one per GPU'} {pool} worker processes here", err=True
                    )
                helpers.start()  # they load the model while the folders are scanned
            served = JobPool(pool) if helpers is not None else None
            queued = _queue(
                led,
                settings,
                (model_id, sha256, inference),
                (roots, selection.files),
                JobPool(pool),
                (force, as_json, served),
            )
            unread, followed = queued.unreadable, queued.job_ids
            if queued.needs_workers and helpers is not None:
                try:
                    _start_visibly(helpers, deadline, quiet=as_json)
                except LocalWorkersFailed as exc:
                    head, _, tail = str(exc).partition("\n")
                    note = _forget_new_job(led, queued.new_job)
                    raise LocalWorkersFailed(f"{head} ({note})" + (f"\n{tail}" if tail else "")) from exc
            # Each job followed with its progress line; one summary for the run and the folder at the end.
            finals = [follow(led, settings, job, timeout_s=_left(deadline), quiet=True) for job in followed]
            code = _exit_code(finals)
        except WaitTimeout as exc:
            click.echo(
                f"detq run: --timeout {timeout:g} s reached ({exc}); results so far are written", err=True
            )
            code = EXIT_TIMED_OUT
        except KeyboardInterrupt:
            click.echo("\nstopped; the same command resumes where this one stopped", err=True)
            code = EXIT_INTERRUPTED
        finally:
            if helpers is not None:
                helpers.stop()
        with led.reads() as session:
            record = session.get_one(ModelRecord, model_id)
            # report.html beside the rest: every image's latest result. A rerun with nothing new leaves
            # one that is there (its thumbnails take a second or two: such a rerun stays quick).
            try:
                written = write_results(
                    session,
                    (record, inference.key),
                    [str(r) for r in roots],
                    out,
                    only=None if selection.files is None else [str(f) for f in selection.files],
                    save_images=save_images,
                    report=bool(followed) or not (out / "report.html").exists(),
                    progress=_writing_progress() if save_images and not as_json else None,
                )
            except OSError as exc:  # a full disk, a folder gone: the results themselves are in the ledger
                raise DetqError(
                    f"cannot write the results to {out}: {exc.strerror or exc}; every image's result is"
                    " kept in the ledger, and the same command writes them once that is mended"
                ) from exc
            activity = run_activity(session, followed, began)
    if code == 0:
        code = folder_exit_code(written)  # 4 while the folder holds failed or rejected images, every rerun
    if as_json:
        print_json(
            {
                "out": str(out),
                "images": written.images,
                "statuses": written.statuses,
                "detections": written.detections,
                "annotated": written.annotated,
                "not_annotated": written.not_annotated,
                "unreadable_count": unread,
                "this_run": {
                    "done": activity.done,
                    "failed": activity.failed,
                    "rejected": activity.rejected,
                    "processing_s": activity.processing_s,
                },
                "settings": inference.to_json(),
                "exit_code": code,
            }
        )
    else:
        for line in run_summary_lines(activity, written, out):
            click.echo(line, err=True)
        if written.not_annotated:
            click.echo(
                f"{written.not_annotated} images could not be read to draw on (moved since?)", err=True
            )
    raise SystemExit(code)


def _model_id(led: Ledger, model: Path, sha256: str) -> int:
    with led.sessions() as session, session.begin():
        record = get_or_create_model(
            session,
            sha256=sha256,
            path=str(model),
            size_bytes=model.stat().st_size,
            meta=read_embedded_meta(model),
        )
        return record.id


class Queued(NamedTuple):
    """What `detq run` queued: the jobs to follow, whether any has images for workers, how many folders the
    scan could not read, and the job this run made (None: none kept)."""

    job_ids: list[int]
    needs_workers: bool
    unreadable: int
    new_job: int | None = None


def _forget_new_job(led: Ledger, job_id: int | None) -> str:
    """This run's job deleted where its workers never started (nothing of it done): a next run starts
    afresh instead of resuming a job queued for workers that could not run. Says what was done."""
    if job_id is None:
        return "no job was made"
    with led.sessions() as session, session.begin():
        status = job_status(session, job_id)
        if status.done or status.failed:
            return f"job {job_id} is kept ({status.done + status.failed} of its images ended)"
        delete_job(session, job_id)
    return f"job {job_id}, made by this run, was deleted: nothing of it had run"


def _queue(
    led: Ledger,
    settings: Settings,
    model: tuple[int, str, InferenceSettings],
    selected: tuple[list[Path], list[Path] | None],
    pool: JobPool,
    flags: tuple[bool, bool, JobPool | None],
) -> Queued:
    """Send again what earlier runs over these folders at these settings left unsent, and queue what is
    new (every file, with force); selected: the roots, and the files of them given (None: all of them);
    flags: force, quiet, and the pool this run's own workers serve (None: a fleet's, any pool), whose
    other jobs are not waited on."""
    model_id, sha256, inference = model
    roots, files = selected
    force, quiet, served = flags
    app = make_celery_app(settings)
    try:
        with led.reads() as session:
            earlier = jobs_over_roots(session, model_id, inference.key, [str(r) for r in roots])
            unfinished = [job.id for job in earlier if job.finished_at is None]
            # An earlier run's job for a pool this run's workers do not serve (`--pool gpu` before, on a
            # host without a GPU) is not waited on: said, with what to type.
            elsewhere = [job for job in earlier if job.finished_at is None and not _serves(served, job.pool)]
        for job in elsewhere:
            unfinished.remove(job.id)
            click.echo(
                f"detq run: job {job.id}, left unfinished by an earlier run, is queued for the {job.pool}"
                f" pool, which no worker of this run serves: not waiting for it (detq cancel {job.id}, then"
                f" run again, runs its images here; or detq run --pool {job.pool} where such workers are)",
                err=True,
            )
        for job_id in unfinished:
            reconcile(led, app, settings, job_id=job_id, grace_s=0)  # send again what a stop left unsent
        if unfinished and not quiet:
            click.echo(f"resuming job {', '.join(map(str, unfinished))}", err=True)
        new = enqueue_folders(
            led.sessions,
            app,
            roots=roots,
            model_path=settings.model,
            pool=pool,
            batch_size=settings.batch_size,
            allowed_roots=settings.allowed_root_paths,
            only_new=not force,
            max_retries=settings.max_retries,
            heartbeat_s=settings.heartbeat_interval_s,
            worker_timeout_s=settings.worker_timeout,
            model_sha256=sha256,
            settings=inference,
            files=files,
        )
    finally:
        app.close()
    for line in new.notes.warnings(new.job_id):
        click.echo(f"detq run: warning: {line}", err=True)
    if new.total and not quiet:  # its id: what detq status, export and report take
        click.echo(f"job {new.job_id}: {new.total} images queued ({inference.describe()})", err=True)
    if not new.total and not new.refused and not unfinished and not quiet and new.notes.images:
        skipped = new.counts.skipped if new.counts is not None else 0
        waiting = "".join(f"; job {job.id} holds some, queued for the {job.pool} pool" for job in elsewhere)
        click.echo(
            f"nothing new to queue: {skipped} images found, none new or changed since this model's"
            f" earlier runs at these settings ({inference.describe()}; --force runs them again{waiting})",
            err=True,
        )
    # A new job of names refused at the scan only (rejected at once), or whose scan left folders unread, is
    # followed for its summary and exit code, with no worker to wait for.
    kept = new.total or new.refused or new.notes.unreadable_count
    if not kept:  # a job of nothing: each rerun over a done folder would add one to `detq jobs`
        with led.sessions() as session, session.begin():
            delete_job(session, new.job_id)
    followed = [*unfinished, new.job_id] if kept else unfinished
    return Queued(
        followed, bool(new.total or unfinished), new.notes.unreadable_count, new.job_id if kept else None
    )


def _serves(served: JobPool | None, pool: str) -> bool:
    """Whether workers of this run (of pool `served`; None: a fleet's, any pool) take a job of `pool`."""
    return served is None or pool in (served.value, JobPool.ANY.value)


def _start_visibly(helpers: LocalWorkers, deadline: float | None, *, quiet: bool) -> None:
    """Wait for the local workers to load the model, saying so as it goes (one line, redrawn on a
    terminal), then how long it took and, once, the workers' warnings that concern the user."""
    began = time.monotonic()
    live = not quiet and sys.stderr.isatty()
    if not quiet and not live:
        click.echo("loading the model in the worker processes...", err=True)

    def on_wait(ready: int, expected: int) -> None:
        if live:
            elapsed = time.monotonic() - began
            line = f"\rloading the model: {ready} of {expected} processes ready ({elapsed:.0f} s)"
            click.echo(line, nl=False, err=True)

    helpers.wait_ready(until=deadline, on_wait=on_wait)
    if not quiet:
        click.echo(
            ("\r" if live else "") + f"workers ready in {time.monotonic() - began:.1f} s" + " " * 20, err=True
        )
        for line in helpers.warnings():
            click.echo(f"detq run: worker warning: {line}", err=True)


def _writing_progress() -> Callable[[int, int], None] | None:
    """Progress while the results and annotated copies are written: a percentage redrawn on a terminal
    (PercentLine), else nothing (the closing lines follow)."""
    if not sys.stderr.isatty():
        return None
    shown: list[PercentLine] = []

    def progress(done: int, total: int) -> None:
        if not shown:
            shown.append(PercentLine("writing annotated copies", total, sys.stderr))
        shown[0]()
        if done == total:
            shown[0].clear()

    return progress


def _left(deadline: float | None) -> float | None:
    """Seconds left before the run's deadline (a moment at least, so a follow past it polls once)."""
    return None if deadline is None else max(0.01, deadline - time.monotonic())


def _exit_code(finals: list[JobStatus]) -> int:
    return EXIT_FINISHED_WITH_FAILURES if any(exit_code_for(f) for f in finals) else 0


def _as_saved(flag: bool) -> dict[str, bool]:
    """--as-saved as a setting; without it, DETQ_AS_SAVED as it is."""
    return {"as_saved": True} if flag else {}
