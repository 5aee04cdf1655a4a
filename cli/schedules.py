"""The scheduler's commands: list and validate schedules, run the scheduler, list scheduled runs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from cli.base import EXIT_ERROR, DetqCommand, DetqGroup, examples, load_settings
from cli.output import print_json, table
from db.ledger import open_ledger
from detq.errors import DetqError
from producer.scheduler.schedules import validate_schedules_file
from producer.scheduler.sources import configured_schedules, describe_schedules
from producer.scheduler.summaries import run_summaries

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


@click.group(cls=DetqGroup)
def schedule() -> None:
    """Show or check the configured schedules.

    Schedules come from DETQ_SCHEDULES_FILE and DETQ_SCHEDULE_*.
    """


@schedule.command("list", epilog=examples("detq schedule list", "detq schedule list --json"))
@JSON_OPTION
def list_schedules(as_json: bool) -> None:
    """The configured schedules and their next run times."""
    settings = load_settings()
    views = describe_schedules(configured_schedules(settings), settings, datetime.now(UTC))
    if as_json:
        print_json([v.as_dict() for v in views])
        return
    if not views:
        click.echo("no schedules: set DETQ_SCHEDULES_FILE, or DETQ_SCHEDULE_FOLDER and DETQ_SCHEDULE_CRON")
        return
    headers = ("name", "cron", "timezone", "next run", "pool", "folders")
    rows = [(v.name, v.cron, v.timezone, v.next_run, v.pool, ", ".join(v.folders)) for v in views]
    click.echo(table(headers, rows))


@schedule.command(epilog=examples("detq schedule validate schedules.toml"))
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@JSON_OPTION
def validate(file: Path, as_json: bool) -> None:
    """Check a schedules file.

    Every error as FILE:LINE: message, missing folders included; exit 1 if any.
    """
    schedules, issues = validate_schedules_file(file)
    if as_json:
        print_json(
            {
                "file": str(file),
                "schedules": [s.name for s in schedules],
                "errors": [{"line": i.line, "message": i.message} for i in issues],
            }
        )
    else:
        for issue in issues:
            click.echo(issue.render(str(file)), err=True)
        if not issues:
            click.echo(f"{file}: {len(schedules)} schedules, no errors")
    if issues:
        raise SystemExit(EXIT_ERROR)


@click.command(cls=DetqCommand, epilog=examples("detq scheduler", "detq scheduler -l DEBUG"))
@click.option("-l", "--loglevel", help="Log level (default: DETQ_LOG_LEVEL).")
def scheduler(loglevel: str | None) -> None:
    """Run beat and the scheduled scans.

    One process, no torch; with several schedulers one is active and the others wait as standbys.
    """
    from producer.scheduler.daemon import run_scheduler

    settings = load_settings()
    schedules = configured_schedules(settings)
    if not schedules:
        raise DetqError("no schedules configured (DETQ_SCHEDULES_FILE or DETQ_SCHEDULE_*)")
    raise SystemExit(run_scheduler(settings, schedules, loglevel=loglevel or settings.log_level))


@click.command(cls=DetqCommand, epilog=examples("detq runs", "detq runs nightly-cameras --limit 7 --json"))
@click.argument("schedule_name", metavar="[SCHEDULE]", required=False)
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="How many runs, newest first."
)
@JSON_OPTION
def runs(schedule_name: str | None, limit: int, as_json: bool) -> None:
    """Scheduled runs and what each found.

    New, changed, retried and skipped files, how the images ended, and the duration.
    """
    with open_ledger(load_settings()) as led, led.reads() as session:
        summaries = run_summaries(session, schedule_name, limit)
    if as_json:
        print_json([r.as_dict() for r in summaries])
        return
    if not summaries:
        click.echo("no scheduled runs yet")
        return
    headers = [
        *("job", "schedule", "scheduled for", "state", "new", "changed", "retried", "skipped", "done"),
        *("failed", "seconds"),
    ]
    rows = [
        (
            r.job_id,
            r.schedule,
            r.scheduled_for[:19],
            r.shown_state,
            r.new,
            r.changed,
            r.retried,
            r.skipped,
            r.done,
            r.failed + r.rejected,
            round(r.duration_s, 1),
        )
        for r in summaries
    ]
    click.echo(table(headers, rows))
    for r in summaries:  # why a run closed early, and folders a run could not read, under the table
        if r.shown_state == "closed early":
            click.echo(f"job {r.job_id} ({r.schedule}, {r.scheduled_for[:19]}): {r.closed_reason}")
        if r.unreadable_count:
            click.echo(
                f"job {r.job_id} ({r.schedule}, {r.scheduled_for[:19]}): {r.unreadable_count}"
                f" {'folder' if r.unreadable_count == 1 else 'folders'} not read (detq status {r.job_id})"
            )
