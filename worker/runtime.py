"""Per-process worker state: ledger, device and the models loaded in this process, created after fork."""

from __future__ import annotations

import logging
import os
import socket
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from db.clock import LedgerClock
from db.jobs_repo import JobModel
from db.ledger import Ledger
from detq.settings import Settings
from worker.heartbeat import Heartbeat, ProcessStats
from worker.idle_memory import IdleTrim
from worker.metrics import ProcessMetrics
from worker.models.loading import LoadedModel, ModelLoadError, load_model_for_device
from worker.models.metadata import MetaOverrides, parse_input_size

log = logging.getLogger(__name__)

MAX_CACHED_MODELS = 2
MAX_CACHED_JOBS = 64


@dataclass
class WorkerRuntime:
    """What one pool process holds for its life: made once after fork, handed to every batch."""

    settings: Settings
    ledger: Ledger
    device: str
    default_model: LoadedModel
    worker_name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    models: OrderedDict[str, LoadedModel] = field(default_factory=OrderedDict)
    # What batches need of their jobs (roots, model, pool), read once: a job's are never changed.
    jobs: OrderedDict[int, JobModel] = field(default_factory=OrderedDict)
    # Jobs whose started_at this process has set, or seen set by its claim (at most MAX_CACHED_JOBS).
    started_jobs: set[int] = field(default_factory=set)
    model_loads: int = 1
    decode_executor: ThreadPoolExecutor | None = None
    decode_threads: int = 1  # the executor's threads (none below 2)
    worker_id: int = 0  # this process's row in the workers table (0: none, as in unit tests)
    stats: ProcessStats = field(default_factory=ProcessStats)
    heartbeat: Heartbeat | None = None
    # What this process stamps (claims, finish times, its heartbeats): the database server's time, the
    # offset measured by its heartbeat at each beat.
    clock: LedgerClock = field(default_factory=LedgerClock)
    metrics: ProcessMetrics | None = None  # with DETQ_METRICS_PORT
    idle_trim: IdleTrim | None = None  # where the heap keeps large buffers (glibc)

    # DETQ_ALLOWED_ROOTS resolved once, at start: one replaced by a symlink later does not move.
    allowed_roots: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.models[self.default_model.sha256] = self.default_model
        if not self.allowed_roots:
            self.allowed_roots = self.settings.allowed_root_paths

    def model_for(self, sha256: str, path: str) -> LoadedModel:
        """The model with this sha256, loading it once from `path` when a job names another model."""
        pinned = self.settings.model_sha256
        if pinned and sha256 != pinned:
            raise ModelLoadError(
                f"job's model {sha256[:12]} is not the one DETQ_MODEL_SHA256 pins ({pinned[:12]})"
            )
        cached = self.models.get(sha256)
        if cached is not None:
            self.models.move_to_end(sha256)
            return cached
        candidate = Path(path)
        if not candidate.is_file():
            raise ModelLoadError(
                f"job's model {sha256[:12]} ({path}) is not on host {socket.gethostname()}; "
                "copy it there or run this job on workers that have it"
            )
        loaded = load_configured(self.settings, candidate, self.device)
        if loaded.sha256 != sha256:
            raise ModelLoadError(f"{path} has sha256 {loaded.sha256[:12]}, but the job names {sha256[:12]}")
        self.model_loads += 1
        self.models[sha256] = loaded
        while len(self.models) > MAX_CACHED_MODELS:
            oldest = next(iter(self.models))
            if oldest == self.default_model.sha256:
                self.models.move_to_end(oldest)
                oldest = next(iter(self.models))
            del self.models[oldest]
        return loaded

    def remember_job(self, job_id: int, job: JobModel | None) -> None:
        """Keep a job's model and roots for its next batches (None: forget it, the job is gone)."""
        if job is None:
            self.jobs.pop(job_id, None)
            return
        self.jobs[job_id] = job
        self.jobs.move_to_end(job_id)
        while len(self.jobs) > MAX_CACHED_JOBS:
            self.jobs.popitem(last=False)

    def remember_started(self, job_id: int) -> None:
        """The job's started_at is set (this process's claim committed it, or found it set)."""
        if len(self.started_jobs) >= MAX_CACHED_JOBS:
            self.started_jobs.clear()  # one more no-op UPDATE for a job seen before, at worst
        self.started_jobs.add(job_id)

    def close(self) -> None:
        """Close the worker row, stop the decode and idle threads, close the ledger's connections."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.idle_trim is not None:
            self.idle_trim.stop()
        if self.decode_executor is not None:
            self.decode_executor.shutdown(wait=False, cancel_futures=True)
        self.ledger.close()


def load_configured(settings: Settings, path: Path, device: str, sha256: str | None = None) -> LoadedModel:
    """A model loaded as these settings ask: metadata overrides, DETQ_CPU_OPTIMIZE, DETQ_CPU_CHANNELS_LAST,
    DETQ_CPU_SAMPLED_RESIZE,
    DETQ_CPU_SELECTED_DETECTIONS and DETQ_PRECISION."""
    return load_model_for_device(
        path,
        device,
        sha256=sha256,
        overrides=meta_overrides(settings),
        cpu_optimize=settings.cpu_optimize,
        channels_last=settings.cpu_channels_last,
        sampled_resize=settings.cpu_sampled_resize,
        selected_detections=settings.cpu_selected_detections,
        precision=settings.precision,
        micro_batch=settings.micro_batch,
    )


def meta_overrides(settings: Settings) -> MetaOverrides:
    """Model metadata that settings (DETQ_MODEL_FORMAT, DETQ_INPUT_SIZE, ...) override."""
    return MetaOverrides(
        format=settings.model_format,
        input_size=parse_input_size(settings.input_size),
        score_threshold=settings.score_threshold,
        iou_threshold=settings.iou_threshold,
        max_detections=settings.max_detections,
    )
