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

from db.engine import make_engine, make_session_factory
from db.schema import ensure_schema
from detq.settings import Settings
from producer.beat import BeatContext, LeaderScheduler
from producer.control import make_run_handler, register_control_task
from producer.leadership import Leadership
from producer.runs import RunDefaults
from producer.schedules import Schedule
from worker.app import QUEUE_CONTROL, make_celery_app

log = logging.getLogger(__name__)

# Beat wakes up at least this often, so a standby notices an expired lease in time.
MAX_BEAT_INTERVAL_S = 1.0


def run_scheduler(settings: Settings, schedules: Sequence[Schedule], *, loglevel: str) -> int:
    """Run until stopped; returns the process exit code. Never imports torch (tests assert it)."""
    url = settings.resolved_database_url
    ensure_schema(url)
    app = make_celery_app(settings)
    # Separate engines: the beat thread's sessions and the control task's never share a connection.
    beat_engine, control_engine = make_engine(url), make_engine(url)
    defaults = RunDefaults(
        model=settings.model,
        batch_size=settings.batch_size,
        max_retries=settings.max_retries,
        allowed_roots=settings.allowed_root_paths,
    )
    control_factory, beat_factory = make_session_factory(control_engine), make_session_factory(beat_engine)
    register_control_task(app, make_run_handler(control_factory, app, schedules, defaults))
    leadership = Leadership(beat_factory, ttl_s=settings.scheduler_lease_seconds)
    context = BeatContext(schedules=schedules, factory=beat_factory, leadership=leadership)
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
        beat_engine.dispose()
        control_engine.dispose()
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
