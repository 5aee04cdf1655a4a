"""The read commands on the embedded ledger hold no worker back: an export piped into a reader that stops
reading (a pager) keeps its read open, and workers write meanwhile without waiting."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from db.engine import make_engine, make_session_factory
from db.images_repo import DetectionRow, ImageResult, NewImage, finalise_results, insert_images
from db.jobs_repo import create_job, finish_enqueue, get_or_create_model
from detq.settings import Settings
from detq.vocabulary import ImageStatus
from tests.ledger_support import migrate

ROOT = Path(__file__).resolve().parents[3]


def _finished_job(url: str, images: int) -> tuple[int, list[int]]:
    """A finished job of `images` images with two boxes each, and one more job's pending image ids."""
    box = DetectionRow(label_id=2, label="dog", score=0.7, x1=1, y1=2, x2=3, y2=4)
    engine = make_engine(url)
    try:
        factory = make_session_factory(engine)
        with factory() as session, session.begin():
            model = get_or_create_model(session, sha256="c" * 64, path="/m.pt", size_bytes=1, meta={})
            job = create_job(session, model_id=model.id, roots=["/d"], pool="cpu", batch_size=8)
            new = [NewImage(path=f"/d/{i:05d}.jpg", size_bytes=1, mtime=1.0) for i in range(images)]
            ids = insert_images(session, job.id, new)
            finish_enqueue(session, job.id, images)
            done = [ImageResult(image_id=i, status=ImageStatus.DONE, detections=(box, box)) for i in ids]
            finalise_results(session, job.id, model.id, done, worker="w", device="cpu")
            other = create_job(session, model_id=model.id, roots=["/e"], pool="cpu", batch_size=8)
            more = [NewImage(path=f"/e/{i}.jpg", size_bytes=1, mtime=1.0) for i in range(3)]
            return job.id, insert_images(session, other.id, more)
    finally:
        engine.dispose()


def test_an_export_nobody_reads_on_holds_no_worker_write_back(tmp_path: Path) -> None:
    # Given a finished job on the embedded ledger, far more export than a pipe holds
    data = tmp_path / "data"
    url = Settings(_env_file=None, data_dir=data).resolved_database_url
    migrate(url)
    job_id, pending = _finished_job(url, 3000)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETQ_")}
    env.update(DETQ_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
    # When it is exported into a pipe that is read one line, then not at all for a while (a pager)
    export = subprocess.Popen(
        [sys.executable, "-m", "cli", "export", str(job_id), "--format", "jsonl"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,  # unbuffered: the line read here is all that is taken from the pipe before the end
        env=env,
        cwd=tmp_path,
    )
    assert export.stdout is not None
    lines = [export.stdout.readline()]  # the export is streaming: its read is open
    worker = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
    try:
        # Then a worker's write goes through without waiting at all (busy timeout 0): it would fail with
        # "database is locked" if the export held the write lock
        worker.execute("BEGIN IMMEDIATE")
        worker.executemany(
            "UPDATE images SET status = 'done', finished_at = '2024-01-01' WHERE id = ?",
            [(i,) for i in pending],
        )
        worker.execute("COMMIT")
        assert export.poll() is None  # still mid-export, blocked on the full pipe
    finally:
        worker.close()
    # And the export goes on to its last line once read
    rest, err = export.communicate(timeout=120)
    lines += rest.splitlines()
    assert export.returncode == 0, err.decode()
    assert len(lines) == 3000
    assert [len(json.loads(line)["detections"]) for line in (lines[0], lines[-1])] == [2, 2]
