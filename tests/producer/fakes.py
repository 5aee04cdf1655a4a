"""A stand-in Celery app that records sent tasks instead of talking to a broker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class RecordingApp:
    """Has the two methods producers use: producer_or_acquire and send_task."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], str]] = []

    @contextmanager
    def producer_or_acquire(self) -> Iterator[None]:
        yield None

    def send_task(self, name: str, *, args: list[Any], queue: str, **_: Any) -> None:
        self.sent.append((name, args, queue))
