"""Ending jobs by hand: `detq cancel` stops one, `detq delete` removes one from the ledger."""

from __future__ import annotations

import sys

import click

from cli.base import DetqCommand, examples, load_settings
from cli.output import print_json
from db.clock import ledger_now
from db.jobs_repo import cancel_job, delete_job, get_job
from db.ledger import open_ledger
from detq.errors import DetqError
from producer.status import JobNotFound

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")


@click.command(cls=DetqCommand, epilog=examples("detq cancel 42", "detq cancel 42 --json"))
@click.argument("job", type=click.IntRange(min=1))
@JSON_OPTION
def cancel(job: int, as_json: bool) -> None:
    """Cancel a job: its pending images end cancelled.

    Batches still queued find nothing to do, and one being written writes nothing; a scan still going on
    stops adding to the job. Images already finished keep their results. A later --only-new or scheduled
    run takes the cancelled ones.
    """
    with open_ledger(load_settings()) as led, led.sessions() as session, session.begin():
        if get_job(session, job) is None:
            raise JobNotFound(f"no job {job}")
        cancelled = cancel_job(session, job, ledger_now(session))
    if as_json:
        print_json({"job_id": job, "cancelled": cancelled})
    else:
        click.echo(f"job {job}: cancelled, {cancelled} pending images will not be processed")


@click.command(cls=DetqCommand, epilog=examples("detq delete 42", "detq delete 42 --yes --json"))
@click.argument("job", type=click.IntRange(min=1))
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@JSON_OPTION
def delete(job: int, yes: bool, as_json: bool) -> None:
    """Delete a job with its images and detections from the ledger.

    Batches still queued for it are then refused by the workers, with a log line. Input files are
    never touched.
    """
    with open_ledger(load_settings()) as led:
        with led.reads() as session:
            found = get_job(session, job)
            if found is None:
                raise JobNotFound(f"no job {job}")
            total = found.total
        if not yes:
            if not sys.stdin.isatty():
                raise DetqError("refusing to delete without --yes when not asked on a terminal")
            click.confirm(f"delete job {job} and the results of its {total} images?", abort=True)
        with led.sessions() as session, session.begin():
            delete_job(session, job)
    if as_json:
        print_json({"job_id": job, "deleted": True})
    else:
        click.echo(f"job {job}: deleted")
