"""map_ahead: results in order, never more than `ahead` submitted and not yet taken, the rest cancelled."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from worker.pipeline import map_ahead


class CountingPool(ThreadPoolExecutor):
    """A real thread pool that counts what it was given and keeps the futures it handed out."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.futures: list[Future[Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future


def test_results_come_in_order_with_at_most_ahead_submitted_beyond_those_taken() -> None:
    with CountingPool(3) as pool:
        taken = 0
        for value in map_ahead(pool, lambda x: x * x, range(50), ahead=4):
            assert value == taken * taken
            taken += 1
            # What the caller holds plus what is queued for it: at most `ahead` past what it took.
            assert len(pool.futures) - taken <= 4
        assert taken == 50 and len(pool.futures) == 50


def test_the_first_result_is_waited_for_with_the_window_full_not_the_whole_input() -> None:
    # Given a slow first item, when the caller waits for it, then only `ahead` items were handed to the
    # pool (Executor.map would have submitted all 100).
    release = threading.Event()

    def work(x: int) -> int:
        if x == 0:
            release.wait(5)
        return x

    with CountingPool(2) as pool:
        results = map_ahead(pool, work, range(100), ahead=3)
        waiter = threading.Thread(target=lambda: next(results))
        waiter.start()
        waiter.join(0.2)
        assert len(pool.futures) == 3
        release.set()
        waiter.join(5)
        assert list(results) == list(range(1, 100))


def test_a_caller_that_stops_early_cancels_the_items_not_started() -> None:
    gate = threading.Event()

    def work(x: int) -> int:
        if x >= 1:
            gate.wait(5)  # the one thread stays busy: what is queued behind it has not started
        return x

    with CountingPool(1) as pool:
        results = map_ahead(pool, work, range(20), ahead=5)
        assert next(results) == 0
        results.close()
        gate.set()
        assert len(pool.futures) == 6  # 5 ahead, and one more submitted as the first was taken
        assert sum(f.cancelled() for f in pool.futures) >= 4  # all but the one running


def test_an_error_in_one_item_reaches_the_caller_at_its_turn() -> None:
    def work(x: int) -> int:
        if x == 2:
            raise ValueError("bad item")
        return x

    with CountingPool(2) as pool:
        results = map_ahead(pool, work, range(6), ahead=2)
        assert [next(results), next(results)] == [0, 1]
        with pytest.raises(ValueError, match="bad item"):
            next(results)


def test_an_ahead_below_one_still_runs_one_at_a_time() -> None:
    with CountingPool(2) as pool:
        assert list(map_ahead(pool, str, [1, 2, 3], ahead=0)) == ["1", "2", "3"]
