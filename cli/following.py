"""Following a job from the command line: live progress, a hint when no worker listens, the summary."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import click

from db.clock import ledger_now
from db.job_counts_repo import top_reasons
from db.jobs_repo import get_job
from db.ledger import Ledger
from detq.settings import Settings
from detq.vocabulary import JobPool
from producer.fleet import fleet, listening_pools
from producer.progress import summary_lines, wait_with_progress
from producer.status import JobNotFound, JobStatus, job_status

# Free bytes under which the embedded ledger's disk counts as full: SQLite needs room for its journal.
LOW_DISK_BYTES = 1024 * 1024


def no_worker_hint(ledger: Ledger, settings: Settings, pool: str) -> Callable[[], str | None]:
    """A hint for a job nobody can take: no live worker node consumes its queue (or none could say so:
    the embedded ledger's disk is full, and no heartbeat can be written)."""

    def hint() -> str | None:
        with ledger.reads() as session:
            listening = listening_pools(
                fleet(session, ledger_now(session), timeout_s=settings.worker_timeout)
            )
        if listening if pool == JobPool.ANY else pool in listening:
            return None
        full = full_ledger_disk(settings)
        if full is not None:
            return full
        start = "cpu" if pool in (JobPool.ANY, JobPool.CPU) else "gpu"
        return f"no worker is listening on queue {pool}: start one with `detq worker --pool {start}`"

    return hint


def full_ledger_disk(settings: Settings) -> str | None:
    """What to say where the embedded ledger's disk is full: workers then cannot write their heartbeats,
    so they look gone though they run; None where it has room, or the ledger is a server's."""
    if settings.database_url:
        return None
    folder = settings.resolved_data_dir
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free >= LOW_DISK_BYTES:
        return None
    return (
        f"the disk of the ledger ({folder}) is full ({free} bytes free): workers cannot write their"
        " heartbeats or results until space is freed; nothing is lost, they go on then"
    )


def follow(
    ledger: Ledger, settings: Settings, job_id: int, *, timeout_s: float | None, quiet: bool
) -> JobStatus:
    """Wait for the job with live progress (on standard error); print the summary unless quiet."""

    def poll() -> JobStatus:
        with ledger.reads() as session:
            return job_status(session, job_id)

    with ledger.reads() as session:
        job = get_job(session, job_id)  # its pool, for the hint; the polls count its images
        if job is None:
            raise JobNotFound(f"no job {job_id}")
        pool = job.pool
    wait_with_progress(poll, timeout_s=timeout_s, hint=no_worker_hint(ledger, settings, pool))
    with ledger.reads() as session:
        final = job_status(session, job_id)  # now with its detections counted, once
    if not quiet:
        with ledger.reads() as session:
            reasons = top_reasons(session, job_id)
        for line in summary_lines(final, reasons):
            click.echo(line, err=True)
    return final
