"""Send one chunk's batch messages on a thread while the producer scans and records the next chunk."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from types import TracebackType

from celery import Celery
from kombu.exceptions import BatchPublishError  # type: ignore[attr-defined]  # (stubs predate kombu 5.7)

from dispatch.send import declare_queue, publish_batch, send_batch

log = logging.getLogger(__name__)

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
        try:
            self._publish(batches, pipelined=True)
        except BatchPublishError as exc:
            # Some of the chunk's messages may have arrived: sending them again is safe, as the ledger runs
            # a batch's images once however many copies are queued (the first result is the one written).
            log.warning(
                "detq enqueue: a pipelined send of %d batches failed (%s); sending them one by one",
                len(batches),
                exc.__cause__ or exc,
            )
            self._publish(batches, pipelined=False)
        self.images += sum(len(ids) for _, ids in batches)
        self.batches += len(batches)
        return [batch_id for batch_id, _ in batches]

    def _publish(self, batches: Batches, *, pipelined: bool) -> None:
        """One chunk on one producer: pipelined where the transport can (one round trip on Redis, no retry
        but the caller's), else each message on its own with Celery's publish retry policy."""
        with self.app.producer_or_acquire() as producer:
            with publish_batch(producer) if pipelined else nullcontext():
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

    def __enter__(self) -> ChunkSender:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
