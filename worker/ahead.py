"""A function mapped over items on a thread pool, at most a bounded number of results ahead of their use."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from itertools import islice
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_ahead(executor: Executor, fn: Callable[[T], R], items: Iterable[T], ahead: int) -> Iterator[R]:
    """fn over items on executor, results in order, with at most `ahead` of them submitted and not yet
    taken by the caller (Executor.map submits every item at once).

    A batch's decoded photos are such results: taken at the model's pace, read ahead without a bound they
    pile up in memory wherever decoding outruns the model (full-size 12 MP photos for a torchvision model,
    36 MB each). A caller that stops early (an exception, a closed generator) cancels those not started.
    """
    pending: deque[Future[R]] = deque()
    source = iter(items)
    try:
        pending.extend(executor.submit(fn, item) for item in islice(source, max(1, ahead)))
        while pending:
            result = pending.popleft().result()
            # One more in flight before this result is handed over.
            pending.extend(executor.submit(fn, item) for item in islice(source, 1))
            yield result
    finally:
        for future in pending:
            future.cancel()
