"""The Celery app both sides build from settings: JSON-only messages, late acks, the queues; no torch."""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Queue

from detq import transports
from detq.contract import INFERENCE_QUEUES, QUEUE_ANY
from detq.settings import Settings

# Loading a large model (and its warm-up) in worker_process_init can take far longer than Celery's
# default 4 s worker_proc_alive_timeout, after which the pool kills the child as hung.
PROCESS_START_TIMEOUT_S = 300.0


# Seconds billiard waits for a dead pool process's result before its message is given back (below).
WORKER_LOST_WAIT_S = 2.0


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    """Transport options: filesystem folders for the embedded broker, visibility timeout for Redis."""
    if settings.is_embedded_broker:
        folder = settings.broker_dir
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "dead_letter_folder": str(folder / transports.DEAD_LETTER_FOLDER),
            "polling_interval": settings.broker_polling_interval,
        }
    # Redis redelivers an unacked message after visibility_timeout; it must exceed the longest batch
    # (the hard time limit) or a slow batch is run twice (celery docs, "Visibility timeout").
    return {"visibility_timeout": max(settings.visibility_timeout, settings.task_time_limit + 60)}


def make_celery_app(settings: Settings) -> Celery:
    """Build the Celery app for these settings; producers send by task name, workers register the task."""
    app = Celery("detq", broker=settings.resolved_broker_url, set_as_current=False)
    # detq's transports: kombu's, setting aside what detq's consumers cannot use (detq/transports.py)
    if settings.is_embedded_broker:
        app.conf.broker_transport = transports.Transport
    elif settings.resolved_broker_url.startswith("rediss://"):
        app.conf.broker_transport = transports.TlsRedisTransport
    elif settings.resolved_broker_url.startswith("redis://"):
        app.conf.broker_transport = transports.RedisTransport
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # How long billiard waits for the result of a pool process that died before it gives the message
        # back (task_reject_on_worker_lost): Celery's 10 s is for results a dead process may still have
        # sent. detq's tasks return nothing anyone reads, and a batch run twice writes nothing twice, so
        # a killed process's batch (OOM, a poison image) goes again after WORKER_LOST_WAIT_S instead.
        worker_lost_wait=WORKER_LOST_WAIT_S,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.task_soft_time_limit,
        task_time_limit=settings.task_time_limit,
        task_queues=[Queue(name) for name in INFERENCE_QUEUES],
        task_default_queue=QUEUE_ANY,
        broker_transport_options=broker_transport_options(settings),
        broker_connection_retry_on_startup=True,
        worker_proc_alive_timeout=PROCESS_START_TIMEOUT_S,
        worker_redirect_stdouts=False,
        # The embedded broker has no real fanout across hosts; remote control only makes sense on Redis.
        worker_enable_remote_control=not settings.is_embedded_broker,
        # Task events feed Flower; on Redis they are pub/sub messages, dropped when nobody listens.
        worker_send_task_events=not settings.is_embedded_broker,
    )
    return app
