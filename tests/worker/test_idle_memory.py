"""Idle trim: the free heap given back once per idle spell, never while a batch runs or between batches."""

from __future__ import annotations

import threading

from worker.heartbeat import ProcessStats
from worker.idle_memory import IdleTrim


def _trim(stats: ProcessStats, calls: list[int], idle_s: float = 30.0, check_s: float = 5.0) -> IdleTrim:
    return IdleTrim(stats.idle_since, lambda: calls.append(1), idle_s=idle_s, check_s=check_s)


def test_nothing_is_given_back_before_the_first_batch_or_while_one_runs() -> None:
    stats, calls = ProcessStats(), []
    trim = _trim(stats, calls)
    assert not trim.tick(1000.0)  # no batch yet: the heap holds only the model's warm-up
    stats.current_batch_id = 7
    stats.add(8, now=100.0)  # an earlier batch ended ...
    assert not trim.tick(1000.0)  # ... but one runs now
    assert calls == []


def test_the_heap_is_given_back_once_an_idle_spell_and_not_between_a_jobs_batches() -> None:
    stats, calls = ProcessStats(), []
    trim = _trim(stats, calls)
    stats.add(8, now=100.0)
    assert not trim.tick(100.05)  # the next batch of the job is tens of ms away
    assert not trim.tick(129.9)
    assert trim.tick(130.0)
    assert not trim.tick(200.0)  # once in this spell
    stats.add(8, now=300.0)  # worked again, then idled again
    assert not trim.tick(310.0)
    assert trim.tick(331.0)
    assert calls == [1, 1]


def test_the_thread_gives_back_when_idle_and_stops() -> None:
    stats = ProcessStats()
    stats.add(1, now=0.0)  # long ago on the monotonic clock
    given = threading.Event()
    trim = IdleTrim(stats.idle_since, given.set, idle_s=0.0, check_s=0.01)
    trim.start()
    try:
        assert given.wait(5.0)
    finally:
        trim.stop()
    assert not any(thread.name == "detq-idle-trim" for thread in threading.enumerate())
