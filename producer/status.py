"""A job's state and counts, read from the ledger."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from db.clock import ledger_now
from db.job_counts_repo import JobCounts, job_snapshot
from db.jobs_repo import latest_job_id
from db.models import CANCELLED_REASON, Job, as_utc
from detq.display import visible
from detq.errors import DetqError
from detq.inference_settings import DEFAULT_KEY, InferenceSettings
from detq.vocabulary import JobState


class JobNotFound(DetqError, LookupError):
    """No job with that id."""


@dataclass(frozen=True)
class JobStatus:
    """What `detq status` reports."""

    job_id: int
    state: JobState
    total: int
    pending: int
    done: int
    failed: int
    rejected: int
    detections: int
    pool: str
    roots: list[str]
    model_sha256: str
    created_at: str
    finished_at: str | None
    elapsed_s: float  # since the job was created: its wait in the queue included
    started_at: str | None = None  # its first image claimed (None: not yet)
    running_s: float | None = None  # since started_at: the time its images took, for the images/s
    closed_reason: str | None = None  # why the job was closed early (its producer died, the broker went)
    cancelled: int = 0
    unreadable_count: int = 0  # folders its scan could not list: their images are in no job
    unreadable_folders: list[dict[str, str]] = field(default_factory=list)  # the first, with reasons
    # The inference settings its results are made with (detq.inference_settings); None: a job made
    # before jobs recorded them, run as its workers' settings said.
    settings: dict[str, Any] | None = None
    model_path: str = ""  # where the model file was when first recorded

    @property
    def model_name(self) -> str:
        """The model by its file's name (its sha256's start where no path was recorded)."""
        return Path(self.model_path).name if self.model_path else self.model_sha256[:12]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    def unreadable_line(self) -> str | None:
        """A line on the folders not read, naming the first; None where every folder was read."""
        if not self.unreadable_count:
            return None
        first = self.unreadable_folders[0] if self.unreadable_folders else None
        such = f", such as {first['folder']} ({first['reason']})" if first else ""
        plural = "folder" if self.unreadable_count == 1 else "folders"
        return visible(f"{self.unreadable_count} {plural} not read, their images in no job{such}")

    @property
    def settings_line(self) -> str:
        """The settings that differ from the defaults, in a few words."""
        if self.settings is None:
            return "as its workers' settings said (recorded before jobs had settings)"
        return InferenceSettings.from_json(self.settings).describe()

    @property
    def settings_words(self) -> str:
        """settings_line for a table: "defaults" where nothing differs, "?" where not recorded."""
        if self.settings is None:
            return "?"
        changed = InferenceSettings.from_json(self.settings)
        return "defaults" if changed.key == DEFAULT_KEY else changed.describe()

    @property
    def images_per_s(self) -> float:
        """Finished images per second of running time (of elapsed time for a job not started)."""
        seconds = self.running_s if self.running_s is not None else self.elapsed_s
        finished = self.total - self.pending
        return finished / seconds if seconds > 0 else 0.0

    @property
    def queued_s(self) -> float | None:
        """How long the job waited for its first claim (None: not started)."""
        return None if self.running_s is None else max(0.0, self.elapsed_s - self.running_s)


def job_state(job: Job, counts: JobCounts) -> JobState:
    """enqueuing, queued (nothing finished yet), running, finished, or cancelled."""
    if not job.enqueued_complete:
        return JobState.ENQUEUING
    if counts.pending == 0:
        return JobState.CANCELLED if job.closed_reason == CANCELLED_REASON else JobState.FINISHED
    return JobState.RUNNING if counts.done + counts.failed + counts.rejected > 0 else JobState.QUEUED


def job_status(session: Session, job_id: int, *, now: datetime | None = None) -> JobStatus:
    """Counts by status and the derived state of one job: its row and its model's, whatever its size."""
    snapshot = job_snapshot(session, job_id)
    if snapshot is None:
        raise JobNotFound(f"no job {job_id}")
    job, counts = snapshot.job, snapshot.counts
    created = as_utc(job.created_at)
    # A job's times are the ledger's (the server's clock on PostgreSQL), whatever this machine's says.
    # (now: read once by a caller that lists many jobs).
    end = as_utc(job.finished_at) if job.finished_at else now or ledger_now(session)
    started = as_utc(job.started_at) if job.started_at else None
    return JobStatus(
        job_id=job.id,
        state=job_state(job, counts),
        total=counts.total,
        pending=counts.pending,
        done=counts.done,
        failed=counts.failed,
        rejected=counts.rejected,
        cancelled=counts.cancelled,
        detections=counts.detections,
        pool=job.pool,
        roots=list(job.roots),
        model_sha256=snapshot.model_sha256,
        model_path=snapshot.model_path,
        created_at=created.isoformat(),
        finished_at=as_utc(job.finished_at).isoformat() if job.finished_at else None,
        elapsed_s=round((end - created).total_seconds(), 3),
        started_at=started.isoformat() if started else None,
        running_s=round(max(0.0, (end - started).total_seconds()), 3) if started else None,
        closed_reason=job.closed_reason,
        unreadable_count=job.unreadable_count or 0,
        unreadable_folders=list(job.unreadable_folders or []),
        settings=dict(job.settings) if job.settings is not None else None,
    )


def job_or_latest(session: Session, job: int | None, said: Callable[[str], None] | None = None) -> int:
    """The job asked for, else the latest one (said, where a caller shows it); JobNotFound if none."""
    if job is not None:
        return job
    latest = latest_job_id(session)
    if latest is None:
        raise JobNotFound("no jobs yet")
    if said is not None:
        said(f"job {latest} (the latest)")
    return latest
