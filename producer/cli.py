"""The `detq` command line: enqueue, status, jobs, export, requeue, db, demo, and (lazily) worker."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from sqlalchemy.orm import Session, sessionmaker

from detq.settings import Settings, get_settings
from producer.status import JobStatus, job_status

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detq", description="Run a trained object detector over folders of images with Celery workers."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    enq = sub.add_parser("enqueue", help="scan folders and queue their images as a job")
    enq.add_argument("folders", nargs="+", type=Path, metavar="DIR")
    enq.add_argument("--model", type=Path, help="model file (default: DETQ_MODEL)")
    enq.add_argument("--pool", choices=("any", "gpu", "cpu"), default="any", help="which workers may take it")
    enq.add_argument("--batch-size", type=int, help="images per task (default: DETQ_BATCH_SIZE)")
    enq.add_argument("--no-recursive", action="store_true", help="do not descend into subfolders")
    enq.add_argument(
        "--only-new",
        action="store_true",
        help="only images new or changed since this model processed them (and failures, DETQ_MAX_RETRIES)",
    )
    enq.add_argument("--wait", action="store_true", help="show progress until the job finishes")
    enq.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds")
    enq.add_argument("--json", action="store_true", help="print one JSON object")

    st = sub.add_parser("status", help="state and counts of a job (default: the latest)")
    st.add_argument("job", nargs="?", type=int)
    st.add_argument("--json", action="store_true")
    st.add_argument("--wait", action="store_true", help="show progress until the job finishes")
    st.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds")

    jobs = sub.add_parser("jobs", help="list recent jobs")
    jobs.add_argument("--limit", type=int, default=20)
    jobs.add_argument("--json", action="store_true")

    ex = sub.add_parser("export", help="write a job's results as CSV, JSON lines or COCO JSON")
    ex.add_argument("job", type=int)
    ex.add_argument("--format", choices=("csv", "jsonl", "coco"), required=True)
    ex.add_argument("-o", "--output", type=Path, help="file to write (default: standard output)")

    rq = sub.add_parser("requeue", help="send tasks again for a job's images that are still pending")
    rq.add_argument("job", type=int)
    rq.add_argument("--json", action="store_true")

    wk = sub.add_parser("worker", help="run a Celery worker pool that loads the model once per process")
    wk.add_argument("--pool", choices=("gpu", "cpu"), required=True)
    wk.add_argument("--concurrency", type=int, help="processes (default: GPUs for gpu, cores for cpu)")
    wk.add_argument("--model", type=Path, help="model file to preload (default: DETQ_MODEL)")
    wk.add_argument("--loglevel", default=None, help="log level (default: DETQ_LOG_LEVEL)")
    wk.add_argument("--hostname", help="Celery node name (default: <pool>@<host>)")
    wk.add_argument(
        "--format", choices=("torchvision", "yolov5", "yolov8", "boxes"), help="override the model's format"
    )
    wk.add_argument("--input-size", help="override the model's input size: H,W or one number")

    mp = sub.add_parser("model", help="inspect a model file, or embed metadata into one")
    msub = mp.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    mi = msub.add_parser("inspect", help="format, classes, input size, devices, and whether it runs here")
    mi.add_argument("path", type=Path)
    mi.add_argument("--device", default="cpu", help="device to load it on (default: cpu)")
    mi.add_argument(
        "--format", choices=("torchvision", "yolov5", "yolov8", "boxes"), help="override its format"
    )
    mi.add_argument("--input-size", help="override its input size: H,W or one number")
    mi.add_argument("--json", action="store_true")
    mk = msub.add_parser("pack", help="write a TorchScript copy with detq.json metadata embedded")
    mk.add_argument("path", type=Path)
    mk.add_argument(
        "--meta", type=Path, required=True, help="JSON file with format, classes, input_size, ..."
    )
    mk.add_argument("-o", "--output", type=Path, required=True)

    dbp = sub.add_parser("db", help="database schema")
    dbsub = dbp.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    dbsub.add_parser("upgrade", help="apply migrations up to the newest")
    dbsub.add_parser("current", help="print the schema revision")

    fl = sub.add_parser(
        "flower", help="run Celery Flower against this deployment's broker (needs detq[flower])"
    )
    fl.add_argument("--port", type=int, default=5555)

    demo = sub.add_parser("demo", help="generate demo images, run CPU workers over them, print a summary")
    demo.add_argument("--images", type=int, default=120)
    demo.add_argument("--out", type=Path, default=Path("demo-output"))
    demo.add_argument("--workers", type=int, default=None, help="CPU worker processes (default: cores)")
    demo.add_argument("--seed", type=int, default=2026)

    sch = sub.add_parser("schedule", help="show or check the configured schedules")
    schsub = sch.add_subparsers(dest="schedule_command", required=True, metavar="ACTION")
    sl = schsub.add_parser("list", help="schedules (DETQ_SCHEDULES_FILE, DETQ_SCHEDULE_*) and next run times")
    sl.add_argument("--json", action="store_true")
    sv = schsub.add_parser("validate", help="check a schedules file; report every error with its line")
    sv.add_argument("file", type=Path)

    sr = sub.add_parser("scheduler", help="run Celery beat and the scheduled scans (one active at a time)")
    sr.add_argument("--loglevel", default=None, help="log level (default: DETQ_LOG_LEVEL)")

    runs = sub.add_parser("runs", help="scheduled runs with their counts and duration")
    runs.add_argument("schedule", nargs="?", help="only this schedule's runs")
    runs.add_argument("--limit", type=int, default=20)
    runs.add_argument("--json", action="store_true")
    return parser


def _print_json(obj: object, out: TextIO = sys.stdout) -> None:
    out.write(json.dumps(obj, default=str) + "\n")


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    """detq enqueue."""
    from producer.context import celery_app, open_ledger
    from producer.enqueue import enqueue_folders
    from producer.progress import wait_with_progress

    engine, factory = open_ledger(settings)
    try:
        result = enqueue_folders(
            factory,
            celery_app(settings),
            roots=args.folders,
            model_path=args.model or settings.model,
            pool=args.pool,
            batch_size=args.batch_size or settings.batch_size,
            recursive=not args.no_recursive,
            allowed_roots=settings.allowed_root_paths,
            on_progress=_scan_progress if sys.stderr.isatty() and not args.json else None,
            only_new=args.only_new,
            max_retries=settings.max_retries,
        )
        if sys.stderr.isatty() and not args.json:
            sys.stderr.write("\r\x1b[2K")
        payload: dict[str, object] = {
            "job_id": result.job_id,
            "total": result.total,
            "batches": result.batches,
        }
        if result.counts is not None:
            payload.update(vars(result.counts))
            if not args.json:
                c = result.counts
                print(f"new {c.new}, changed {c.changed}, retried {c.retried}, skipped {c.skipped}")
        if not args.json:
            print(
                f"job {result.job_id}: {result.total} images queued in {result.batches} batches ({args.pool})"
            )
        if args.wait:
            final = wait_with_progress(_poller(factory, result.job_id), timeout_s=args.timeout)
            payload.update(final.as_dict())
        if args.json:
            _print_json(payload)
        elif not args.wait:
            print(result.job_id)
        return EXIT_OK
    finally:
        engine.dispose()


def _scan_progress(images: int, batches: int) -> None:
    sys.stderr.write(f"\r\x1b[2Kscanning: {images} images queued in {batches} batches")
    sys.stderr.flush()


def _poller(factory: sessionmaker[Session], job_id: int) -> Callable[[], JobStatus]:
    def poll() -> JobStatus:
        with factory() as session:
            return job_status(session, job_id)

    return poll


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    """detq status."""
    from db.repository import latest_job_id
    from producer.context import open_ledger
    from producer.progress import render_line, wait_with_progress

    engine, factory = open_ledger(settings)
    try:
        with factory() as session:
            job_id = args.job or latest_job_id(session)
        if job_id is None:
            print("no jobs yet", file=sys.stderr)
            return EXIT_ERROR
        if args.wait:
            status = wait_with_progress(_poller(factory, job_id), timeout_s=args.timeout)
        else:
            with factory() as session:
                status = job_status(session, job_id)
        if args.json:
            _print_json(status.as_dict())
        elif not args.wait:
            print(render_line(status, rate=None))
            print(f"detections {status.detections}, elapsed {status.elapsed_s:.1f} s, roots {status.roots}")
        return EXIT_OK
    finally:
        engine.dispose()


def cmd_jobs(args: argparse.Namespace, settings: Settings) -> int:
    """detq jobs."""
    from db.repository import list_jobs
    from producer.context import open_ledger

    engine, factory = open_ledger(settings)
    try:
        with factory() as session:
            statuses = [job_status(session, job.id) for job in list_jobs(session, args.limit)]
        if args.json:
            _print_json([s.as_dict() for s in statuses])
        else:
            for s in statuses:
                print(
                    f"{s.job_id:>6}  {s.state:<9} {s.done + s.failed + s.rejected:>7}/{s.total:<7} "
                    f"failed {s.failed:<5} rejected {s.rejected:<5} {s.pool:<4} {s.created_at}  {s.roots[0]}"
                )
        return EXIT_OK
    finally:
        engine.dispose()


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    """detq export."""
    from producer.context import open_ledger
    from producer.export import export_job

    engine, factory = open_ledger(settings)
    try:
        with ExitStack() as stack, factory() as session:
            out: TextIO = sys.stdout
            if args.output:
                out = stack.enter_context(args.output.open("w", encoding="utf-8", newline=""))
            count = export_job(session, args.job, args.format, out)
        if args.output:
            print(f"wrote {count} {'lines' if args.format == 'jsonl' else 'records'} to {args.output}")
        return EXIT_OK
    finally:
        engine.dispose()


def cmd_requeue(args: argparse.Namespace, settings: Settings) -> int:
    """detq requeue."""
    from producer.context import celery_app, open_ledger
    from producer.requeue import requeue_pending

    engine, factory = open_ledger(settings)
    try:
        sent = requeue_pending(factory, celery_app(settings), args.job)
        if args.json:
            _print_json({"job_id": args.job, "images": sent.images, "batches": sent.batches})
        else:
            print(f"job {args.job}: re-sent {sent.images} pending images in {sent.batches} batches")
        return EXIT_OK
    finally:
        engine.dispose()


def cmd_db(args: argparse.Namespace, settings: Settings) -> int:
    """detq db upgrade | current."""
    from db.migrate import current_revision, upgrade

    url = settings.resolved_database_url
    if args.db_command == "upgrade":
        upgrade(url)
        print(f"database at revision {current_revision(url)}")
    else:
        print(current_revision(url) or "empty (run: detq db upgrade)")
    return EXIT_OK


def cmd_model(args: argparse.Namespace, settings: Settings) -> int:
    """detq model inspect | pack: worker-side (torch) code, imported lazily."""
    from worker.inspect import format_report, inspect_model, pack_model
    from worker.metadata import MetaOverrides, parse_input_size

    if args.model_command == "pack":
        packed = pack_model(args.path, args.meta, args.output)
        print(f"wrote {packed['path']} (sha256 {packed['sha256']})")
        return EXIT_OK
    overrides = MetaOverrides(format=args.format, input_size=parse_input_size(args.input_size))
    report = inspect_model(args.path, device=args.device, overrides=overrides)
    if args.json:
        _print_json(report)
    else:
        print(format_report(report))
    return EXIT_OK if report.get("loads_here") else EXIT_ERROR


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    """detq worker: imported lazily, since only workers need torch."""
    from worker.cli import run_worker

    updates: dict[str, object] = {}
    if args.model is not None:
        updates["model"] = args.model
    if args.format is not None:
        updates["model_format"] = args.format
    if args.input_size is not None:
        updates["input_size"] = args.input_size
    if updates:
        settings = settings.model_copy(update=updates)
    return run_worker(
        settings,
        pool=args.pool,
        concurrency=args.concurrency,
        loglevel=args.loglevel or settings.log_level,
        hostname=args.hostname,
    )


def cmd_flower(args: argparse.Namespace, settings: Settings) -> int:
    """detq flower: Celery's monitoring UI on the configured broker."""
    import subprocess

    command = [
        sys.executable,
        "-m",
        "celery",
        "--broker",
        settings.resolved_broker_url,
        "flower",
        f"--port={args.port}",
    ]
    return subprocess.call(command)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """detq demo."""
    from producer.demo import run_demo

    return run_demo(settings, images=args.images, out_dir=args.out, workers=args.workers, seed=args.seed)


def cmd_schedule(args: argparse.Namespace, settings: Settings) -> int:
    """detq schedule list | validate."""
    from producer.schedule_sources import configured_schedules
    from producer.schedules import ScheduleConfigError, check_paths, load_schedules_file

    if args.schedule_command == "validate":
        try:
            schedules = load_schedules_file(args.file)
        except ScheduleConfigError as exc:
            print(exc, file=sys.stderr)
            return EXIT_ERROR
        missing = check_paths(schedules)
        for issue in missing:
            print(issue.render(str(args.file)), file=sys.stderr)
        if missing:
            return EXIT_ERROR
        print(f"{args.file}: {len(schedules)} schedules, no errors")
        return EXIT_OK
    try:
        schedules = configured_schedules(settings)
    except ScheduleConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_ERROR
    from producer.schedule_sources import describe_schedules

    views = describe_schedules(schedules, settings, datetime.now(UTC))
    if args.json:
        _print_json([v.as_dict() for v in views])
        return EXIT_OK
    if not views:
        print("no schedules: set DETQ_SCHEDULES_FILE, or DETQ_SCHEDULE_FOLDER and DETQ_SCHEDULE_CRON")
    for v in views:
        folders = ", ".join(v.folders)
        print(f"{v.name:<20} {v.cron:<16} {v.timezone:<16} next {v.next_run}  {v.pool:<4} {folders}")
    return EXIT_OK


def cmd_scheduler(args: argparse.Namespace, settings: Settings) -> int:
    """detq scheduler: beat plus the control-queue consumer; never imports torch."""
    from producer.schedule_sources import configured_schedules
    from producer.scheduler import run_scheduler
    from producer.schedules import ScheduleConfigError

    try:
        schedules = configured_schedules(settings)
    except ScheduleConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_ERROR
    if not schedules:
        print(
            "detq scheduler: no schedules configured (DETQ_SCHEDULES_FILE or DETQ_SCHEDULE_*)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return run_scheduler(settings, schedules, loglevel=args.loglevel or settings.log_level)


def cmd_runs(args: argparse.Namespace, settings: Settings) -> int:
    """detq runs [SCHEDULE]."""
    from producer.context import open_ledger
    from producer.runs_report import run_summaries

    engine, factory = open_ledger(settings)
    try:
        with factory() as session:
            runs = run_summaries(session, args.schedule, args.limit)
        if args.json:
            _print_json([r.as_dict() for r in runs])
        elif not runs:
            print("no scheduled runs yet")
        for r in [] if args.json else runs:
            found = "nothing new" if r.nothing_new else f"new {r.new} changed {r.changed} retried {r.retried}"
            print(
                f"{r.job_id:>6}  {r.schedule:<16} {r.scheduled_for}  {r.state:<9} {found:<34} "
                f"skipped {r.skipped:<6} done {r.done:<6} failed {r.failed + r.rejected:<5} "
                f"{r.duration_s:.1f} s"
            )
        return EXIT_OK
    finally:
        engine.dispose()


COMMANDS = {
    "enqueue": cmd_enqueue,
    "status": cmd_status,
    "jobs": cmd_jobs,
    "export": cmd_export,
    "requeue": cmd_requeue,
    "worker": cmd_worker,
    "model": cmd_model,
    "db": cmd_db,
    "flower": cmd_flower,
    "demo": cmd_demo,
    "schedule": cmd_schedule,
    "scheduler": cmd_scheduler,
    "runs": cmd_runs,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `detq` console command."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from pydantic import ValidationError

    try:
        settings = get_settings()
    except ValidationError as exc:
        print(f"detq: bad configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from db.schema import SchemaError
    from producer.enqueue import EnqueueError
    from producer.status import JobNotFound
    from worker.metadata import ModelMetaError

    try:
        return COMMANDS[args.command](args, settings)
    except (EnqueueError, JobNotFound, SchemaError, ModelMetaError, LookupError, TimeoutError) as exc:
        print(f"detq {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `detq export ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
