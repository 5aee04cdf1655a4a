"""The one place detq reads its configuration: DETQ_* environment variables and an optional .env file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from platformdirs import user_data_path
from pydantic import BaseModel, ConfigDict, Field

from detq.contract import MAX_BATCH_SIZE, MIN_BATCH_SIZE
from detq.vocabulary import ModelFormat, Pool, Precision

BUNDLED_MODEL = Path(__file__).resolve().parent.parent / "worker" / "assets" / "demo_detector.pt"
PREFIX = "DETQ_"
ENV_FILE = ".env"


def _prefixed(pairs: Mapping[str, str | None]) -> dict[str, str]:
    """DETQ_<NAME>=value pairs as field name -> value, names in any case; an empty value is no value."""
    return {
        name[len(PREFIX) :].lower(): value
        for name, value in pairs.items()
        if value and name.upper().startswith(PREFIX)
    }


def environment(env_file: str | Path | None = ENV_FILE) -> dict[str, str]:
    """The settings' values from the environment, over those of env_file where it exists."""
    found: dict[str, str] = {}
    if env_file is not None and Path(env_file).is_file():
        from dotenv import dotenv_values  # only where a .env file exists

        found.update(_prefixed(dotenv_values(env_file)))
    found.update(_prefixed(os.environ))
    return found


class Settings(BaseModel):
    """Typed detq settings; every field maps to a DETQ_<NAME> environment variable.

    Read by detq itself (environment()), not by pydantic-settings: that package added some 30 ms to every
    command's start-up (import and Settings(): 116 -> 86 ms here, best of 15). Keyword arguments override
    the environment, which overrides the .env file; unknown DETQ_* names are ignored.
    """

    model_config = ConfigDict(extra="ignore")

    def __init__(self, _env_file: str | Path | None = ENV_FILE, **values: Any) -> None:
        super().__init__(**{**environment(_env_file), **values})

    data_dir: Path = Field(
        default_factory=lambda: user_data_path("detq", appauthor=False),
        description="Where the embedded database and broker live (default: the user's data folder).",
    )
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite in data_dir.")
    broker_url: str | None = Field(
        default=None, description="Celery broker URL; default an embedded filesystem broker in data_dir."
    )
    model: Path = Field(default=BUNDLED_MODEL, description="Model file workers load and jobs default to.")
    model_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Pin: workers refuse a model file (theirs, or a job's) whose sha256 is not this.",
    )
    metrics_port: int | None = Field(
        default=None, ge=1, le=65535, description="Serve Prometheus metrics of each worker on this port."
    )
    metrics_address: str = Field(
        default="127.0.0.1", description="Address the metrics endpoint listens on (0.0.0.0 for a scraper)."
    )
    flower_basic_auth: str | None = Field(
        default=None, description="user:password (comma-separated pairs) that `detq flower` requires."
    )
    allowed_roots: str = Field(
        default="",
        description="Folders workers may read from, separated by ':' or ','; empty: no extra limit.",
    )
    batch_size: int = Field(
        default=16, ge=MIN_BATCH_SIZE, le=MAX_BATCH_SIZE, description="Images per queued task."
    )
    micro_batch: int = Field(default=8, ge=1, le=256, description="Images per forward pass.")
    score_threshold: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Drop detections below this score (default: the model's)."
    )
    model_format: ModelFormat | None = Field(
        default=None, description="Override the model's output format (default: its metadata, else guessed)."
    )
    input_size: str | None = Field(
        default=None, description="Override the model's input size: 'H,W' or one number for a square."
    )
    iou_threshold: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Override the NMS IoU threshold of YOLO outputs (0.7)."
    )
    max_detections: int | None = Field(
        default=None, ge=1, description="Override the detections kept per image of YOLO outputs (300)."
    )
    fast_decode: bool = Field(
        default=False,
        description=(
            "Decode JPEGs at a reduced DCT scale near the model's input size: faster on large photos, but the"
            " pixels, and so some boxes, differ from the model's reference preprocessing (docs/models.md)."
        ),
    )
    cpu_optimize: bool = Field(
        default=False,
        description=(
            "Freeze TorchScript models and optimise them for CPU inference where that runs faster (timed at"
            " load); scores move by about 1e-6, so a box right at a threshold may flip (docs/models.md)."
        ),
    )
    precision: Precision = Field(
        default=Precision.FP32,
        description=(
            "fp16 or bf16: run the model under autocast at half width, its outputs read as float32:"
            " faster on GPUs; boxes and scores move a little (docs/models.md)."
        ),
    )
    max_image_pixels: int = Field(default=100_000_000, ge=1, description="Larger images are rejected.")
    max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1, description="Larger files are rejected.")
    task_soft_time_limit: int = Field(
        default=900, ge=1, description="Seconds before a batch is asked to stop."
    )
    task_time_limit: int = Field(
        default=1200, ge=1, description="Seconds before a batch's process is killed."
    )
    visibility_timeout: int = Field(
        default=3600, ge=1, description="Redis redelivery timeout; must exceed task_time_limit."
    )
    broker_polling_interval: float = Field(
        default=0.05, gt=0, description="Seconds between polls of the embedded filesystem broker."
    )
    decode_threads: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Decode threads per process (default: 1 on cpu, cores/GPUs on gpu).",
    )
    torch_threads: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="Intra-op threads per pool process (default: cores / processes on cpu, up to 4 on gpu).",
    )
    worker_concurrency: int | None = Field(default=None, ge=1, description="Processes per worker.")
    log_level: str = Field(default="INFO", description="Worker log level.")
    schedules_file: Path | None = Field(
        default=None, description="TOML file of schedules for `detq scheduler` (docs/scheduling.md)."
    )
    schedule_name: str = Field(default="default", description="Name of the schedule of DETQ_SCHEDULE_*.")
    schedule_folder: Path | None = Field(
        default=None, description="Folder of a single schedule given in the environment."
    )
    schedule_cron: str | None = Field(
        default=None, description="Cron of that schedule: 5 fields, or 6 with seconds first."
    )
    schedule_timezone: str = Field(default="UTC", description="Time zone the schedule's cron is read in.")
    schedule_pool: Pool = Field(default=Pool.ANY, description="Pool the environment schedule's runs go to.")
    max_retries: int = Field(
        default=2, ge=0, le=100, description="Later runs that retry an image that failed, before giving up."
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Starts of an image whose process died each time, before it is failed with that reason.",
    )
    worker_timeout: float = Field(
        default=30.0,
        ge=3.0,
        le=3600,
        description="A worker not seen for this long is dead: its batches are given back and sent again.",
    )
    backups: bool = Field(
        default=True,
        description="At a queue's tail, an idle worker races a busy one on its running batches; first wins.",
    )
    scheduler_lease_seconds: float = Field(
        default=30.0,
        ge=0.5,
        le=3600,
        description="Scheduler lease: renewed every third of it; a standby takes over once it runs out.",
    )

    @property
    def heartbeat_interval_s(self) -> float:
        """How often workers and producers say they are alive: six beats per worker_timeout."""
        return self.worker_timeout / 6

    @property
    def reconcile_interval_s(self) -> float:
        """How often the reconciler looks for lost workers and lost batches."""
        return self.worker_timeout / 3

    @property
    def missing_grace_s(self) -> float:
        """How long a batch must stay unseen (not queued, not held) before it is sent again.

        Two heartbeats: a message just taken from the queue shows in its node's held list by then.
        """
        return self.heartbeat_interval_s * 2

    @property
    def resolved_data_dir(self) -> Path:
        """The data dir as an absolute path."""
        return self.data_dir.expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to an SQLite file in the data dir."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.resolved_data_dir / 'detq.db'}"

    @property
    def is_embedded_broker(self) -> bool:
        """True when the broker is the embedded filesystem transport."""
        return self.resolved_broker_url.startswith("filesystem://")

    @property
    def resolved_broker_url(self) -> str:
        """The broker URL, defaulting to the embedded filesystem broker."""
        # kombu warns "No hostname was supplied" for a bare filesystem:// URL; the host part is ignored.
        return self.broker_url or "filesystem://localhost/"

    @property
    def broker_dir(self) -> Path:
        """Folder of the embedded filesystem broker."""
        return self.resolved_data_dir / "broker"

    @property
    def allowed_root_paths(self) -> list[Path]:
        """DETQ_ALLOWED_ROOTS as resolved paths."""
        parts = self.allowed_roots.replace(",", os.pathsep).split(os.pathsep)
        return [Path(p).expanduser().resolve() for p in parts if p.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
