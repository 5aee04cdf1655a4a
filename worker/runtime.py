"""Per-process worker state: ledger, device and the models loaded in this process, created after fork."""

from __future__ import annotations

import logging
import os
import socket
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from db.clock import LedgerClock
from db.jobs_repo import JobSpec
from db.ledger import Ledger
from detq.inference_settings import InferenceSettings
from detq.settings import Settings
from worker.heartbeat import Heartbeat, ProcessStats
from worker.idle_memory import IdleTrim
from worker.metrics import ProcessMetrics
from worker.models.formats import adapter_for
from worker.models.loading import LoadedModel, ModelLoadError, load_model_for_device
from worker.models.metadata import MetaOverrides

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
    # By sha256 and the settings a load fixes (load_key): the default model's first.
    models: OrderedDict[tuple[object, ...], LoadedModel] = field(default_factory=OrderedDict)
    # What batches need of their jobs (roots, model, pool), read once: a job's are never changed.
    jobs: OrderedDict[int, JobSpec] = field(default_factory=OrderedDict)
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
    # This worker's own inference settings: a job made before jobs had settings runs with them.
    own_settings: InferenceSettings = field(init=False)

    def __post_init__(self) -> None:
        self.own_settings = InferenceSettings.from_settings(self.settings)
        self.models[(self.default_model.sha256, *load_key(self.own_settings))] = self.default_model
        if not self.allowed_roots:
            self.allowed_roots = self.settings.allowed_root_paths

    def model_for(self, sha256: str, path: str, settings: InferenceSettings | None = None) -> LoadedModel:
        """The model with this sha256 answering as a job's settings ask (None: as this worker's settings
        say, for a job made before jobs had settings). Loaded once from `path` per format, input size and
        precision (the settings a load fixes); thresholds and classes need no load (answering)."""
        wanted = settings or self.own_settings
        pinned = self.settings.model_sha256
        if pinned and sha256 != pinned:
            raise ModelLoadError(
                f"job's model {sha256[:12]} is not the one DETQ_MODEL_SHA256 pins ({pinned[:12]})"
            )
        key = (sha256, *load_key(wanted))
        cached = self.models.get(key)
        if cached is not None and cached.rewrite_check is not None and cached.rewrite_check.fell_back:
            # Its rewrites gave other detections on a real forward: the model as saved answers from now on
            # (and the rewritten one is let go).
            replacement = cached.rewrite_check.reference()
            if cached is self.default_model:
                self.default_model = replacement
            cached = self.models[key] = replacement
        if cached is None:
            cached = self._load(key, Path(path), wanted)
        self.models.move_to_end(key)
        return answering(cached, wanted)

    def _load(self, key: tuple[object, ...], candidate: Path, settings: InferenceSettings) -> LoadedModel:
        sha256 = str(key[0])
        if not candidate.is_file():
            raise ModelLoadError(
                f"job's model {sha256[:12]} ({candidate}) is not on host {socket.gethostname()}; "
                "copy it there or run this job on workers that have it"
            )
        loaded = load_configured(self.settings, candidate, self.device, settings_of_job=settings)
        if loaded.sha256 != sha256:
            raise ModelLoadError(
                f"{candidate} has sha256 {loaded.sha256[:12]}, but the job names {sha256[:12]}"
            )
        self.model_loads += 1
        self.models[key] = loaded
        default = (self.default_model.sha256, *load_key(self.own_settings))
        while len(self.models) > MAX_CACHED_MODELS:
            oldest = next(iter(self.models))
            if oldest == default:
                self.models.move_to_end(oldest)
                oldest = next(iter(self.models))
            del self.models[oldest]
        return loaded

    def remember_job(self, job_id: int, job: JobSpec | None) -> None:
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


def load_configured(
    settings: Settings,
    path: Path,
    device: str,
    sha256: str | None = None,
    *,
    settings_of_job: InferenceSettings | None = None,
) -> LoadedModel:
    """A model loaded at a job's format, input size and precision (settings_of_job; this worker's own
    where None), and as this worker's settings ask of a load: DETQ_CPU_OPTIMIZE, DETQ_CPU_CHANNELS_LAST,
    DETQ_CPU_SAMPLED_RESIZE, DETQ_CPU_SELECTED_DETECTIONS, DETQ_MICRO_BATCH. Its thresholds are the
    model's own until answering applies a job's."""
    inference = settings_of_job or InferenceSettings.from_settings(settings)
    return load_model_for_device(
        path,
        device,
        sha256=sha256,
        overrides=MetaOverrides(format=inference.model_format, input_size=inference.input_size),
        cpu_optimize=settings.cpu_optimize,
        channels_last=settings.cpu_channels_last,
        sampled_resize=settings.cpu_sampled_resize,
        selected_detections=settings.cpu_selected_detections,
        precision=inference.precision,
        micro_batch=settings.micro_batch,
    )


def load_key(settings: InferenceSettings) -> tuple[object, ...]:
    """What of a job's settings a load fixes: the model's format, input size and precision."""
    return (settings.model_format, settings.input_size, settings.precision)


def answering(model: LoadedModel, settings: InferenceSettings) -> LoadedModel:
    """The loaded model answering as these settings ask: their score and IoU thresholds, detections kept
    per image and classes, over the model's own (no load: the meta its format reads them from)."""
    changes: dict[str, object] = {"keep_classes": settings.classes}
    for name in ("score_threshold", "iou_threshold", "max_detections"):
        value = getattr(settings, name)
        if value is not None:
            changes[name] = value
    meta = model.meta.model_copy(update=changes)
    if meta == model.meta:
        return model
    adapter = adapter_for(meta) if meta.fixed_input else model.adapter
    return replace(model, meta=meta, adapter=adapter)
