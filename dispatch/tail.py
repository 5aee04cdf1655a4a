"""Send backup copies at a queue's tail: in each full reconciler pass, and every second in between
while a worker idles next to an empty queue (so a job's end waits seconds, not a pass, for them)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import partial

from celery import Celery
from sqlalchemy.orm import Session

from db.batches_repo import OpenBatch, claim_send, open_batches, pending_ids_of_batch
from db.clock import ledger_now
from db.ledger import Ledger
from db.retry import in_transaction
from db.workers_repo import live_workers
from detq.contract import queue_for_pool
from detq.settings import Settings
from dispatch.backups import NodeLoad, backups_to_send, node_loads, queues_open_to_backups
from dispatch.broker import queue_depths
from dispatch.send import send_batch

log = logging.getLogger(__name__)


def send_backups(
    ledger: Ledger,
    app: Celery,
    batches: Sequence[OpenBatch],
    nodes: Sequence[NodeLoad],
    queued: set[str],
    now: datetime,
    min_age_s: float,
) -> int:
    """Send the backups backups_to_send picks; how many.

    Each is claimed in the ledger before it is sent (claim_send), so passes that read the same batches
    (a lease holder and an idle node, or two holders around a handover) send one copy between them. A
    send that fails after its claim leaves the batch counted as sent: its next backup waits min_age_s.
    """
    sent = 0
    for batch in backups_to_send(batches, nodes, queued, now, min_age_s):
        assert batch.batch_id is not None  # backups_to_send takes only batches with an id
        claim = partial(
            _claimed_ids, job_id=batch.job_id, batch_id=batch.batch_id, seen_sends=batch.sends, now=now
        )
        ids = in_transaction(ledger.sessions, claim)
        if ids is None:
            continue  # another pass sent it since it was read
        if ids:
            send_batch(
                app, job_id=batch.job_id, batch_id=batch.batch_id, image_ids=ids, pool=batch.pool, backup=True
            )
        sent += 1
    if sent:
        log.info("detq reconciler: sent a backup copy of %d batches running while workers idle", sent)
    return sent


def _claimed_ids(
    session: Session, job_id: int, batch_id: int, seen_sends: int, now: datetime
) -> list[int] | None:
    """The batch's pending image ids, if this caller wins its next send after seen_sends (else None)."""
    if not claim_send(session, batch_id, seen_sends, now):
        return None
    return pending_ids_of_batch(session, job_id, batch_id)


def tail_pass(ledger: Ledger, app: Celery, settings: Settings, now: datetime | None = None) -> int:
    """Backups only, cheaply: nothing is read past the first check that fails (a queue both an idle
    process and a fully busy node consume, that queue empty, open batches); returns how many were sent.

    The lease holder runs it every TAIL_WATCH_S: an idle fleet, or one whose nodes are all busy, pays one
    read of the worker rows a pass, not the broker's queues and the open batches too.
    """
    with ledger.reads() as session:
        now = now or ledger_now(session)  # the database's clock (db/clock.py)
        workers = live_workers(session, now - timedelta(seconds=settings.worker_timeout))
    nodes = node_loads(workers)
    tail_queues = queues_open_to_backups(nodes)
    if not tail_queues:
        return 0
    depths = queue_depths(app, settings)
    if not any(depths.get(queue, 1) == 0 for queue in tail_queues):
        return 0  # every queue an idle worker could take from still has work (or cannot be counted)
    # Queued task ids are not read here: a queue with a message in it is not at its tail (nor are its
    # batches read from the ledger).
    waiting = {queue for queue, depth in depths.items() if depth > 0}
    batches = in_transaction(ledger.reads, lambda s: open_batches(s, skip_pools=waiting))
    batches = [b for b in batches if queue_for_pool(b.pool) not in waiting]
    if not batches:
        return 0
    return send_backups(ledger, app, batches, nodes, set(), now, settings.missing_grace_s)
