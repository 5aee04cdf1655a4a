"""What each forked pool process does once at start: pick its device, load the model, open the ledger."""

from __future__ import annotations

import ctypes
import gc
import logging
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from db.ledger import open_ledger
from db.workers_repo import ROLE_PROCESS, WorkerIdentity
from detq.settings import Settings
from detq.vocabulary import WorkerPool
from worker.allocator import give_back_free_memory, keep_large_buffers
from worker.devices import device_for_process
from worker.heartbeat import Heartbeat, host_key
from worker.idle_memory import IdleTrim
from worker.metrics import ProcessMetrics
from worker.tasks import BatchTask

log = logging.getLogger(__name__)

EXIT_STARTUP_FAILED = 3
# PostgreSQL connections a pool process (and the node's own ledger) keeps between uses: its batches'
# transactions; a heartbeat that meets one opens another for the moment and closes it. With SQLAlchemy's
# default each pool process kept two once that had happened, and a 16-core box held 34; now 18.
KEPT_CONNECTIONS = 1


def _shared_flag() -> Any:
    # Shared memory inherited through fork: a child that cannot load the model flags it here, so the
    # parent exits non-zero instead of respawning children that fail the same way forever.
    return multiprocessing.RawValue(ctypes.c_int, 0)


@dataclass
class PoolBootstrap:
    """The plan made in the parent before the fork, and the worker_process_init handler that runs it."""

    settings: Settings
    pool: WorkerPool
    gpu_count: int
    threads: int
    decode_threads: int
    model_sha256: str
    task: BatchTask
    node: str = ""
    # Engines the parent opened (heartbeat, reconciler): a child must never use or close their sockets.
    parent_engines: list[Engine] = field(default_factory=list)
    failed: Any = field(default_factory=_shared_flag)

    @property
    def startup_failed(self) -> bool:
        """True when a pool process could not start (set in the child, read in the parent)."""
        return bool(self.failed.value)

    def init_process(self, **_: Any) -> None:
        """worker_process_init: device, threads, model and ledger for this child; the runtime on its task."""
        for engine in self.parent_engines:
            engine.dispose(close=False)  # SQLAlchemy's recipe for pools inherited through fork
        try:
            import cv2
            import torch
            from billiard.process import current_process
            from PIL import Image

            from worker.jpeg import exact_jpeg_decoder
            from worker.models.sampled_resize import SCRATCH
            from worker.runtime import WorkerRuntime, load_configured

            # Process tunings (detq.speedups): DETQ_PROCESS_TUNING, off under DETQ_AS_SAVED.
            tuned = self.settings.process_tuning
            kept = tuned and keep_large_buffers()
            if tuned and not kept:
                log.info("large image buffers are mapped afresh: not glibc, or it refused a 1 GB threshold")
            index = int(getattr(current_process(), "index", 0) or 0)
            device = device_for_process(self.pool, index, self.gpu_count)
            torch.set_num_threads(self.threads)
            cv2.setNumThreads(self.threads)  # its resize would otherwise use every core in every process
            if device.startswith("cuda"):
                torch.cuda.set_device(torch.device(device))
            Image.MAX_IMAGE_PIXELS = self.settings.max_image_pixels
            model = load_configured(self.settings, self.settings.model, device, self.model_sha256)
            runtime = WorkerRuntime(
                settings=self.settings,
                # A ledger of its own: pooled connections must never cross a fork.
                ledger=open_ledger(self.settings, check_schema=False, kept=KEPT_CONNECTIONS),
                device=device,
                default_model=model,
                decode_executor=(
                    ThreadPoolExecutor(self.decode_threads, thread_name_prefix="decode")
                    if self.decode_threads > 1
                    else None
                ),
                decode_threads=self.decode_threads,
            )
            runtime.heartbeat = Heartbeat(
                runtime.ledger.sessions,
                WorkerIdentity(
                    role=ROLE_PROCESS,
                    node=self.node,
                    host=socket.gethostname(),
                    host_key=host_key(),
                    pid=os.getpid(),
                    pool=self.pool.value,
                    device=device,
                    model_sha256=self.model_sha256,
                ),
                interval_s=self.settings.heartbeat_interval_s,
                state=runtime.stats.beat,
                clock=runtime.clock,
            )
            runtime.worker_id = runtime.heartbeat.start()
            if kept:
                runtime.idle_trim = IdleTrim(runtime.stats.idle_since, _give_back(SCRATCH.release))
                runtime.idle_trim.start()
            if self.settings.metrics_port is not None:
                runtime.metrics = ProcessMetrics()
                runtime.metrics.model_load.observe((model.load_ms + model.warmup_ms) / 1000)
            self.task.runtime = runtime
            jpegs = "OpenCV" if exact_jpeg_decoder() is not None else "Pillow"  # probed here, not in a batch
            # Everything so far (torch, the model, Celery) lives as long as the process. Out of the
            # collector's sight, the first batch no longer pays a full collection of some 400,000 objects
            # (0.2 s here), nor does any later collection that reaches the oldest generation.
            if tuned:
                gc.freeze()
            log.info(
                "detq: pool process %d (pid %d) ready on %s with %d intra-op and %d decode threads, JPEGs"
                " decoded by %s (%d long-lived objects frozen for the garbage collector)",
                index,
                os.getpid(),
                device,
                self.threads,
                self.decode_threads,
                jpegs,
                gc.get_freeze_count(),
            )
        except Exception as exc:  # noqa: BLE001 - any start-up failure must stop the whole worker
            log.critical("detq: pool process %d could not start: %s", os.getpid(), exc)
            self.failed.value = 1
            os.kill(os.getppid(), signal.SIGTERM)
            os._exit(EXIT_STARTUP_FAILED)

    def shutdown_process(self, **_: Any) -> None:
        """worker_process_shutdown: close this process's worker row and connections on a clean exit."""
        runtime = self.task.runtime
        if runtime is not None:
            self.task.runtime = None
            runtime.close()


def _give_back(release: Callable[[], None]) -> Callable[[], bool]:
    """What an idle process gives back: `release`'s buffers first, then its free heap."""

    def give_back() -> bool:
        release()
        return give_back_free_memory()

    return give_back
