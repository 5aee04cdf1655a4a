"""`detq worker`: plan the pool in the parent (no CUDA here), then run Celery's prefork pool."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_process_init,
    worker_process_shutdown,
)
from celery.utils.nodenames import default_nodename, host_format
from celery.worker import state as worker_state
from kombu.utils.url import maybe_sanitize_url

from db.clock import measured_clock
from db.ledger import open_ledger
from db.workers_repo import ROLE_NODE, Beat, WorkerIdentity
from detq.celery_app import make_celery_app
from detq.contract import QUEUES_BY_POOL
from detq.display import escape_handlers
from detq.errors import DetqError
from detq.host import usable_cores, usable_memory_bytes
from detq.modelfile import file_sha256, identify_model_file
from detq.settings import Settings
from detq.vocabulary import WorkerPool
from dispatch.idle import IdleWatch
from dispatch.send import broker_error_reason, check_broker, is_certificate_refusal
from dispatch.service import TAIL_WATCH_S, ReconcilerLoop
from worker.bootstrap import EXIT_STARTUP_FAILED, KEPT_CONNECTIONS, PoolBootstrap
from worker.devices import (
    NoGpuError,
    decode_threads_per_process,
    default_concurrency,
    probe_cuda_device_count,
    threads_per_process,
)
from worker.heartbeat import Heartbeat, host_key
from worker.lost_requests import LostRequestWatch
from worker.metrics import MetricsServer
from worker.tasks import register_tasks

log = logging.getLogger(__name__)


class WorkerStartupError(DetqError):
    """The pool cannot start here: no model file, no GPU for a GPU pool, or a process failed to start."""

    exit_code = EXIT_STARTUP_FAILED


def _certificate_refusal(app: Celery, settings: Settings) -> str | None:
    """Why the broker refused its TLS certificate, if it did: no retry mends that. Any other broker error
    is left to Celery, which retries until the broker comes."""
    if settings.is_embedded_broker:
        return None
    try:
        check_broker(app, retries=0)  # one try: a broker that is down costs the start 0.1 s, not 2
    except Exception as exc:  # noqa: BLE001 - kombu, redis-py and ssl errors alike; only one kind is ours
        return broker_error_reason(exc) if is_certificate_refusal(exc) else None
    return None


WARNING_MARK = "warning: "  # a start-up line's prefix that `detq run` shows the user (LocalWorkers.warnings)


def root_warning(euid: int, settings: Settings) -> str | None:
    """What to tell a worker started as root (None for any other user): it reads whatever root can."""
    if euid != 0:
        return None
    confined = (
        f"reads are confined to DETQ_ALLOWED_ROOTS ({', '.join(map(str, settings.allowed_root_paths))}) and"
        " each job's folders"
        if settings.allowed_root_paths
        else "set DETQ_ALLOWED_ROOTS to the folders it may read"
    )
    return (
        "running as root: this worker can read any file root can (a hard link inside a job's folder to"
        " /etc/shadow would be opened); run it as an unprivileged user, as the Docker images do; " + confined
    )


# A pool process's peak, in bytes a pixel of the photo, where a torchvision detector as saved takes the
# whole photo in float32 into its own transform: 4.9 GB for 99.8 MP (docs/benchmarks.md, bench/scale.py).
PEAK_BYTES_PER_PIXEL = 48


def memory_warning(max_pixels: int, processes: int, usable_bytes: int) -> str | None:
    """What to tell a worker whose processes could not all hold a photo of the largest size admitted at
    once (None where they can): lower the pixel limit, or run fewer processes."""
    per_process = usable_bytes / max(1, processes)
    needed = max_pixels * PEAK_BYTES_PER_PIXEL
    if needed <= per_process:
        return None
    fits = int(per_process // PEAK_BYTES_PER_PIXEL)
    return (
        f"a photo of DETQ_MAX_IMAGE_PIXELS={max_pixels} pixels can take a pool process to about"
        f" {needed / 2**30:.1f} GiB, and this host has {per_process / 2**30:.1f} GiB for each of {processes}"
        f" processes: set DETQ_MAX_IMAGE_PIXELS={fits} (larger photos are then rejected, with the reason) or"
        " run fewer processes, or the kernel may kill a process on such a photo (the photo then fails"
        " after DETQ_MAX_ATTEMPTS)"
    )


def run_worker(
    settings: Settings,
    *,
    pool: WorkerPool,
    concurrency: int | None,
    loglevel: str,
    hostname: str | None = None,
    queues: Sequence[str] | None = None,
    announce: Callable[[str], None] = log.info,
) -> int:
    """Run a GPU or CPU pool until stopped; returns its exit code. Raises WorkerStartupError first."""
    if not settings.model.is_file():
        raise WorkerStartupError(f"model file not found: {settings.model}")
    cores = usable_cores()
    gpu_count = probe_cuda_device_count() if pool is WorkerPool.GPU else 0
    try:
        # Refuses a GPU pool on a host without CUDA, whatever concurrency was asked for.
        default = default_concurrency(pool, cores=cores, gpu_count=gpu_count)
    except NoGpuError as exc:
        raise WorkerStartupError(str(exc)) from exc
    processes = concurrency or settings.worker_concurrency or default
    threads = settings.torch_threads or threads_per_process(pool, cores=cores, concurrency=processes)
    decoders = settings.decode_threads or decode_threads_per_process(pool, cores=cores, concurrency=processes)
    consumed = list(queues or QUEUES_BY_POOL[pool])
    # As `celery worker -n`: %h, %n and %d expand; a bare name is the host part.
    node = (
        host_format(default_nodename(hostname))
        if hostname
        else f"{pool}-{os.getpid()}@{socket.gethostname()}"
    )
    # A state_dict, a checkpoint, ONNX...: refused here in one line, before any pool process tries it.
    found = identify_model_file(settings.model)
    if settings.model.is_file() and not found.runs:
        raise WorkerStartupError(found.refusal(str(settings.model)))
    # Hashed once here rather than in every pool process: a detector file can be hundreds of MB.
    sha256 = file_sha256(settings.model)
    if settings.model_sha256 and sha256 != settings.model_sha256:
        raise WorkerStartupError(
            f"{settings.model} has sha256 {sha256}, but DETQ_MODEL_SHA256 pins {settings.model_sha256}"
        )
    app = make_celery_app(settings)
    refused = _certificate_refusal(app, settings)
    if refused is not None:
        raise WorkerStartupError(f"cannot use the broker: {refused}")
    # Longer than billiard waits before it fails a dead process's job itself, and two heartbeats more;
    # a task no process took yet waits a worker timeout more, for a replacement process to load its model.
    lost_grace = float(app.conf.worker_lost_wait) + 2 * settings.heartbeat_interval_s
    watch = LostRequestWatch(lost_grace, lost_grace + settings.worker_timeout)
    # Migrates the embedded default, refuses an old PostgreSQL schema; one connection kept, for the beats.
    node_ledger = open_ledger(settings, kept=KEPT_CONNECTIONS)
    node_beat = Heartbeat(
        node_ledger.sessions,
        WorkerIdentity(
            ROLE_NODE, node, socket.gethostname(), host_key(), os.getpid(), pool.value, None, sha256
        ),
        interval_s=settings.heartbeat_interval_s,
        state=lambda: Beat(held=watch.held()),
        watch_s=TAIL_WATCH_S,  # an idle node shows at once: backups at a queue's tail go to it
        clock=measured_clock(node_ledger.sessions, "detq worker"),
    )
    # The node's own look at its queue's tail as soon as a process comes free (dispatch/idle.py).
    idle = IdleWatch(lambda: processes - len(worker_state.requests), node_beat.beat_now)
    reconciler = ReconcilerLoop(settings, idle)
    # Before the pool forks: its processes must inherit where to write their numbers.
    metrics = MetricsServer(settings, app) if settings.metrics_port is not None else None
    try:
        node_beat.start()
        reconciler.start()
        bootstrap = PoolBootstrap(
            settings=settings,
            pool=pool,
            gpu_count=gpu_count,
            threads=threads,
            decode_threads=decoders,
            model_sha256=sha256,
            task=register_tasks(app),
            node=node,
            parent_engines=[node_ledger.engine, *([reconciler.ledger.engine] if reconciler.ledger else [])],
        )
        if (warning := root_warning(os.geteuid(), settings)) is not None:  # once it is sure to run
            announce(f"{WARNING_MARK}{warning}")
        if (
            warning := memory_warning(settings.max_image_pixels, processes, usable_memory_bytes())
        ) is not None:
            announce(f"{WARNING_MARK}{warning}")
        announce(
            f"pool={pool} queues={','.join(consumed)} processes={processes} threads/process={threads} "
            f"decode threads/process={decoders} gpus={gpu_count} model={settings.model} "
            f"broker={maybe_sanitize_url(settings.resolved_broker_url)}"
            + (" speed-ups=off (as saved)" if settings.as_saved else "")
        )
        exit_code = _run_consumer(app, bootstrap, node, consumed, processes, loglevel, settings, watch)
    finally:
        reconciler.stop()
        node_beat.stop()
        node_ledger.close()
        if metrics is not None:
            metrics.close()
    if bootstrap.startup_failed:
        raise WorkerStartupError("a pool process failed to start (see the log above); stopped")
    return exit_code


def _escaped_log(logger: logging.Logger, **_: object) -> None:
    """Celery's log handlers, once it made them: file names and reasons in the log with their control
    characters escaped."""
    escape_handlers(logger)


def _run_consumer(
    app: Celery,
    bootstrap: PoolBootstrap,
    node: str,
    queues: list[str],
    processes: int,
    loglevel: str,
    settings: Settings,
    watch: LostRequestWatch,
) -> int:
    worker_process_init.connect(bootstrap.init_process, weak=False)
    worker_process_shutdown.connect(bootstrap.shutdown_process, weak=False)
    after_setup_logger.connect(_escaped_log, weak=False)
    after_setup_task_logger.connect(_escaped_log, weak=False)
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
    watch.attach(worker)
    try:
        worker.start()
    finally:
        worker_process_init.disconnect(bootstrap.init_process)
        worker_process_shutdown.disconnect(bootstrap.shutdown_process)
        after_setup_logger.disconnect(_escaped_log)
        after_setup_task_logger.disconnect(_escaped_log)
    return int(getattr(worker, "exitcode", 0) or 0)
