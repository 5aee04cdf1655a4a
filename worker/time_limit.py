"""After a batch's soft time limit: each image it was on goes again alone, the others again as one batch.

A batch stopped at its soft time limit has written what it finished (worker.batch). Of the rest, the
images its detection was on when the limit fired (an awaited decode, the forward in hand) are the likely
cause: each gets a batch of its own, so it has a task's whole time to itself and, if it still does not
finish, fails alone (ALONE_REASON) instead of sinking its batch-mates. The images not started go again
as one batch. Their claims are given back first, the start not counted as an attempt (attempts count
processes that died). The new batches are in the ledger before they are sent, so one whose send fails is
sent by the reconciler, as any batch no message delivers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from db.batches_repo import mark_sent, regroup
from db.claims_repo import Claimable, release
from db.retry import in_transaction
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

ALONE_REASON = "processing this image alone exceeded the task's soft time limit"

BatchSender = Callable[[int, int, Sequence[int], str], None]
"""Publish a batch: job id, batch id, image ids, pool (dispatch.send.send_batch, bound to an app)."""


@dataclass(frozen=True)
class SentAgain:
    """How a timed-out batch's unfinished images were sent again: alone (one batch each), or together."""

    alone: list[int] = field(default_factory=list)
    together: list[int] = field(default_factory=list)

    @property
    def groups(self) -> list[list[int]]:
        """The new batches' image ids: one a lone image, then the others (if any)."""
        return [[i] for i in self.alone] + ([self.together] if self.together else [])


def split_unfinished(free: Sequence[Claimable], in_flight: Collection[int]) -> SentAgain:
    """The images in flight alone, the others together; nothing when none was in flight, as nothing
    then says which image held the batch up (and a batch sent again whole might never shrink)."""
    alone = [i.id for i in free if i.id in in_flight]
    if not alone:
        return SentAgain()
    return SentAgain(alone, [i.id for i in free if i.id not in in_flight])


def send_again(
    runtime: WorkerRuntime,
    job_id: int,
    pool: str,
    free: Sequence[Claimable],
    in_flight: Collection[int],
    claimed: Collection[int],
    send: BatchSender | None,
) -> SentAgain:
    """Regroup a timed-out batch's free images (split_unfinished) into new batches and send them to the
    pool's queue. claimed: the images the batch claimed (their claims given back). send None: the new
    batches wait in the ledger for the reconciler."""
    split = split_unfinished(free, in_flight)
    groups = split.groups
    if not groups:
        return split
    now = runtime.clock.now()
    mine = [i.id for i in free if i.id in claimed]

    def regroup_released(session: Session) -> list[int]:
        release(session, mine, me=runtime.worker_id)
        return regroup(session, job_id, groups, now)

    batch_ids = in_transaction(runtime.ledger.sessions, regroup_released)
    sent: list[int] = []
    if send is not None:
        try:
            for batch_id, group in zip(batch_ids, groups, strict=True):
                send(job_id, batch_id, group, pool)
                sent.append(batch_id)
        except Exception as exc:  # noqa: BLE001 - any broker failure: the reconciler sends the rest
            log.warning("job %d: %d batches left to the reconciler: %s", job_id, len(groups) - len(sent), exc)
        in_transaction(runtime.ledger.sessions, lambda s: mark_sent(s, sent, now))
    return split
