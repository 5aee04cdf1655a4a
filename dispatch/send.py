"""Send batch messages: ids only, to the job's pool queue, under the task id that names the batch."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

from celery import Celery

from detq.contract import (
    SENT_AGAIN_HEADER,
    TASK_PROCESS_BATCH,
    BatchMessage,
    backup_task_id_for,
    queue_for_pool,
    task_id_for,
)


def send_batch(
    app: Celery,
    *,
    job_id: int,
    batch_id: int,
    image_ids: Sequence[int],
    pool: str,
    producer: Any = None,
    declare: bool = True,
    backup: bool = False,
    again: bool = False,
) -> None:
    """Publish one batch (raises kombu's OperationalError when the broker cannot be reached).

    declare=False skips declaring the queue, for a producer that declared it already (declare_queue).
    backup=True sends the batch's backup copy (its own task id), to race a slow run at a queue's tail.
    again=True marks a batch sent again by the reconciler (its copy lost, or held by a worker gone): the
    embedded broker hands it out before the queue's backlog (detq.embedded_broker), as Redis does a
    message given back (dispatch.broker.restore_unacked).
    """
    queue = queue_for_pool(pool)
    task_id = backup_task_id_for(batch_id) if backup else task_id_for(batch_id)
    # Celery's own message (protocol 2) and publish, without send_task's per-call routing and option
    # merging: half the CPU of a send, which is most of `detq enqueue` on a large folder.
    message = app.amqp.create_task_message(
        task_id,
        TASK_PROCESS_BATCH,
        BatchMessage(job_id, list(image_ids)).args(),
        {},
        reply_to=app.thread_oid,
        ignore_result=None,
        # What logs and Flower show; Celery's own repr of 16 ids costs more than the rest of the send.
        argsrepr=f"(job {job_id}, {len(image_ids)} images)",
        kwargsrepr="{}",
    )
    if again:
        message.headers[SENT_AGAIN_HEADER] = True
    with app.producer_or_acquire(producer) as publisher:
        app.amqp.send_task_message(
            publisher,
            TASK_PROCESS_BATCH,
            message,
            queue=queue,
            routing_key=queue,
            declare=None if declare else [],
        )


def declare_queue(app: Celery, producer: Any, pool: str) -> None:
    """Declare the pool's queue once on this producer's channel (before sending many batches to it)."""
    producer.maybe_declare(app.amqp.queues[queue_for_pool(pool)])


def publish_batch(producer: Any) -> AbstractContextManager[object]:
    """Buffer the producer's publishes and send them together on leaving the block, where the transport
    can (Redis: one pipelined round trip instead of one per message); elsewhere each goes out at once.

    kombu's Producer.batch. A failed flush raises BatchPublishError (a broker error: some messages of the
    block may have arrived, as when a connection drops between single publishes).
    """
    return cast(AbstractContextManager[object], producer.batch())


def check_broker(app: Celery, timeout_s: int = 5, retries: int = 1) -> None:
    """Connect to the broker (a failed try is tried again `retries` times, 2 s later); kombu's
    OperationalError (or OSError) says why it cannot be reached."""
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=retries, timeout=timeout_s)


def broker_error_reason(error: BaseException) -> str:
    """Why the broker cannot be reached, in one line; with the fix where its TLS certificate is refused."""
    lines = str(error).strip().splitlines()
    reason = lines[0].rstrip(".") if lines else type(error).__name__
    if is_certificate_refusal(error):
        reason += " (a server certificate from a private CA: name the CA with ssl_ca_certs=/path/ca.pem in"
        reason += " DETQ_BROKER_URL)"
    return reason


def is_certificate_refusal(error: BaseException) -> bool:
    """Whether the broker was refused because its TLS certificate could not be verified: no retry mends
    that, where a broker that is down may come back. kombu wraps redis-py's error, which wraps ssl's."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        if isinstance(found, ssl.SSLCertVerificationError):
            return True
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return False
