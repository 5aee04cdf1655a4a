"""Repository functions for claims: which pending images a process may start, and starting them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Update, bindparam, select, update
from sqlalchemy.orm import Session

from db.models import Image, Job, WorkerRecord, as_utc, status_as_read, table_of
from db.workers_repo import LOST, close_worker, set_current_batch, workers_by_id
from detq.vocabulary import ImageStatus

# Every batch runs these: built once, their compiled form cached by SQLAlchemy, they cost about half the
# CPU time of the same statements built at each call (docs/benchmarks.md: "A batch's statements built once").
_IMAGES, _JOBS = table_of(Image), table_of(Job)
_BATCH_IMAGES = (
    select(
        status_as_read(),
        _IMAGES.c.id,
        _IMAGES.c.job_id,
        _IMAGES.c.path,
        _IMAGES.c.root_index,
        _IMAGES.c.attempts,
        _IMAGES.c.batch_id,
        _IMAGES.c.claimed_by,
    )
    # By the ids alone, the job checked here: with the job in the WHERE clause, PostgreSQL with no
    # statistics on a fresh job combined the (job_id, status) index with the ids and read every pending row
    # of the job (db/images_repo.py, _LOCK_PENDING).
    .join(_JOBS, _JOBS.c.id == _IMAGES.c.job_id)  # a cancelled job's pending images read cancelled
    .where(_IMAGES.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(_IMAGES.c.id)
)


def _claim_statement(previous_claimer: bool, counted: bool = True) -> Update:
    """Claim the pending images of ids whose claim is still the one seen: none, or :previous's; counted:
    one more attempt (not where a live process's start is taken over: that start did not die)."""
    previous = (
        _IMAGES.c.claimed_by == bindparam("previous") if previous_claimer else _IMAGES.c.claimed_by.is_(None)
    )
    attempts = _IMAGES.c.attempts + 1 if counted else _IMAGES.c.attempts
    return (
        update(_IMAGES)
        .where(
            _IMAGES.c.id.in_(bindparam("ids", expanding=True)),
            _IMAGES.c.status == ImageStatus.PENDING.value,
            previous,
        )
        .values(claimed_by=bindparam("me"), claimed_at=bindparam("now"), attempts=attempts)
        .returning(_IMAGES.c.id)
    )


_CLAIM_UNCLAIMED = _claim_statement(previous_claimer=False)
_CLAIM_FROM = _claim_statement(previous_claimer=True)
_CLAIM_FROM_LIVE = _claim_statement(previous_claimer=True, counted=False)


@dataclass(frozen=True)
class Claimable:
    """A pending image no live process is working on: what a worker needs to start it."""

    id: int
    job_id: int
    path: str
    root_index: int
    attempts: int  # starts so far that no live process let go of: each that did not end in a result died
    batch_id: int | None
    claimed_by: int | None


@dataclass(frozen=True)
class ClaimView:
    """The pending images of a batch: those free to start, and how many a live process is running."""

    free: list[Claimable]
    busy: int
    found: int = 0  # the job's images among the ids asked for, whatever their status
    held: list[Claimable] = field(default_factory=list)  # the busy ones: a live process is on them
    # Live processes (this one included) whose claims on free images they let go of: their batch gave up
    # (the ledger or a disk stayed away past the retries) and the process lives on. Such a start did not
    # die, so it is no death of the image's.
    let_go: frozenset[int] = frozenset()

    def deaths(self, image: Claimable) -> int:
        """How many processes died while on this free image: its attempts, less a start let go of."""
        return (
            image.attempts - 1 if image.claimed_by in self.let_go and image.attempts > 0 else image.attempts
        )


def claimable_images(
    session: Session,
    job_id: int,
    image_ids: Sequence[int],
    *,
    me: int,
    now: datetime,
    seen_since: datetime,
    still_running: Callable[[WorkerRecord], bool],
) -> ClaimView:
    """Pending images of job_id among image_ids, split into free and busy; dead claimers are closed.

    A claim holds while its process is open, seen since seen_since, running that image's batch right now
    and, by `still_running`, not known dead (a process on this host whose pid is gone). Anything else is
    a claim left by a death, a kill at the hard time limit, or a batch that gave up: free again.
    """
    if not image_ids:
        return ClaimView(free=[], busy=0)
    # The job's images among the ids, whatever their status (how many were found), in one statement.
    rows = [r for r in session.execute(_BATCH_IMAGES, {"ids": list(image_ids)}).all() if r.job_id == job_id]
    found = len(rows)
    images = [Claimable(*row[1:]) for row in rows if row[0] == ImageStatus.PENDING.value]
    claimers = workers_by_id(session, sorted({i.claimed_by for i in images if i.claimed_by is not None}))
    dead = [w.id for w in claimers.values() if w.stopped_at is None and not still_running(w)]
    close_worker(session, dead, now, LOST)
    free: list[Claimable] = []
    held: list[Claimable] = []
    let_go: set[int] = set()
    for image in images:
        claimer = claimers.get(image.claimed_by) if image.claimed_by is not None else None
        alive = claimer is not None and (
            claimer.id == me
            or (
                claimer.id not in dead
                and claimer.stopped_at is None
                and as_utc(claimer.last_seen_at) >= seen_since
            )
        )
        holds = (
            alive
            and claimer is not None
            and claimer.id != me
            and claimer.current_batch_id is not None
            and claimer.current_batch_id == image.batch_id
        )
        if holds:
            held.append(image)
            continue
        free.append(image)
        if alive and claimer is not None:
            let_go.add(claimer.id)
    return ClaimView(free=free, busy=len(held), found=found, held=held, let_go=frozenset(let_go))


def claim(
    session: Session,
    images: Sequence[Claimable],
    *,
    me: int,
    batch_id: int | None,
    now: datetime,
    let_go: frozenset[int] = frozenset(),
) -> list[int]:
    """Start these images: claimed by me, one more attempt each (but where a live process let go of its
    claim, ClaimView.let_go: its start did not die); returns the ids this process won.

    The UPDATE only takes an image whose claim is the one claimable_images saw, so of two processes
    racing on a redelivered batch each image goes to one of them.
    """
    if not images:
        return []
    won: list[int] = []
    for claimed_by in sorted({i.claimed_by for i in images}, key=lambda c: -1 if c is None else c):
        ids = [i.id for i in images if i.claimed_by == claimed_by]
        params = {"ids": ids, "me": me, "now": now}
        if claimed_by is None:
            won.extend(session.scalars(_CLAIM_UNCLAIMED, params))
        else:
            statement = _CLAIM_FROM_LIVE if claimed_by in let_go else _CLAIM_FROM
            won.extend(session.scalars(statement, {**params, "previous": claimed_by}))
    set_current_batch(session, me, batch_id, now)
    return sorted(won)


def release(session: Session, image_ids: Sequence[int], *, me: int) -> list[int]:
    """Give back claims this process took and ran to no result, its process alive (a batch stopped at its
    soft time limit): unclaimed, that start not counted as an attempt. Returns the ids released."""
    if not image_ids:
        return []
    return sorted(
        session.scalars(
            update(Image)
            .where(
                Image.id.in_(list(image_ids)),
                Image.claimed_by == me,
                Image.status == ImageStatus.PENDING.value,
                Image.attempts > 0,
            )
            .values(claimed_by=None, claimed_at=None, attempts=Image.attempts - 1)
            .returning(Image.id)
        )
    )
