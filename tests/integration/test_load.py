"""Many writers on the embedded SQLite ledger: two workers over 2,000 images, two enqueues of one folder."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.faults import check_ledger, digests, write_images
from tests.integration.harness import DETQ, Deployment, running_worker
from tests.support import save_fixed_box_model

pytestmark = pytest.mark.integration


def test_two_workers_on_2000_images_never_see_database_is_locked(
    embedded: Deployment, tmp_path: Path
) -> None:
    # Given 2,000 small images and two workers of two processes each, heartbeats and all, on SQLite
    embedded.model = save_fixed_box_model(tmp_path / "box.pt", input_size=[32, 32])
    images = write_images(tmp_path / "in", 2000, size=(32, 24))
    before = digests(images)
    with (
        running_worker(embedded, concurrency=2, name="a") as a,
        running_worker(embedded, concurrency=2, name="b") as b,
    ):
        started = time.monotonic()
        status = embedded.run_json(
            "enqueue", str(tmp_path / "in"), "--batch-size", "16", "--wait", "--timeout", "600"
        )
        elapsed = time.monotonic() - started
        logs = a.log() + b.log()
    print(f"\n2 workers x 2000 images on SQLite: {elapsed:.1f} s, {2000 / elapsed:.0f} images/s")
    # Then every image is done once, and no write ever failed on a lock
    check = check_ledger(embedded, int(status["job_id"]), images, before)
    assert set(check.statuses.values()) == {"done"}
    assert "database is locked" not in logs
    assert "transient database error" not in logs


def test_two_enqueues_of_one_folder_at_once_each_process_every_image_once(
    embedded: Deployment, tmp_path: Path
) -> None:
    # Given a folder, and two producers enqueueing it at the same moment
    embedded.model = save_fixed_box_model(tmp_path / "box.pt", input_size=[32, 32])
    images = write_images(tmp_path / "in", 300, size=(32, 24))
    before = digests(images)
    command = [*DETQ, "enqueue", str(tmp_path / "in"), "--batch-size", "16", "--json"]
    producers = [
        subprocess.Popen(command, env=embedded.env(), stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    job_ids = [int(json.loads(p.communicate(timeout=120)[0])["job_id"]) for p in producers]
    assert all(p.returncode == 0 for p in producers)
    # When workers run both jobs
    with running_worker(embedded, concurrency=2):
        for job_id in job_ids:
            embedded.run("status", str(job_id), "--wait", "--timeout", "300")
    # Then each job has every image once, done, with its one box
    assert len(set(job_ids)) == 2
    for job_id in job_ids:
        check = check_ledger(embedded, job_id, images, before)
        assert set(check.statuses.values()) == {"done"}
