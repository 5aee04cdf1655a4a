"""The one place detq reads its configuration: DETQ_* environment variables and an optional .env file."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from detq.broker_url import verified_tls
from detq.contract import MAX_BATCH_SIZE, MIN_BATCH_SIZE
from detq.setting_sources import ENV_FILE, PREFIX, environment
from detq.setting_values import (
    boolean,
    choice,
    integer,
    names,
    number,
    optional,
    path,
    read_values,
    setting,
    size,
    text,
)
from detq.speedups import as_saved_values
from detq.vocabulary import JobPool, ModelFormat, Precision

BUNDLED_MODEL = Path(__file__).resolve().parent.parent / "worker" / "assets" / "demo_detector.pt"


def _user_data_dir() -> Path:
    from platformdirs import user_data_path  # only where DETQ_DATA_DIR is not set

    return user_data_path("detq", appauthor=False)


@dataclass(init=False)
class Settings:
    """Typed detq settings; every field maps to a DETQ_<NAME> environment variable.

    Read and checked by detq itself, on a plain dataclass: pydantic's import and schema build were about a
    fifth of `detq enqueue`'s start-up. Keyword arguments override the environment, which overrides the
    .env file; an empty value is the default; unknown DETQ_* names are ignored.
    """

    data_dir: Path = setting(
        read=path,
        factory=_user_data_dir,
        doc="Where the embedded database and broker live (default: the user's data folder).",
    )
    database_url: str | None = setting(
        None, read=optional(text()), doc="SQLAlchemy URL; default SQLite in data_dir."
    )
    broker_url: str | None = setting(
        None,
        read=optional(text()),
        doc="Celery broker URL; default an embedded filesystem broker in data_dir.",
    )
    model: Path = setting(BUNDLED_MODEL, read=path, doc="Model file workers load and jobs default to.")
    model_sha256: str | None = setting(
        None,
        read=optional(text(r"[0-9a-f]{64}", "64 lower-case hex digits")),
        doc="Pin: workers refuse a model file (theirs, or a job's) whose sha256 is not this.",
    )
    metrics_port: int | None = setting(
        None,
        read=optional(integer(ge=1, le=65535)),
        doc="Serve Prometheus metrics of each worker on this port.",
    )
    metrics_address: str = setting(
        "127.0.0.1", read=text(), doc="Address the metrics endpoint listens on (0.0.0.0 for a scraper)."
    )
    flower_basic_auth: str | None = setting(
        None, read=optional(text()), doc="user:password (comma-separated pairs) that `detq flower` requires."
    )
    allowed_roots: str = setting(
        "", read=text(), doc="Folders workers may read from, separated by ':' or ','; empty: no extra limit."
    )
    batch_size: int = setting(
        16, read=integer(ge=MIN_BATCH_SIZE, le=MAX_BATCH_SIZE), doc="Images per queued task."
    )
    micro_batch: int = setting(8, read=integer(ge=1, le=256), doc="Images per forward pass.")
    cpu_forward_pixels: int = setting(
        2_500_000,
        read=integer(ge=1),
        doc=(
            "On a CPU, one forward takes at most this many pixels of model input (one image at least):"
            " two 1280x960 photos for a torchvision model, a 12 MP photo alone, six 640x640 YOLO inputs."
        ),
    )
    score_threshold: float | None = setting(
        None,
        read=optional(number(ge=0.0, le=1.0)),
        doc="Drop detections below this score (default: the model's).",
    )
    model_format: ModelFormat | None = setting(
        None,
        read=optional(choice(ModelFormat)),
        doc="Override the model's output format (default: its metadata, else guessed).",
    )
    input_size: tuple[int, int] | None = setting(
        None,
        read=optional(size),
        doc="Override the model's input size: 'H,W' or one number for a square (YOLO exports' imgsz).",
    )
    classes: tuple[str, ...] = setting(
        (),
        read=names,
        doc="Keep only detections of these classes: names or label ids, separated by commas (default: all).",
    )
    iou_threshold: float | None = setting(
        None,
        read=optional(number(ge=0.0, le=1.0)),
        doc="Override the NMS IoU threshold of YOLO outputs (0.7).",
    )
    max_detections: int | None = setting(
        None,
        read=optional(integer(ge=1)),
        doc="Override the detections kept per image of YOLO outputs (300).",
    )
    fast_decode: bool = setting(
        False,
        read=boolean,
        doc=(
            "Decode JPEGs at a reduced DCT scale near the model's input size: faster on large photos, but the"
            " pixels, and so some boxes, differ from the model's reference preprocessing (docs/models.md)."
        ),
    )
    cpu_optimize: bool = setting(
        False,
        read=boolean,
        doc=(
            "Freeze TorchScript models and optimise them for CPU inference where that runs faster (timed at"
            " load); scores move by about 1e-6, so a box right at a threshold may flip (docs/models.md)."
        ),
    )
    cpu_channels_last: bool = setting(
        True,
        read=boolean,
        doc=(
            "On a CPU, try each model's convolution weights in channels_last at load, kept only where its"
            " outputs stay bit for bit the same on probe images and it runs faster (docs/models.md)."
        ),
    )
    cpu_sampled_resize: bool = setting(
        True,
        read=boolean,
        doc=(
            "On a CPU, make a fixed-size torchvision detector's input (SSD, SSDlite) ahead from the pixels"
            " its resize reads, kept where its outputs stay bit for bit the same on probes (docs/models.md)."
        ),
    )
    cpu_selected_detections: bool = setting(
        True,
        read=boolean,
        doc=(
            "On a CPU, choose a torchvision SSD's or SSDlite's detections from only the candidates that can"
            " reach them, kept where they stay bit for bit the same on probes (docs/models.md)."
        ),
    )
    process_tuning: bool = setting(
        True,
        read=boolean,
        doc=(
            "Pool processes keep large image buffers in their heap while at work and freeze what start-up"
            " made from the garbage collector; no answer depends on it (docs/models.md#speed-ups)."
        ),
    )
    as_saved: bool = setting(
        False,
        read=boolean,
        doc=(
            "Turn every speed-up off (docs/models.md#speed-ups): the model as its file has it, one image a"
            " forward, no opt-in, pool processes untuned. The baseline, and the switch when one is suspect."
        ),
    )
    precision: Precision = setting(
        Precision.FP32,
        read=choice(Precision),
        doc=(
            "fp16 or bf16: run the model under autocast at half width, its outputs read as float32:"
            " faster on GPUs; boxes and scores move a little (docs/models.md)."
        ),
    )
    max_image_pixels: int = setting(100_000_000, read=integer(ge=1), doc="Larger images are rejected.")
    max_file_bytes: int = setting(200 * 1024 * 1024, read=integer(ge=1), doc="Larger files are rejected.")
    task_soft_time_limit: int = setting(
        900, read=integer(ge=1), doc="Seconds before a batch is asked to stop."
    )
    task_time_limit: int = setting(
        1200, read=integer(ge=1), doc="Seconds before a batch's process is killed."
    )
    visibility_timeout: int = setting(
        3600, read=integer(ge=1), doc="Redis redelivery timeout; must exceed task_time_limit."
    )
    broker_polling_interval: float = setting(
        0.05, read=number(gt=0), doc="Seconds between polls of the embedded filesystem broker."
    )
    decode_threads: int | None = setting(
        None,
        read=optional(integer(ge=1, le=64)),
        doc="Decode threads per process (default: 1 on cpu, cores/GPUs on gpu).",
    )
    torch_threads: int | None = setting(
        None,
        read=optional(integer(ge=1, le=256)),
        doc="Intra-op threads per pool process (default: cores / processes on cpu, up to 4 on gpu).",
    )
    worker_concurrency: int | None = setting(None, read=optional(integer(ge=1)), doc="Processes per worker.")
    log_level: str = setting("INFO", read=text(), doc="Worker log level.")
    schedules_file: Path | None = setting(
        None, read=optional(path), doc="TOML file of schedules for `detq scheduler` (docs/scheduling.md)."
    )
    schedule_name: str = setting("default", read=text(), doc="Name of the schedule of DETQ_SCHEDULE_*.")
    schedule_folder: Path | None = setting(
        None, read=optional(path), doc="Folder of a single schedule given in the environment."
    )
    schedule_cron: str | None = setting(
        None, read=optional(text()), doc="Cron of that schedule: 5 fields, or 6 with seconds first."
    )
    schedule_timezone: str = setting("UTC", read=text(), doc="Time zone the schedule's cron is read in.")
    schedule_pool: JobPool = setting(
        JobPool.ANY, read=choice(JobPool), doc="Pool the environment schedule's runs go to."
    )
    max_retries: int = setting(
        2, read=integer(ge=0, le=100), doc="Later runs that retry an image that failed, before giving up."
    )
    max_attempts: int = setting(
        3,
        read=integer(ge=1, le=100),
        doc="Starts of an image whose process died each time, before it is failed with that reason.",
    )
    worker_timeout: float = setting(
        30.0,
        read=number(ge=3.0, le=3600),
        doc="A worker not seen for this long is dead: its batches are given back and sent again.",
    )
    backups: bool = setting(
        True,
        read=boolean,
        doc="At a queue's tail, an idle worker races a busy one on its running batches; first wins.",
    )
    scheduler_lease_seconds: float = setting(
        30.0,
        read=number(ge=0.5, le=3600),
        doc="Scheduler lease: renewed every third of it; a standby takes over once it runs out.",
    )

    def __init__(self, _env_file: str | Path | None = ENV_FILE, **values: Any) -> None:
        found = environment(_env_file)
        given = {**{name: found[name] for name in SETTING_NAMES if name in found}, **values}
        for name, value in read_values(fields(Settings), given, _variable, defaults=True).items():
            setattr(self, name, value)
        self._fold_as_saved()

    def replace(self, **updates: Any) -> Settings:
        """A copy with these settings changed, each checked as when read."""
        changed = copy.copy(self)
        for name, value in read_values(fields(Settings), updates, _variable, defaults=False).items():
            setattr(changed, name, value)
        changed._fold_as_saved()
        return changed

    def _fold_as_saved(self) -> None:
        """Under as_saved, every speed-up's switch at its off value (detq.speedups), whatever else says."""
        if self.as_saved:
            for name, value in as_saved_values().items():
                setattr(self, name, value)

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
        """The broker URL (default: the embedded filesystem broker); rediss:// checks certificates."""
        # kombu warns "No hostname was supplied" for a bare filesystem:// URL; the host part is ignored.
        return verified_tls(self.broker_url) if self.broker_url else "filesystem://localhost/"

    @property
    def broker_dir(self) -> Path:
        """Folder of the embedded filesystem broker."""
        return self.resolved_data_dir / "broker"

    @property
    def allowed_root_paths(self) -> list[Path]:
        """DETQ_ALLOWED_ROOTS as resolved paths."""
        parts = self.allowed_roots.replace(",", os.pathsep).split(os.pathsep)
        return [Path(p).expanduser().resolve() for p in parts if p.strip()]


SETTING_NAMES = tuple(spec.name for spec in fields(Settings))


def _variable(name: str) -> str:
    return f"{PREFIX}{name.upper()}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
