"""`detq scheduler`: Celery beat in a thread plus a light consumer of the control queue, in one process."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

from celery.beat import Service
from celery.signals import worker_ready
from sqlalchemy.orm import Session, sessionmaker

from db.clock import measured_clock
from db.ledger import open_ledger
from detq.celery_app import make_celery_app
from detq.contract import QUEUE_CONTROL
from detq.inference_settings import InferenceSettings
from detq.settings import Settings
from dispatch.leadership import Leadership
from dispatch.service import ReconcilerLoop
from producer.scheduler.beat import BeatContext, LeaderScheduler
from producer.scheduler.control import make_run_handler, register_control_task
from producer.scheduler.runs import RunDefaults
from producer.scheduler.schedules import Schedule

log = logging.getLogger(__name__)

# Beat wakes up at least this often, so a standby notices an expired lease in time.
MAX_BEAT_INTERVAL_S = 1.0


def run_scheduler(settings: Settings, schedules: Sequence[Schedule], *, loglevel: str) -> int:
    """Run until stopped; returns the process exit code. Never imports torch (tests assert it)."""
    reconciler = ReconcilerLoop(settings)  # heals the ledger here too, when it holds the lease
    with open_ledger(settings) as led:
        reconciler.start()
        try:
            return _serve(settings, schedules, led.sessions, loglevel=loglevel)
        finally:
            reconciler.stop()


def _serve(
    settings: Settings, schedules: Sequence[Schedule], sessions: sessionmaker[Session], *, loglevel: str
) -> int:
    app = make_celery_app(settings)
    defaults = RunDefaults(
        model=settings.model,
        batch_size=settings.batch_size,
        max_retries=settings.max_retries,
        allowed_roots=settings.allowed_root_paths,
        heartbeat_s=settings.heartbeat_interval_s,
        worker_timeout_s=settings.worker_timeout,
        settings=InferenceSettings.from_settings(settings),
    )
    # One engine: the beat thread and the control task each check out their own pooled connection.
    register_control_task(app, make_run_handler(sessions, app, schedules, defaults))
    leadership = Leadership(sessions, ttl_s=settings.scheduler_lease_seconds)
    clock = measured_clock(sessions, "detq scheduler")  # its schedules fire by the server's clock
    context = BeatContext(schedules=schedules, factory=sessions, leadership=leadership, clock=clock)
    service = Service(
        app,
        max_interval=min(MAX_BEAT_INTERVAL_S, leadership.renew_interval_s),  # type: ignore[arg-type]
        scheduler_cls=LeaderScheduler.bound_to(context),
    )
    beat_thread = threading.Thread(target=_run_beat, args=(service,), name="beat", daemon=True)

    def start_beat(**_: Any) -> None:
        # Beat starts once the control queue is consumed; a run it sends is picked up at once.
        log.info(
            "detq scheduler: ready; %d schedules, lease %.1f s as %s, torch loaded: %s",
            len(schedules),
            settings.scheduler_lease_seconds,
            leadership.owner,
            "torch" in sys.modules,
        )
        beat_thread.start()

    worker_ready.connect(start_beat, weak=False)
    worker = app.Worker(
        hostname=f"scheduler-{os.getpid()}@{socket.gethostname()}",
        queues=[QUEUE_CONTROL],
        concurrency=1,
        pool_cls="solo",
        loglevel=loglevel.upper(),
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=settings.is_embedded_broker,
        quiet=True,
    )
    try:
        worker.start()
    finally:
        worker_ready.disconnect(start_beat)
        service.stop()
        if beat_thread.is_alive():
            beat_thread.join(timeout=MAX_BEAT_INTERVAL_S * 5)
        leadership.release()
    return int(getattr(worker, "exitcode", 0) or 0)


def _run_beat(service: Service) -> None:
    """Beat's loop; if it ever ends on its own the whole process stops, rather than beat going silent."""
    try:
        service.start()
    except BaseException:
        log.exception("detq scheduler: beat crashed")
    if not service._is_shutdown.is_set():  # type: ignore[attr-defined]
        log.critical("detq scheduler: beat stopped unexpectedly; stopping the scheduler")
        os.kill(os.getpid(), signal.SIGTERM)
