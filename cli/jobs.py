"""The producer's commands: enqueue folders, follow a job, list jobs, export results, requeue."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cli.base import DetqCommand, examples, inference_options, load_settings, with_inference_flags
from cli.following import follow, no_worker_hint
from cli.output import print_json, table
from db.clock import ledger_now
from db.job_counts_repo import job_counts
from db.jobs_repo import latest_job_id, list_jobs
from db.ledger import open_ledger
from detq.celery_app import make_celery_app
from detq.contract import MAX_BATCH_SIZE, MIN_BATCH_SIZE
from detq.display import visible
from detq.inference_settings import InferenceSettings
from detq.vocabulary import ExportFormat, JobPool, choices
from producer.enqueue import enqueue_folders
from producer.export import PASSES, export_job
from producer.files import write_atomically
from producer.progress import PercentLine, exit_code_for, render_line, time_taken
from producer.requeue import requeue_missing
from producer.status import JobNotFound, job_or_latest, job_status

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
WAIT_OPTION = click.option("--wait", is_flag=True, help="Show live progress until the job finishes.")
TIMEOUT_OPTION = click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="With --wait: give up (exit 1) after this many seconds.",
)


def _scan_progress(images: int, batches: int) -> None:
    click.echo(f"\r\x1b[2Kscanning: {images} images queued in {batches} batches", err=True, nl=False)


@click.command(
    cls=DetqCommand,
    epilog=examples(
        "detq enqueue /data/images --wait",
        "detq enqueue /mnt/cam1 /mnt/cam2 --pool gpu --batch-size 32 --json",
        "detq enqueue /data/images --only-new --model /models/detector.pt",
        "detq enqueue /data/images --conf 0.5 --classes person,car --wait",
    ),
)
@click.argument("folders", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="DIR...")
@click.option(
    "--model",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Model file the job runs with (default: DETQ_MODEL).",
)
@click.option(
    "--pool",
    type=click.Choice(choices(JobPool)),
    default=JobPool.ANY.value,
    show_default=True,
    help="Which workers may take the job: the gpu pool, the cpu pool, or any.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(MIN_BATCH_SIZE, MAX_BATCH_SIZE),
    help="Images per queued task (default: DETQ_BATCH_SIZE).",
)
@click.option("--no-recursive", is_flag=True, help="Do not descend into subfolders.")
@click.option(
    "--only-new",
    is_flag=True,
    help="Only images new or changed since this model processed them, and failures up to DETQ_MAX_RETRIES.",
)
@inference_options
@WAIT_OPTION
@TIMEOUT_OPTION
@JSON_OPTION
def enqueue(
    folders: tuple[Path, ...],
    model: Path | None,
    pool: str,
    batch_size: int | None,
    no_recursive: bool,
    only_new: bool,
    conf: float | None,
    classes: str | None,
    imgsz: str | None,
    force: bool,
    wait: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Scan folders and queue their images as a job.

    The job records its inference settings (--conf, --classes, --imgsz, else DETQ_*); with --only-new,
    files done before by this model at other settings are new work. Prints the job id; --wait follows it
    to the end (exit 0: every image done, 4: finished with failures, 5: timed out), --json prints one
    object.
    """
    if force and only_new:
        raise click.UsageError("--force runs every file, --only-new only those not done: give one")
    settings = with_inference_flags(load_settings(), conf, classes, imgsz)
    show_scan = sys.stderr.isatty() and not as_json
    with open_ledger(settings) as led:
        result = enqueue_folders(
            led.sessions,
            make_celery_app(settings),
            roots=folders,
            model_path=model or settings.model,
            pool=JobPool(pool),
            batch_size=batch_size or settings.batch_size,
            recursive=not no_recursive,
            allowed_roots=settings.allowed_root_paths,
            on_progress=_scan_progress if show_scan else None,
            only_new=only_new,
            max_retries=settings.max_retries,
            heartbeat_s=settings.heartbeat_interval_s,
            worker_timeout_s=settings.worker_timeout,
            settings=InferenceSettings.from_settings(settings),
        )
        if show_scan:
            click.echo("\r\x1b[2K", err=True, nl=False)
        payload: dict[str, object] = {
            "job_id": result.job_id,
            "total": result.total,
            "batches": result.batches,
            "unreadable_folders": [{"folder": f, "reason": r} for f, r in result.notes.unreadable],
            "unreadable_count": result.notes.unreadable_count,
        }
        if result.counts is not None:
            payload.update(vars(result.counts))
            if not as_json:
                c = result.counts
                click.echo(f"new {c.new}, changed {c.changed}, retried {c.retried}, skipped {c.skipped}")
        if not as_json:
            click.echo(
                f"job {result.job_id}: {result.total} images queued in {result.batches} batches ({pool})"
            )
        final = follow(led, settings, result.job_id, timeout_s=timeout, quiet=as_json) if wait else None
        for line in result.notes.warnings(result.job_id):  # after the summary: the last word
            click.echo(f"detq enqueue: warning: {line}", err=True)
        if final is None and result.total and not as_json:
            hint = no_worker_hint(led, settings, pool)()  # --wait says it as it follows
            if hint:
                click.echo(hint, err=True)
    if final is not None:
        payload.update(final.as_dict())
    if as_json:
        print_json(payload)
    elif final is None:
        click.echo(result.job_id)
    if final is not None:
        raise SystemExit(exit_code_for(final))  # exit 4 too where a folder was not read


@click.command(
    cls=DetqCommand,
    epilog=examples("detq status", "detq status 42 --wait --timeout 600", "detq status 42 --json"),
)
@click.argument("job", type=click.IntRange(min=1), required=False)
@JSON_OPTION
@WAIT_OPTION
@TIMEOUT_OPTION
def status(job: int | None, as_json: bool, wait: bool, timeout: float | None) -> None:
    """State and counts of a job (default: the latest).

    Counts: total, pending, done, failed, rejected, detections. With --wait, the exit code says how it
    ended: 0 every image done, 4 finished with failures, 5 timed out.
    """
    settings = load_settings()
    with open_ledger(settings) as led:
        with led.reads() as session:
            job_id = job or latest_job_id(session)
        if job_id is None:
            raise JobNotFound("no jobs yet")
        hint = None
        if wait:
            current = follow(led, settings, job_id, timeout_s=timeout, quiet=as_json)
        else:
            with led.reads() as session:
                current = job_status(session, job_id)
            if not as_json and not current.state.ended:
                hint = no_worker_hint(led, settings, current.pool)()
    if as_json:
        print_json(current.as_dict())
    elif not wait:
        click.echo(render_line(current, rate=None))
        roots = visible(", ".join(current.roots))
        click.echo(f"detections {current.detections}, elapsed {time_taken(current)}, roots {roots}")
        click.echo(f"settings: {current.settings_line}")
        if current.closed_reason:
            click.echo(f"closed early: {visible(current.closed_reason)}")
        if (unread := current.unreadable_line()) is not None:
            click.echo(unread)
        if hint:
            click.echo(hint)
    if wait:
        raise SystemExit(exit_code_for(current))


@click.command(cls=DetqCommand, epilog=examples("detq jobs", "detq jobs --limit 5 --json", "detq jobs --all"))
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="How many jobs, newest first."
)
@click.option("--all", "show_all", is_flag=True, help="Also the scheduled runs that found nothing new.")
@JSON_OPTION
def jobs(limit: int, show_all: bool, as_json: bool) -> None:
    """Recent jobs with their state and counts."""
    with open_ledger(load_settings()) as led, led.reads() as session:
        listed = list_jobs(session, limit, hide_empty_runs=not show_all)
        now = ledger_now(session)  # one reading of the ledger's clock for every job listed
        statuses = [job_status(session, job.id, now=now) for job in listed]
    if as_json:
        print_json([s.as_dict() for s in statuses])
        return
    if not statuses:
        click.echo("no jobs yet")
        return
    headers = (
        "job",
        "state",
        "finished",
        "total",
        "failed",
        "rejected",
        "pool",
        "model",
        "settings",
        "created",
        "root",
    )
    rows = [
        (
            s.job_id,
            s.state.value,
            s.done + s.failed + s.rejected,
            s.total,
            s.failed,
            s.rejected,
            s.pool,
            s.model_name,
            s.settings_words,
            s.created_at[:19],
            s.roots[0] + (f" (+{len(s.roots) - 1})" if len(s.roots) > 1 else ""),
        )
        for s in statuses
    ]
    click.echo(table(headers, rows))


@click.command(
    cls=DetqCommand,
    epilog=examples(
        "detq export 42 --format csv -o results.csv",
        "detq export 42 --format jsonl | head",
        "detq export 42 --format coco -o detections.json",
        "detq export 42 --format coco-dataset -o dataset.json",
        "detq export --format csv -o latest.csv   # the latest job",
    ),
)
@click.argument("job", type=click.IntRange(min=1), required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(choices(ExportFormat)),
    required=True,
    help="csv: a row per detection; jsonl: a line per image; coco: COCO results (a list, as "
    "pycocotools' loadRes takes); coco-dataset: images, categories and annotations.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="File to write, replaced only once complete (default: standard output).",
)
def export(job: int | None, fmt: str, output: Path | None) -> None:
    """Write a job's results (default: the latest job's) as CSV, JSONL or COCO.

    With -o, the file is written beside its final name and renamed over it once complete.
    """
    export_format = ExportFormat(fmt)
    with open_ledger(load_settings()) as led, led.reads() as session:
        job = job_or_latest(session, job, said=lambda text: click.echo(text, err=True))
        if output is None:
            export_job(session, job, export_format, sys.stdout)
            return
        images = job_counts(session, job).total if sys.stderr.isatty() else 0
        reads = images * PASSES.get(export_format, 1)
        shown = PercentLine(f"exporting job {job}", reads, sys.stderr) if reads else None
        count = write_atomically(output, lambda out: export_job(session, job, export_format, out, shown))
        if shown is not None:
            shown.clear()
    unit = "lines" if export_format is ExportFormat.JSONL else "records"
    click.echo(f"wrote {count} {unit} to {output}")


@click.command(cls=DetqCommand, epilog=examples("detq requeue 42", "detq requeue 42 --json"))
@click.argument("job", type=click.IntRange(min=1))
@JSON_OPTION
def requeue(job: int, as_json: bool) -> None:
    """Send a job's lost batches again.

    Only batches with pending images and no copy queued or held by a live worker: a purged queue,
    a message the embedded broker lost. The reconciler does this by itself; this does it now.
    """
    settings = load_settings()
    app = make_celery_app(settings)
    with open_ledger(settings) as led:
        sent = requeue_missing(led, app, settings, job)
    app.close()
    if as_json:
        print_json({"job_id": job, "images": sent.images, "batches": sent.batches, "restored": sent.restored})
    else:
        click.echo(
            f"job {job}: re-sent {sent.images} pending images in {sent.batches} batches that no message "
            f"would deliver; {sent.restored} batches of dead workers given back"
        )
