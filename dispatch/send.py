"""Send batch messages: ids only, to the job's pool queue, under the task id that names the batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery

from detq.contract import TASK_PROCESS_BATCH, BatchMessage, queue_for_pool, task_id_for


def send_batch(
    app: Celery, *, job_id: int, batch_id: int, image_ids: Sequence[int], pool: str, producer: Any = None
) -> None:
    """Publish one batch (raises kombu's OperationalError when the broker cannot be reached)."""
    queue = queue_for_pool(pool)
    app.send_task(
        TASK_PROCESS_BATCH,
        args=BatchMessage(job_id, list(image_ids)).args(),
        task_id=task_id_for(batch_id),
        queue=queue,
        routing_key=queue,
        producer=producer,
    )


def check_broker(app: Celery, timeout_s: int = 5) -> None:
    """Connect to the broker once; kombu's OperationalError (or OSError) says why it cannot be reached."""
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1, timeout=timeout_s)
