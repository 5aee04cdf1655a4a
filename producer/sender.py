"""Send one chunk's batch messages on a thread while the producer scans and records the next chunk."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from celery import Celery

from dispatch.send import declare_queue, publish_batch, send_batch

Batches = Sequence[tuple[int, list[int]]]  # (batch id, image ids)


class ChunkSender:
    """At most one chunk in flight: submit() waits for the previous one, so memory holds two chunks.

    A broker error of a send is raised by the next submit() or by finish(), on the caller's thread.
    """

    def __init__(self, app: Celery, job_id: int, pool: str) -> None:
        self.app = app
        self.job_id = job_id
        self.pool = pool
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="detq-send")
        self._in_flight: Future[list[int]] | None = None
        self.images = 0  # sent
        self.batches = 0

    def submit(self, batches: Batches) -> list[int]:
        """Start sending these batches; the ids of the batches sent since the last call."""
        done = self.finish()
        if batches:
            self._in_flight = self._executor.submit(self._send, list(batches))
        return done

    def finish(self) -> list[int]:
        """Wait for the chunk in flight; the ids of its batches (raises what its send raised)."""
        if self._in_flight is None:
            return []
        future, self._in_flight = self._in_flight, None
        return future.result()

    def _send(self, batches: Batches) -> list[int]:
        with self.app.producer_or_acquire() as producer, publish_batch(producer):
            declare_queue(self.app, producer, self.pool)
            for batch_id, ids in batches:
                send_batch(
                    self.app,
                    job_id=self.job_id,
                    batch_id=batch_id,
                    image_ids=ids,
                    pool=self.pool,
                    producer=producer,
                    declare=False,
                )
                self.images += len(ids)
                self.batches += 1
        return [batch_id for batch_id, _ in batches]

    def __enter__(self) -> ChunkSender:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
