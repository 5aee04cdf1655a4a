"""Claims and heartbeats over SQLite and PostgreSQL: who may start an image, and what counts as dead."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.claims_repo import claim, claimable_images, release
from db.images_repo import NewImage, insert_images
from db.jobs_repo import create_job, get_or_create_model
from db.models import Image, WorkerRecord, utcnow
from db.workers_repo import (
    LOST,
    ROLE_PROCESS,
    Beat,
    WorkerIdentity,
    beat,
    close_lost_workers,
    close_worker,
    register_worker,
)

Factory = sessionmaker[Session]
TIMEOUT = timedelta(seconds=30)
FreeAndBusy = tuple[list[int], int]


def _worker(factory: Factory, pid: int, host_key: str = "other-host/1") -> int:
    identity = WorkerIdentity(ROLE_PROCESS, "cpu@h", "h", host_key, pid, "cpu", "cpu", "f" * 64)
    with factory() as s, s.begin():
        return register_worker(s, identity, utcnow())


def _job(factory: Factory, n: int) -> tuple[int, list[int]]:
    with factory() as s, s.begin():
        model = get_or_create_model(s, sha256="f" * 64, path="/m.pt", size_bytes=1, meta={})
        job = create_job(s, model_id=model.id, roots=["/d"], pool="cpu", batch_size=n)
        ids = insert_images(s, job.id, [NewImage(f"/d/{i}.jpg", 1, 1.0, 0, batch_id=7) for i in range(n)])
        return job.id, ids


def _view(
    factory: Factory, job_id: int, ids: list[int], me: int, alive: bool = True
) -> tuple[list[int], int]:
    now = utcnow()
    with factory() as s, s.begin():
        view = claimable_images(
            s, job_id, ids, me=me, now=now, seen_since=now - TIMEOUT, still_running=lambda _: alive
        )
    return [i.id for i in view.free], view.busy


def _claim(factory: Factory, job_id: int, ids: list[int], me: int) -> list[int]:
    now = utcnow()
    with factory() as s, s.begin():
        view = claimable_images(
            s, job_id, ids, me=me, now=now, seen_since=now - TIMEOUT, still_running=lambda _: True
        )
        return claim(s, view.free, me=me, batch_id=7, now=now, let_go=view.let_go)


def _attempts(factory: Factory, ids: list[int]) -> list[int]:
    with factory() as s:
        return list(s.scalars(sa.select(Image.attempts).where(Image.id.in_(ids)).order_by(Image.id)))


def test_a_claim_counts_a_start_and_keeps_others_off_while_its_holder_runs_the_batch(
    factory: Factory,
) -> None:
    job_id, ids = _job(factory, 3)
    first, second = _worker(factory, 101), _worker(factory, 102)
    # Given the first process claimed the batch
    assert _claim(factory, job_id, ids, first) == ids
    assert _attempts(factory, ids) == [1, 1, 1]
    # Then another process finds every image busy, and cannot claim them
    assert _view(factory, job_id, ids, second) == ([], 3)
    assert _claim(factory, job_id, ids, second) == []
    assert _attempts(factory, ids) == [1, 1, 1]


def test_claims_of_a_closed_stale_dead_or_idle_process_are_free_again(factory: Factory) -> None:
    job_id, ids = _job(factory, 2)
    holder, other = _worker(factory, 201), _worker(factory, 202)
    _claim(factory, job_id, ids, holder)
    # When the holder moved on to another batch, its claims no longer hold
    with factory() as s, s.begin():
        beat(s, holder, utcnow(), Beat(current_batch_id=8))
    assert _view(factory, job_id, ids, other) == (ids, 0)
    with factory() as s, s.begin():
        beat(s, holder, utcnow(), Beat(current_batch_id=7))
    assert _view(factory, job_id, ids, other) == ([], 2)
    # When its pid is known gone (same host), it is closed as lost and its claims are free
    assert _view(factory, job_id, ids, other, alive=False) == (ids, 0)
    with factory() as s:
        record = s.get_one(WorkerRecord, holder)
        assert (record.stop_reason, record.stopped_at is not None) == (LOST, True)
    # And a second start counts a second attempt
    assert _claim(factory, job_id, ids, other) == ids
    assert _attempts(factory, ids) == [2, 2]


def test_a_claim_a_live_process_let_go_of_is_taken_over_without_counting_a_death(factory: Factory) -> None:
    # Given images claimed by a process whose batch then gave up (the ledger stayed away past the retries)
    # and which lives on, beating with no batch in hand
    job_id, ids = _job(factory, 2)
    gave_up, other = _worker(factory, 601), _worker(factory, 602)
    _claim(factory, job_id, ids, gave_up)
    with factory() as s, s.begin():
        beat(s, gave_up, utcnow(), Beat(current_batch_id=None))
    # When another process looks at the batch again, Then the images are free and none died on them
    now = utcnow()
    with factory() as s:
        view = claimable_images(
            s, job_id, ids, me=other, now=now, seen_since=now - TIMEOUT, still_running=lambda _: True
        )
    assert [i.id for i in view.free] == ids and view.let_go == {gave_up}
    assert [view.deaths(i) for i in view.free] == [0, 0]
    # And its claim keeps the one attempt: the start it takes over did not die
    assert _claim(factory, job_id, ids, other) == ids
    assert _attempts(factory, ids) == [1, 1]
    # And so when the process that let go finds them again itself
    with factory() as s, s.begin():
        s.execute(sa.update(Image).where(Image.id.in_(ids)).values(claimed_by=gave_up))
    assert _claim(factory, job_id, ids, gave_up) == ids
    assert _attempts(factory, ids) == [1, 1]


def test_a_silent_worker_is_closed_as_lost_and_a_beat_brings_it_back(factory: Factory) -> None:
    silent, lively = _worker(factory, 301), _worker(factory, 302)
    later = utcnow() + timedelta(seconds=60)
    with factory() as s, s.begin():
        beat(s, lively, later, Beat())
    with factory() as s, s.begin():
        assert close_lost_workers(s, later - TIMEOUT, later) == [silent]
    with factory() as s, s.begin():
        beat(s, silent, later, Beat())
    with factory() as s:
        assert s.get_one(WorkerRecord, silent).stopped_at is None


def test_a_clean_exit_closes_the_row_once(factory: Factory) -> None:
    worker = _worker(factory, 401)
    with factory() as s, s.begin():
        assert close_worker(s, [worker], utcnow()) == 1
    with factory() as s, s.begin():
        assert close_worker(s, [worker], utcnow()) == 0


def test_found_counts_the_jobs_images_among_the_ids_whatever_their_status(factory: Factory) -> None:
    # Given a job of three images, one of them finished, and another job's image
    job_id, ids = _job(factory, 3)
    _, others = _job(factory, 1)
    with factory() as s, s.begin():
        s.execute(sa.update(Image).where(Image.id == ids[0]).values(status="done"))
    # When a message names all of them and an id of no image
    now = utcnow()
    with factory() as s:
        view = claimable_images(
            s, job_id, [*ids, *others, 10**9], me=0, now=now, seen_since=now - TIMEOUT, still_running=bool
        )
    # Then the job's three are found, and only its two pending ones are free to start
    assert view.found == 3
    assert [i.id for i in view.free] == ids[1:] and view.busy == 0


def test_release_gives_back_only_this_processs_unfinished_claims_uncounted(factory: Factory) -> None:
    # Given four images claimed by this process, one of them since finished, and one claimed by another
    job_id, ids = _job(factory, 5)
    me, other = _worker(factory, 501), _worker(factory, 502)
    _claim(factory, job_id, ids[:4], me)
    _claim(factory, job_id, ids[4:], other)
    with factory() as s, s.begin():
        s.execute(sa.update(Image).where(Image.id == ids[0]).values(status="done"))
    # When this process releases all five (a batch stopped at its soft time limit)
    with factory() as s, s.begin():
        released = release(s, ids, me=me)
    # Then only its three pending ones are released: unclaimed, their start not counted
    assert released == ids[1:4]
    assert _attempts(factory, ids) == [1, 0, 0, 0, 1]
    with factory() as s:
        claimers = list(s.scalars(sa.select(Image.claimed_by).where(Image.id.in_(ids)).order_by(Image.id)))
    assert claimers == [me, None, None, None, other]
    # And a released image is free to anyone, its next start its first
    assert _view(factory, job_id, ids[1:4], other) == (ids[1:4], 0)
    assert _claim(factory, job_id, ids[1:4], other) == ids[1:4]
    assert _attempts(factory, ids[1:4]) == [1, 1, 1]
