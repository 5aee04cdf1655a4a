"""Tests for the watch that gives back tasks a node holds but no pool process will finish."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.lost_requests import Lost, LostRequestWatch, PoolJob, lost_reason


@dataclass
class _Process:
    pid: int


@dataclass
class _Job:
    """The fields of billiard's ApplyResult the watch reads."""

    _accepted: bool = False
    _write_to: _Process | None = None
    done: bool = False

    def ready(self) -> bool:
        return self.done


@dataclass
class _Request:
    id: str
    worker_pid: int | None = None
    job: _Job | None = None
    _apply_result: Callable[[], PoolJob | None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.job is not None:
            self._apply_result = weakref.ref(self.job)


LIVE = {101, 102}


def test_a_request_waiting_for_a_pool_slot_is_not_lost() -> None:
    assert lost_reason(_Request("t1"), LIVE) is None


def test_a_request_running_in_a_live_process_is_not_lost() -> None:
    job = _Job(_accepted=True, _write_to=_Process(101))
    assert lost_reason(_Request("t1", worker_pid=101, job=job), LIVE) is None


def test_a_request_accepted_by_a_process_that_exited_is_lost() -> None:
    job = _Job(_accepted=True, _write_to=_Process(99))
    assert lost_reason(_Request("t1", worker_pid=99, job=job), LIVE) == Lost("its pool process 99 exited")


def test_a_request_whose_job_the_pool_dropped_is_lost() -> None:
    request = _Request("t1", job=_Job(_write_to=_Process(101)))
    request.job = None  # the pool's cache let go of it: only the weak reference is left
    gc.collect()
    assert lost_reason(request, LIVE) == Lost("the pool dropped its job")


def test_a_job_written_to_an_exited_process_and_never_accepted_is_lost() -> None:
    job = _Job(_write_to=_Process(99))
    reason = lost_reason(_Request("t1", job=job), LIVE)
    assert reason == Lost("it was written to pool process 99, which exited")
    assert lost_reason(_Request("t1", job=job), LIVE, queued=[job]) is None  # put back by the pool
    job._write_to = _Process(102)  # and written to the replacement
    job._accepted = True
    assert lost_reason(_Request("t1", job=job), LIVE) is None


def test_a_job_no_process_took_is_lost_only_after_the_longer_grace() -> None:
    # The pool whose processes share one queue: a process that read the job and died before it said so.
    job = _Job()
    request = _Request("t1", job=job)
    assert lost_reason(request, LIVE) == Lost("no pool process has taken it", untaken=True)
    watch = LostRequestWatch(grace_s=10, untaken_grace_s=40)
    assert watch.lost([request], LIVE, now=100.0) == []
    assert watch.lost([request], LIVE, now=130.0) == []
    assert watch.lost([request], LIVE, now=140.0) == [request]


def test_a_lost_request_is_given_back_only_after_the_grace_period() -> None:
    watch = LostRequestWatch(grace_s=10)
    job = _Job(_accepted=True, _write_to=_Process(99))
    lost = _Request("lost", worker_pid=99, job=job)
    fine = _Request("fine", worker_pid=101, job=_Job(_accepted=True, _write_to=_Process(101)))
    assert watch.lost([lost, fine], LIVE, now=100.0) == []
    assert watch.lost([lost, fine], LIVE, now=109.0) == []
    assert watch.lost([lost, fine], LIVE, now=110.0) == [lost]


def test_a_request_that_recovers_starts_its_grace_period_again() -> None:
    # Billiard fails the job itself and the message comes back: a transient state is never given back.
    watch = LostRequestWatch(grace_s=10)
    job = _Job(_accepted=True, _write_to=_Process(99))
    request = _Request("t1", worker_pid=99, job=job)
    assert watch.lost([request], LIVE, now=100.0) == []
    request.worker_pid, job._write_to = 101, _Process(101)
    assert watch.lost([request], LIVE, now=105.0) == []
    request.worker_pid, job._write_to = 99, _Process(99)
    assert watch.lost([request], LIVE, now=111.0) == []
    assert watch.lost([request], LIVE, now=121.0) == [request]


def test_without_a_running_pool_every_request_is_held() -> None:
    from celery.worker import state as worker_state

    request = _Request("detq-batch-1", worker_pid=99)
    worker_state.requests[request.id] = request
    try:
        assert LostRequestWatch(grace_s=0).held() == ["detq-batch-1"]
    finally:
        worker_state.requests.pop(request.id, None)


@dataclass(eq=False)
class _Rejectable(_Request):
    __hash__ = object.__hash__  # by identity, as Celery's requests are
    rejected: list[bool] = field(default_factory=list)

    def reject(self, requeue: bool = False) -> None:
        self.rejected.append(requeue)


class _Hub:
    def __init__(self) -> None:
        self.calls: list[tuple[Callable[..., None], tuple[object, ...]]] = []

    def call_soon(self, callback: Callable[..., None], *args: object) -> None:
        self.calls.append((callback, args))


@dataclass
class _Controller:
    """The parts of Celery's WorkController the watch reads: pool._pool._pool and consumer.call_soon."""

    consumer: _Hub
    pool: object


def test_a_node_stops_listing_a_lost_task_and_requeues_it_on_its_event_loop() -> None:
    from types import SimpleNamespace

    from celery.worker import state as worker_state

    clock = iter([100.0, 131.0, 131.5])
    watch = LostRequestWatch(grace_s=30, clock=lambda: next(clock))
    hub = _Hub()
    processes = [SimpleNamespace(pid=101)]
    watch.attach(_Controller(hub, SimpleNamespace(_pool=SimpleNamespace(_pool=processes))))
    job = _Job(_accepted=True, _write_to=_Process(99))
    lost = _Rejectable("detq-batch-7", worker_pid=99, job=job)
    running = _Rejectable("detq-batch-8", worker_pid=101, job=_Job(_accepted=True, _write_to=_Process(101)))
    worker_state.requests.update({lost.id: lost, running.id: running})
    try:
        assert sorted(watch.held()) == ["detq-batch-7", "detq-batch-8"]
        assert watch.held() == ["detq-batch-8"]
        assert watch.held() == ["detq-batch-8"]  # still not listed, and not given back twice
        [(callback, args)] = hub.calls
        callback(*args)  # what the event loop runs
        assert lost.rejected == [True]
        assert lost.id not in worker_state.requests
        callback(*args)  # a second give-back of the same request does nothing
        assert lost.rejected == [True]
        assert running.rejected == []
    finally:
        worker_state.requests.pop(lost.id, None)
        worker_state.requests.pop(running.id, None)
