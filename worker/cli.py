"""`detq worker`: start a Celery prefork pool whose processes each load the model once, after fork."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery.signals import worker_process_init
from kombu.utils.url import maybe_sanitize_url

from db.schema import ensure_schema
from detq.modelfile import file_sha256
from detq.settings import Settings
from worker.app import QUEUES_BY_POOL, make_celery_app
from worker.devices import (
    NoGpuError,
    decode_threads_per_process,
    default_concurrency,
    device_for_process,
    probe_cuda_device_count,
    threads_per_process,
    usable_cores,
)

log = logging.getLogger(__name__)

EXIT_STARTUP_FAILED = 3


class _ProcessPlan:
    """What each forked pool process needs to set itself up; built in the parent before the fork."""

    def __init__(
        self, settings: Settings, pool: str, gpu_count: int, threads: int, decode_threads: int, sha256: str
    ) -> None:
        self.settings = settings
        self.model_sha256 = sha256
        self.pool = pool
        self.gpu_count = gpu_count
        self.threads = threads
        self.decode_threads = decode_threads
        # Shared memory inherited through fork: a child that cannot load the model flags it here, so the
        # parent exits non-zero instead of respawning children that fail the same way forever.
        self.failed = multiprocessing.RawValue(ctypes.c_int, 0)


_plan: _ProcessPlan | None = None


def _init_pool_process(**_: Any) -> None:
    """worker_process_init: pick this child's device, load the model once, open this child's engine."""
    plan = _plan
    if plan is None:
        return
    try:
        import torch
        from billiard.process import current_process
        from PIL import Image

        from db.engine import make_engine, make_session_factory
        from worker.loading import load_model_for_device
        from worker.runtime import WorkerRuntime, meta_overrides, set_runtime

        index = int(getattr(current_process(), "index", 0) or 0)
        device = device_for_process(plan.pool, index, plan.gpu_count)
        torch.set_num_threads(plan.threads)
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        Image.MAX_IMAGE_PIXELS = plan.settings.max_image_pixels
        model = load_model_for_device(
            plan.settings.model, device, sha256=plan.model_sha256, overrides=meta_overrides(plan.settings)
        )
        # A fresh engine per child: pooled connections must never cross a fork.
        engine = make_engine(plan.settings.resolved_database_url)
        set_runtime(
            WorkerRuntime(
                settings=plan.settings,
                engine=engine,
                session_factory=make_session_factory(engine),
                device=device,
                default_model=model,
                decode_executor=(
                    ThreadPoolExecutor(plan.decode_threads, thread_name_prefix="decode")
                    if plan.decode_threads > 1
                    else None
                ),
            )
        )
        log.info(
            "detq: pool process %d (pid %d) ready on %s with %d intra-op and %d decode threads",
            index,
            os.getpid(),
            device,
            plan.threads,
            plan.decode_threads,
        )
    except Exception as exc:  # noqa: BLE001 - any start-up failure must stop the whole worker
        log.critical("detq: pool process %d could not start: %s", os.getpid(), exc)
        plan.failed.value = 1
        os.kill(os.getppid(), signal.SIGTERM)
        os._exit(EXIT_STARTUP_FAILED)


def run_worker(
    settings: Settings, *, pool: str, concurrency: int | None, loglevel: str, hostname: str | None = None
) -> int:
    """Run a GPU or CPU pool until stopped; returns the process exit code."""
    global _plan
    if pool not in QUEUES_BY_POOL:
        print(f"detq worker: unknown pool {pool!r}", file=sys.stderr)
        return 2
    if not settings.model.is_file():
        print(f"detq worker: model file not found: {settings.model}", file=sys.stderr)
        return EXIT_STARTUP_FAILED
    cores = usable_cores()
    gpu_count = probe_cuda_device_count() if pool == "gpu" else 0
    try:
        # Refuses a GPU pool on a host without CUDA, whatever concurrency was asked for.
        default = default_concurrency(pool, cores=cores, gpu_count=gpu_count)
    except NoGpuError as exc:
        print(f"detq worker: {exc}", file=sys.stderr)
        return EXIT_STARTUP_FAILED
    processes = concurrency or settings.worker_concurrency or default
    ensure_schema(settings.resolved_database_url)
    threads = threads_per_process(pool, cores=cores, concurrency=processes)
    decoders = settings.decode_threads or decode_threads_per_process(pool, cores=cores, concurrency=processes)
    # Hashed once here rather than in every pool process: a detector file can be hundreds of MB.
    _plan = _ProcessPlan(settings, pool, gpu_count, threads, decoders, file_sha256(settings.model))
    worker_process_init.connect(_init_pool_process, weak=False)

    from worker.tasks import register_tasks

    app = make_celery_app(settings)
    register_tasks(app)
    queues = list(QUEUES_BY_POOL[pool])
    node = hostname or f"{pool}-{os.getpid()}@{socket.gethostname()}"
    print(
        f"detq worker: pool={pool} queues={','.join(queues)} processes={processes} threads/process={threads} "
        f"decode threads/process={decoders} gpus={gpu_count} model={settings.model} "
        f"broker={maybe_sanitize_url(settings.resolved_broker_url)}",
        file=sys.stderr,
        flush=True,
    )
    worker = app.Worker(
        hostname=node,
        queues=queues,
        concurrency=processes,
        pool_cls="prefork",
        loglevel=loglevel.upper(),
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=settings.is_embedded_broker,
        optimization="fair",
        quiet=True,
    )
    worker.start()
    if _plan.failed.value:
        print("detq worker: a pool process failed to start (see the log above); stopping", file=sys.stderr)
        return EXIT_STARTUP_FAILED
    return int(getattr(worker, "exitcode", 0) or 0)
