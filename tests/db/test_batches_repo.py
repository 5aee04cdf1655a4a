"""Batches over SQLite and PostgreSQL: regrouping a job's images into new batches, claiming a send."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.batches_repo import claim_send, create_batches, mark_sent, open_batches, regroup
from db.images_repo import NewImage, insert_images
from db.jobs_repo import create_job, finish_enqueue, get_or_create_model
from db.models import Batch, Image, utcnow

Factory = sessionmaker[Session]


def test_regroup_moves_each_group_into_a_new_batch_of_its_own(factory: Factory) -> None:
    # Given a job of five images in one batch, and another job's image
    with factory() as s, s.begin():
        model = get_or_create_model(s, sha256="e" * 64, path="/m.pt", size_bytes=1, meta={})
        job = create_job(s, model_id=model.id, roots=["/d"], pool="gpu", batch_size=5)
        (first,) = create_batches(s, job.id, [5], utcnow())
        ids = insert_images(s, job.id, [NewImage(f"/d/{i}.jpg", 1, 1.0, 0, batch_id=first) for i in range(5)])
        finish_enqueue(s, job.id, len(ids))
        other = create_job(s, model_id=model.id, roots=["/d"], pool="cpu", batch_size=1)
        (stranger,) = insert_images(s, other.id, [NewImage("/d/x.jpg", 1, 1.0, 0, batch_id=first)])
        job_id = job.id
    # When two images go alone and two together, and the job's groups name the other job's image too
    with factory() as s, s.begin():
        made = regroup(s, job_id, [[ids[1]], [ids[3]], [ids[0], ids[2], stranger]], utcnow())
    # Then three new batches, in the groups' order, hold them; the fifth image stays where it was, and
    # the other job's image is not moved
    assert len(made) == 3 and len(set(made)) == 3 and first not in made
    with factory() as s:
        where = dict(s.execute(sa.select(Image.id, Image.batch_id)).tuples().all())
        sizes = dict(s.execute(sa.select(Batch.id, Batch.size)).tuples().all())
        open_ = {b.batch_id: (b.pool, b.pending) for b in open_batches(s, job_id)}
    assert [where[i] for i in ids] == [made[2], made[0], made[2], made[1], first]
    assert where[stranger] == first
    assert [sizes[b] for b in made[:2]] == [1, 1]
    # And each is an open batch of the job's pool, not sent yet, for the reconciler to find
    assert open_ == {first: ("gpu", 1), made[0]: ("gpu", 1), made[1]: ("gpu", 1), made[2]: ("gpu", 2)}


def test_claim_send_is_won_once_by_readers_of_the_same_sends(factory: Factory) -> None:
    # Given a batch sent once, read by two passes before either sends its backup
    with factory() as s, s.begin():
        model = get_or_create_model(s, sha256="f" * 64, path="/m.pt", size_bytes=1, meta={})
        job = create_job(s, model_id=model.id, roots=["/d"], pool="cpu", batch_size=2)
        (batch_id,) = create_batches(s, job.id, [2], utcnow())
        insert_images(s, job.id, [NewImage(f"/d/{i}.jpg", 1, 1.0, 0, batch_id=batch_id) for i in range(2)])
        finish_enqueue(s, job.id, 2)
        mark_sent(s, [batch_id], utcnow())
    with factory() as s:
        (seen,) = open_batches(s, job.id)
    assert seen.sends == 1
    # When both claim its next send
    with factory() as s, s.begin():
        first = claim_send(s, batch_id, seen.sends, utcnow())
    with factory() as s, s.begin():
        second = claim_send(s, batch_id, seen.sends, utcnow())
    # Then only the first wins, and the batch counts one send more
    assert (first, second) == (True, False)
    with factory() as s:
        assert s.scalar(sa.select(Batch.sends).where(Batch.id == batch_id)) == 2
