"""Find tasks a node still holds that no pool process will finish, and give them back to the broker.

When a pool process dies, billiard normally fails its job with WorkerLostError and Celery requeues the
message (task_reject_on_worker_lost). Rarely, a job is dropped without that callback: the node then lists
the task as held forever, so neither the reconciler nor the broker sends it again, and its unacked
message keeps a prefetch slot. This watch finds such requests from the node's heartbeat thread and, once
a request has looked lost for longer than billiard's own wait, rejects it with requeue on the consumer's
thread. A second run of a batch writes nothing twice (the ledger's writes are idempotent).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from celery.worker import state as worker_state

log = logging.getLogger(__name__)


class PoolJob(Protocol):
    """What is read of billiard's ApplyResult for a request sent to the pool."""

    _accepted: bool
    _write_to: Any

    def ready(self) -> bool: ...


class HeldRequest(Protocol):
    """What is read of a Celery Request the node holds."""

    id: str
    worker_pid: int | None
    _apply_result: Callable[[], PoolJob | None] | None


@dataclass(frozen=True)
class Lost:
    """Why no pool process will finish a request; untaken: no process took it yet (maybe one is starting)."""

    reason: str
    untaken: bool = False


def lost_reason(request: HeldRequest, live_pids: set[int], queued: Collection[object] = ()) -> Lost | None:
    """Why no pool process will finish this request, or None while one still may (or it is not sent yet).

    queued: the pool's jobs waiting to be written to a process (a job put back after its process died).
    """
    if request.worker_pid is not None and request.worker_pid not in live_pids:
        return Lost(f"its pool process {request.worker_pid} exited")
    if request._apply_result is None:
        return None  # reserved, waiting for a free pool process
    job = request._apply_result()
    if job is None:
        return Lost("the pool dropped its job")
    if job.ready() or job._accepted or any(job is waiting for waiting in queued):
        return None
    writer = job._write_to
    if writer is not None and getattr(writer, "pid", None) not in live_pids:
        return Lost(f"it was written to pool process {getattr(writer, 'pid', '?')}, which exited")
    # Sent, and no process has said it started it: with acks_late, prefetch keeps a node from holding
    # more tasks than processes, so a process is free for it, unless a replacement is still starting.
    return Lost("no pool process has taken it", untaken=True)


class LostRequestWatch:
    """Held task ids for the node's heartbeat, minus those lost for longer than grace_s (then given back)."""

    def __init__(
        self,
        grace_s: float,
        untaken_grace_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace_s = grace_s
        self.untaken_grace_s = grace_s if untaken_grace_s is None else untaken_grace_s
        self._clock = clock
        self._since: dict[str, tuple[float, str]] = {}  # task id: since when it looks lost, and why
        self._given: dict[str, Any] = {}  # requests given back (once each), until the node forgets them
        self._controller: Any = None
        self._lock = threading.Lock()

    def attach(self, controller: Any) -> None:
        """The running WorkController: its pool says which processes live, its hub runs the give-back."""
        self._controller = controller

    def held(self) -> list[str]:
        """Task ids this node holds: received and waiting for a pool slot, or running (the node's
        heartbeat thread and its reconciler loop may both ask: one at a time)."""
        with self._lock:
            return self._held()

    def _held(self) -> list[str]:
        # dict.copy() runs in C under the GIL: the consumer thread cannot change the dict mid-copy.
        requests: dict[str, Any] = worker_state.requests.copy()
        pool = getattr(getattr(self._controller, "pool", None), "_pool", None)
        processes = getattr(pool, "_pool", None)
        if processes is None:
            return list(requests)  # not started, or not a prefork pool
        # Billiard removes a process from its list once it has reaped it; exitcode is not read here,
        # since reading it reaps, and that is the event loop's job. deque.copy() is atomic.
        live = {p.pid for p in list(processes) if p.pid is not None}
        outbound = getattr(pool, "outbound_buffer", None)
        queued = outbound.copy() if outbound is not None else ()
        lost = self.lost(requests.values(), live, self._clock(), queued)
        given = {r.id: r for r in lost if self._given.get(r.id) is r}  # given back, not gone yet
        for request in lost:
            if request.id not in given:
                log.warning(
                    "detq worker: task %s is lost (%s); giving it back to the queue",
                    request.id,
                    self._since[request.id][1],
                )
                self._give_back(request)
                given[request.id] = request
        self._given = given
        return [task_id for task_id in requests if task_id not in given]

    def lost(
        self,
        requests: Iterable[HeldRequest],
        live_pids: set[int],
        now: float,
        queued: Collection[object] = (),
    ) -> list[HeldRequest]:
        """Requests that have looked lost since at least grace_s ago."""
        found: list[HeldRequest] = []
        suspects: dict[str, tuple[float, str]] = {}
        for request in requests:
            lost = lost_reason(request, live_pids, queued)
            if lost is None:
                continue
            since = self._since.get(request.id, (now, ""))[0]
            suspects[request.id] = (since, lost.reason)
            if now - since >= (self.untaken_grace_s if lost.untaken else self.grace_s):
                found.append(request)
        self._since = suspects
        return found

    def _give_back(self, request: Any) -> None:
        # On the consumer's thread: its event loop, or between two polls of a transport without one.
        consumer = getattr(self._controller, "consumer", None)
        if consumer is not None:
            consumer.call_soon(_release, request)


def _release(request: Any) -> None:
    """On the event loop: requeue the message and forget the request (nothing if it finished meanwhile)."""
    held = worker_state.requests.get(request.id)
    if held is None or held is not request:
        return
    try:
        held.reject(requeue=True)
    except Exception:  # a closed channel: the broker or the reconciler delivers the batch again
        log.exception("detq worker: could not requeue lost task %s", held.id)
    worker_state.task_ready(held)
