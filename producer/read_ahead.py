"""Read an iterator in chunks on a thread, one chunk ahead of its consumer (the scan's stat calls release
the GIL, so a folder is listed while the chunk before it is written to the ledger and sent)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Generic, TypeVar, cast

T = TypeVar("T")

_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class ChunksAhead(Generic[T]):
    """Iterate lists of up to `size` items of `items`, produced on a thread at most `depth` chunks ahead.

    An error of the iterator is raised by the consumer's next(); close() (or leaving a with block) stops
    the thread after the chunk it is on.
    """

    def __init__(self, items: Iterable[T], size: int, depth: int = 1) -> None:
        self._items = iter(items)
        self._size = size
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="detq-scan", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self) -> None:
        try:
            while chunk := list(islice(self._items, self._size)):
                if not self._put(chunk):
                    return
        except BaseException as error:  # handed to the consumer, raised there
            self._put(_Failure(error))
            return
        self._put(_END)

    def __iter__(self) -> Iterator[list[T]]:
        return self

    def __next__(self) -> list[T]:
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)  # a later next() ends too
            raise StopIteration
        if isinstance(item, _Failure):
            raise item.error
        return cast(list[T], item)

    def close(self) -> None:
        """Stop reading ahead; waits for the thread to finish its chunk."""
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> ChunksAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
