"""The bench's deployments: the warm-up folder, and a timed job split at its first claimed image."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import update

from bench.deployments import JobRun, first_claim, warm_up_count, warm_up_folder
from db.images_repo import NewImage, insert_images
from db.jobs_repo import create_job, get_or_create_model
from db.ledger import open_ledger
from db.models import Image
from detq.settings import Settings
from detq.vocabulary import JobPool
from producer.taper import tapered_sizes


def test_the_warm_up_folder_links_the_first_photos_so_each_process_runs_a_full_batch(tmp_path: Path) -> None:
    photos_dir = tmp_path / "photos"
    photos_dir.mkdir()
    photos = []
    for i in range(60):
        photo = photos_dir / f"p{i:02d}.jpg"
        photo.write_bytes(bytes([i]))
        photos.append(photo)
    folder = warm_up_folder(photos, tmp_path / "photos-warm-up", processes=2, batch_size=8)
    linked = sorted(folder.iterdir())
    assert [p.name for p in linked] == [p.name for p in photos[:48]]
    assert all(os.path.samefile(link, photos_dir / link.name) for link in linked)
    # Its job's batches taper at the end, but the first one for each process is full.
    assert tapered_sizes(len(linked), 8, 2)[:2] == [8, 8]
    # Asked again (one folder serves every runner of a workload), it is left as it is.
    assert sorted(warm_up_folder(photos, folder, processes=2, batch_size=8).iterdir()) == linked


def test_the_warm_up_gives_every_process_a_full_batch_at_any_core_count() -> None:
    # The taper decides which batches are full: the first one of each process must be, on any machine
    for processes in range(1, 17):
        for batch_size in (1, 4, 8, 16, 32):
            sizes = tapered_sizes(warm_up_count(processes, batch_size), batch_size, processes)
            assert sizes[:processes] == [batch_size] * processes, (processes, batch_size, sizes)


def test_a_job_run_splits_at_its_first_claim() -> None:
    run = JobRun(images=240, start_up_s=0.6, seconds=8.6)
    assert run.rate == 240 / 8.6
    assert run.rate_after_first_claim == 30.0  # 240 images in the 8 s after the first claim


def test_first_claim_is_the_earliest_claim_of_the_job_in_the_ledger(tmp_path: Path) -> None:
    # Given a job of three images, two of them claimed a second apart, and another job claimed earlier
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    ledger = open_ledger(settings)
    first = datetime(2026, 12, 2, 14, 0, 0, tzinfo=UTC)
    try:
        with ledger.sessions() as session, session.begin():
            model = get_or_create_model(session, sha256="0" * 64, path="m.pt", size_bytes=1, meta={})
            jobs = [create_job(session, model_id=model.id, roots=["/r"], pool=JobPool.CPU, batch_size=8)]
            jobs.append(create_job(session, model_id=model.id, roots=["/r"], pool=JobPool.CPU, batch_size=8))
            ids = insert_images(session, jobs[0].id, [NewImage(f"/r/{i}.jpg", 1, 0.0) for i in range(3)])
            other = insert_images(session, jobs[1].id, [NewImage("/r/x.jpg", 1, 0.0)])
            session.execute(update(Image).where(Image.id == ids[1]).values(claimed_at=first))
            session.execute(
                update(Image).where(Image.id == ids[2]).values(claimed_at=first + timedelta(seconds=1))
            )
            session.execute(
                update(Image).where(Image.id == other[0]).values(claimed_at=first - timedelta(hours=1))
            )
    finally:
        ledger.close()
    # Then the job's first claim is the earlier of its two, read back in UTC
    assert first_claim(settings.resolved_database_url, jobs[0].id) == first
