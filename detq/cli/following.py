"""Following a job from the command line: live progress, a hint when no worker listens, the summary."""

from __future__ import annotations

from collections.abc import Callable

import click

from db.clock import ledger_now
from db.job_counts_repo import top_reasons
from db.jobs_repo import get_job
from db.ledger import Ledger
from detq.settings import Settings
from detq.vocabulary import Pool
from producer.fleet import fleet, listening_pools
from producer.progress import summary_lines, wait_with_progress
from producer.status import JobNotFound, JobStatus, job_status


def no_worker_hint(ledger: Ledger, settings: Settings, pool: str) -> Callable[[], str | None]:
    """A hint for a job nobody can take: no live worker node consumes its queue."""

    def hint() -> str | None:
        with ledger.reads() as session:
            listening = listening_pools(
                fleet(session, ledger_now(session), timeout_s=settings.worker_timeout)
            )
        if listening if pool == Pool.ANY else pool in listening:
            return None
        start = "cpu" if pool in (Pool.ANY, Pool.CPU) else "gpu"
        return f"no worker is listening on queue {pool}: start one with `detq worker --pool {start}`"

    return hint


def follow(
    ledger: Ledger, settings: Settings, job_id: int, *, timeout_s: float | None, quiet: bool
) -> JobStatus:
    """Wait for the job with live progress (on standard error); print the summary unless quiet."""

    def poll() -> JobStatus:
        with ledger.reads() as session:
            return job_status(session, job_id, detections=False)

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
