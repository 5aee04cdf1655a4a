"""What `detq runs` shows: scheduled runs with their scan counts, outcomes and duration."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from db.clock import ledger_now
from db.job_counts_repo import job_counts
from db.models import Job, as_utc
from db.schedules_repo import list_runs
from detq.vocabulary import JobState
from producer.status import job_state


@dataclass(frozen=True)
class RunSummary:
    """One scheduled run: its key, what the scan found, how its images ended, how long it took."""

    job_id: int
    schedule: str
    scheduled_for: str
    state: JobState
    total: int
    new: int
    changed: int
    retried: int
    skipped: int
    done: int
    failed: int
    rejected: int
    pending: int
    duration_s: float
    nothing_new: bool
    closed_reason: str | None = None  # why the run was closed early (its folder missing, its producer died)
    unreadable_count: int = 0  # folders its scan could not list

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @property
    def shown_state(self) -> str:
        """The state as `detq runs` shows it: closed early and nothing new told apart from finished."""
        if self.closed_reason and self.state is not JobState.CANCELLED:
            return "closed early"
        return "nothing new" if self.nothing_new else self.state.value


def summarize_run(session: Session, job: Job, now: datetime) -> RunSummary:
    """The summary of one scheduled run's job; now: the ledger's time (db.clock.ledger_now)."""
    counts = job_counts(session, job.id)
    end = as_utc(job.finished_at) if job.finished_at else now
    return RunSummary(
        job_id=job.id,
        schedule=job.schedule_name or "",
        scheduled_for=as_utc(job.scheduled_for).isoformat() if job.scheduled_for else "",
        state=job_state(job, counts),
        total=counts.total,
        new=job.new_images or 0,
        changed=job.changed_images or 0,
        retried=job.retried_images or 0,
        skipped=job.skipped_images or 0,
        done=counts.done,
        failed=counts.failed,
        rejected=counts.rejected,
        pending=counts.pending,
        duration_s=round((end - as_utc(job.created_at)).total_seconds(), 3),
        nothing_new=job.enqueued_complete and counts.total == 0 and not job.closed_reason,
        closed_reason=job.closed_reason,
        unreadable_count=job.unreadable_count or 0,
    )


def run_summaries(session: Session, schedule_name: str | None = None, limit: int = 20) -> list[RunSummary]:
    """The newest scheduled runs first, of one schedule or of all."""
    now = ledger_now(session)
    return [summarize_run(session, job, now) for job in list_runs(session, schedule_name, limit)]
