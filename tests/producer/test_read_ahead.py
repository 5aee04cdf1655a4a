"""Tests for reading an iterator in chunks ahead of its consumer."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from producer.read_ahead import ChunksAhead


def test_chunks_come_in_order_and_whole() -> None:
    with ChunksAhead(range(10), size=4) as chunks:
        assert list(chunks) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        assert list(chunks) == []  # ended stays ended


def test_an_error_of_the_iterator_reaches_the_consumer_after_the_chunks_before_it() -> None:
    def items() -> Iterator[int]:
        yield from range(4)
        raise OSError("folder vanished")

    with ChunksAhead(items(), size=2) as chunks:
        assert next(chunks) == [0, 1]
        assert next(chunks) == [2, 3]
        with pytest.raises(OSError, match="folder vanished"):
            next(chunks)


def test_the_reader_stays_one_chunk_ahead_and_stops_when_closed() -> None:
    read: list[int] = []
    gate = threading.Event()

    def items() -> Iterator[int]:
        for i in range(1000):
            read.append(i)
            yield i

    chunks = ChunksAhead(items(), size=10, depth=1)
    assert next(chunks) == list(range(10))
    gate.wait(0.3)  # time to run ahead as far as it may
    assert len(read) <= 31  # the chunk taken, one queued, one being filled (and the next item peeked)
    chunks.close()
    stopped_at = len(read)
    gate.wait(0.2)
    assert len(read) == stopped_at < 1000
