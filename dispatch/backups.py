"""Backup copies at a queue's tail: when nothing of a queue is waiting and a worker that could take work
idles, batches still running elsewhere get a second copy, so a slow worker cannot hold a job's end.

Only idle capacity runs backups, so they cost no wall time; the first result written wins (the ledger
writes only pending rows), and the slower run finds its images finished.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from db.batches_repo import OpenBatch
from db.models import WorkerRecord, as_utc
from db.workers_repo import ROLE_NODE
from detq.contract import backup_task_id_for, queue_for_pool, queues_of_worker_pool, task_id_for


@dataclass(frozen=True)
class NodeLoad:
    """A live node: the queues it consumes, its pool processes, and the task ids it holds."""

    name: str
    queues: tuple[str, ...]
    processes: int
    held: frozenset[str]

    @property
    def free(self) -> int:
        """Pool processes with nothing to do (prefetch keeps a node from holding more than it runs)."""
        return max(0, self.processes - len(self.held))


def node_loads(workers: Sequence[WorkerRecord]) -> list[NodeLoad]:
    """Live nodes from live worker rows (a node row, and one row per pool process naming its node)."""
    processes = Counter(w.node for w in workers if w.role != ROLE_NODE)
    loads = []
    for worker in workers:
        queues = queues_of_worker_pool(worker.pool)
        if worker.role != ROLE_NODE or not queues:
            continue
        held = frozenset(worker.held or [])
        loads.append(NodeLoad(worker.node, queues, processes.get(worker.node, 0), held))
    return loads


def queues_open_to_backups(nodes: Sequence[NodeLoad]) -> set[str]:
    """Queues a backup copy could go to now: consumed both by a fully busy node (the only holder whose
    batches get one; a node holds what its queues deliver) and by a node with an idle process to run it.
    Outside them backups_to_send picks nothing, so a pass with none reads no further (dispatch/tail.py)."""
    idle = {queue for node in nodes if node.free > 0 for queue in node.queues}
    busy = {queue for node in nodes if node.free == 0 and node.held for queue in node.queues}
    return idle & busy


def backups_to_send(
    batches: Sequence[OpenBatch],
    nodes: Sequence[NodeLoad],
    queued: set[str],
    now: datetime,
    min_age_s: float,
) -> list[OpenBatch]:
    """Batches that get a backup copy now, oldest first, at most one per idle process of their queue.

    A batch qualifies when its queue has no batch waiting, a node that is fully busy holds it, another
    node that consumes its queue has an idle process (the holder cannot take its own backup), and no
    backup of it is queued or held. A batch sent more than once (resent, or backed up before) also waits
    until its last send is min_age_s old: time for that copy to show up in a node's held list. Its first
    send needs no wait: a node holds it, so a short job's tail is not held for min_age_s after enqueue.
    """
    by_name = {node.name: node for node in nodes}
    held_by = {task_id: node.name for node in nodes for task_id in node.held}
    waiting = {
        queue_for_pool(b.pool)
        for b in batches
        if b.batch_id is not None and task_id_for(b.batch_id) in queued
    }
    free = Counter[str]()
    for node in nodes:
        for queue in node.queues:
            free[queue] += node.free
    chosen: list[OpenBatch] = []
    for batch in sorted(batches, key=lambda b: b.batch_id or 0):
        if batch.batch_id is None:
            continue
        queue = queue_for_pool(batch.pool)
        backup = backup_task_id_for(batch.batch_id)
        if queue in waiting or free[queue] <= 0 or backup in queued or backup in held_by:
            continue
        holder = by_name.get(held_by.get(task_id_for(batch.batch_id), ""))
        if holder is None:
            continue  # not running: the reconciler's resend handles a batch no one has
        if holder.free > 0 or free[queue] <= 0:
            continue  # every idle process is the holder's own
        if batch.sends > 1 and batch.sent_at is not None:
            if (now - as_utc(batch.sent_at)).total_seconds() < min_age_s:
                continue
        chosen.append(batch)
        free[queue] -= 1
    return chosen
