"""SQLAlchemy 2.0 models of the ledger: models, jobs, images, detections, and the scheduler's state."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    case,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from detq.vocabulary import ImageStatus

# SQLite only autoincrements INTEGER PRIMARY KEY; PostgreSQL gets BIGINT identities.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    """Timezone-aware now in UTC."""
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """A stored timestamp as an aware UTC datetime."""
    # SQLite hands back naive datetimes even for timezone=True columns; they were written in UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every detq table."""

    type_annotation_map = {dict[str, Any]: JSON, list[str]: JSON}


class ModelRecord(Base):
    """A model file, identified by the sha256 of its bytes."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("sha256", name="uq_models_sha256"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    sha256: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    meta: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Job(Base):
    """One enqueue: a set of roots scanned for images and run through one model on one pool."""

    __tablename__ = "jobs"
    # One job per scheduled run: two schedulers racing on the same tick cannot both insert it. NULLs are
    # distinct in both databases, so jobs enqueued by hand never collide.
    __table_args__ = (Index("uq_jobs_schedule_run", "schedule_name", "scheduled_for", unique=True),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    roots: Mapped[list[str]] = mapped_column()
    pool: Mapped[str] = mapped_column(String(8))
    batch_size: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(Integer, default=0)
    enqueued_complete: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Set on scheduled runs (issue 4): the schedule and the cron time this run is for, in UTC.
    schedule_name: Mapped[str | None] = mapped_column(String(255))
    scheduled_for: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Set on incremental enqueues (scheduled runs, `enqueue --only-new`): what the scan found.
    new_images: Mapped[int | None] = mapped_column(Integer)
    changed_images: Mapped[int | None] = mapped_column(Integer)
    retried_images: Mapped[int | None] = mapped_column(Integer)
    skipped_images: Mapped[int | None] = mapped_column(Integer)
    # Renewed by the producer while it scans (issue 7): a job left enqueuing with a stale time is closed
    # by the reconciler with the images recorded so far, and closed_reason says so.
    enqueue_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    closed_reason: Mapped[str | None] = mapped_column(Text)
    # Folders under the job's roots its scan could not list (migration 0007): their images are in no job.
    # The first few as {"folder", "reason"}, and how many in all; None where every folder was read.
    unreadable_count: Mapped[int | None] = mapped_column(Integer)
    unreadable_folders: Mapped[list[dict[str, str]] | None] = mapped_column(JSON)

    # What shapes its results beside the model (detq.inference_settings, migration 0008): the settings its
    # workers apply, and their key, with the model the key of "already done" for incremental runs. None:
    # a job made before 0008, run as its workers' settings said (its key is the defaults').
    settings: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    settings_key: Mapped[str | None] = mapped_column(String(16))

    # How many of its images stand in each state, and their detections (migration 0009): moved in the
    # transactions that finish images (db/job_counts_repo.py), so a status reads this row and the job's
    # recorded_counts, never the images. What producers recorded is in recorded_counts.
    pending_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    done_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    failed_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    rejected_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cancelled_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    detection_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")

    model: Mapped[ModelRecord] = relationship()


class Image(Base):
    """One image file of a job and its outcome."""

    __tablename__ = "images"
    __table_args__ = (
        # A job holds a file once; led by the path, the same index finds a file's earlier outcomes for
        # incremental scans (producer/incremental.py), so no second index on path is kept (migration 0006).
        UniqueConstraint("path", "job_id", name="uq_images_path_job"),
        Index("ix_images_job_status", "job_id", "status"),
        Index("ix_images_batch", "batch_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    root_index: Mapped[int] = mapped_column(Integer, default=0)
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    mtime: Mapped[float] = mapped_column(Float)
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=ImageStatus.PENDING.value)
    reason: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    device: Mapped[str | None] = mapped_column(String(32))
    decode_ms: Mapped[float | None] = mapped_column(Float)
    infer_ms: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The batch message that delivers it, and the pool process working on it (attempts counts the
    # starts). Plain columns, no foreign keys: SQLite cannot add those to an existing table in place.
    batch_id: Mapped[int | None] = mapped_column(BigInteger)
    claimed_by: Mapped[int | None] = mapped_column(BigInteger)
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


# Why a job was closed by `detq cancel` (db/jobs_repo.py, cancel_job).
CANCELLED_REASON = "cancelled"


def status_as_read() -> ColumnElement[str]:
    """An image's status as every reader takes it, in a query joined to its job: a pending image of a
    cancelled job reads cancelled. A cancel writes the job and its counters at once and leaves a million
    pending rows to the reconciler, a chunk a pass (db/jobs_repo.py, write_cancelled_rows)."""
    return case(
        (
            and_(Image.status == ImageStatus.PENDING.value, Job.closed_reason == CANCELLED_REASON),
            ImageStatus.CANCELLED.value,
        ),
        else_=Image.status,
    )


class Batch(Base):
    """One batch message of a job: its task id is derived from this id, so the broker's copy can be found."""

    __tablename__ = "batches"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    sends: Mapped[int] = mapped_column(Integer, default=0)
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the reconciler first found no copy of it queued or held; it is sent again after a grace period.
    missing_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RecordedCount(Base):
    """Images one write of a producer recorded for a job, pending and refused (migration 0009).

    A job's counters live on its row, moved by the transactions that finish images, which lock that row
    anyway; a producer recording a chunk must not (workers finishing batches would wait for its chunk),
    so what it adds is a row of its own here, summed with the job's (a few hundred a million images).
    """

    __tablename__ = "recorded_counts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    pending: Mapped[int] = mapped_column(BigInteger)
    rejected: Mapped[int] = mapped_column(BigInteger)


class WorkerRecord(Base):
    """A running detq worker: a node (the Celery consumer) or one of its pool processes, by heartbeat."""

    __tablename__ = "workers"
    __table_args__ = (Index("ix_workers_alive", "stopped_at", "last_seen_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    role: Mapped[str] = mapped_column(String(16))
    node: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    # Where a pid means something: the host name and pid namespace, so a dead local pid is seen at once.
    host_key: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    pool: Mapped[str] = mapped_column(String(8))
    device: Mapped[str | None] = mapped_column(String(32))
    model_sha256: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stop_reason: Mapped[str | None] = mapped_column(String(32))
    current_batch_id: Mapped[int | None] = mapped_column(BigInteger)
    # Task ids a node holds (reserved or running), so the reconciler never sends a second live copy.
    held: Mapped[list[str]] = mapped_column(default=list)
    batches_done: Mapped[int] = mapped_column(Integer, default=0)
    images_done: Mapped[int] = mapped_column(Integer, default=0)
    images_per_s: Mapped[float] = mapped_column(Float, default=0.0)


class Detection(Base):
    """One box found in an image by a model, in original image pixels."""

    __tablename__ = "detections"

    # Keyed by what it is, the rank-th box of an image by a model: no surrogate id (migration 0005), whose
    # sequence value and second index each row written paid for. No foreign keys either, on purpose
    # (migration 0004): PostgreSQL checks one per row and key, and a batch's thousands of boxes spent two
    # thirds of their COPY there. Detections are written only by finalise_results, for images it holds
    # locked, and deleted with their job by delete_job. The key leads with image_id: every read's index.
    image_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    model_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    label_id: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(String(255))
    score: Mapped[float] = mapped_column(Float)
    x1: Mapped[float] = mapped_column(Float)
    y1: Mapped[float] = mapped_column(Float)
    x2: Mapped[float] = mapped_column(Float)
    y2: Mapped[float] = mapped_column(Float)


class ScheduleState(Base):
    """What the scheduler remembers of one schedule: when it first saw it and the last run it made."""

    __tablename__ = "schedule_state"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    first_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_scheduled_for: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Lease(Base):
    """The lock that makes one `detq scheduler` active: held by owner until expires_at unless renewed."""

    __tablename__ = "scheduler_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    acquired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def table_of(model: type[Base]) -> Table:
    """A model's table, for Core statements (built once for the hot path: db/claims_repo.py)."""
    return cast(Table, model.__table__)
