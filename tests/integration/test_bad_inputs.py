"""A folder of corrupt inputs: every image ends in a terminal state with a reason; the good ones are done,
their boxes mapped back to original pixels; inputs are never modified."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.integration.harness import Deployment, running_worker
from tests.support import save_fixed_box_model, write_corrupt_folder

pytestmark = pytest.mark.integration


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


def test_corrupt_folder_ends_in_terminal_states(deployment: Deployment, tmp_path: Path) -> None:
    _run_corrupt_folder(deployment, tmp_path)


def test_decode_threads_reading_ahead_end_every_image_as_inline_decoding_does(
    embedded: Deployment, tmp_path: Path
) -> None:
    # Given three decode threads per process and forwards of two (the threads read ahead of the model,
    # as in a GPU pool), the same folder ends the same way
    embedded.extra = {"DETQ_DECODE_THREADS": "3", "DETQ_MICRO_BATCH": "2"}
    log = _run_corrupt_folder(embedded, tmp_path)
    assert log.count("intra-op and 3 decode threads") == 2  # each pool process had them


def _run_corrupt_folder(deployment: Deployment, tmp_path: Path) -> str:
    """Run a job over the corrupt folder, check every file's terminal state; the worker's log."""
    # Given a model that boxes the middle half of whatever it sees, decoding near 64x64 (JPEG draft)
    deployment.model = save_fixed_box_model(
        tmp_path / "fixed.pt", classes=("bg", "thing"), input_size=[64, 64]
    )
    folder = tmp_path / "inputs"
    expected = write_corrupt_folder(folder, tmp_path / "outside")
    before = _digests(folder)
    with running_worker(deployment, concurrency=2) as worker:
        status = deployment.run_json(
            "enqueue", str(folder), "--batch-size", "8", "--wait", "--timeout", "120", codes=(4,)
        )
        log = worker.log()
    assert status["state"] == "finished"
    lines = deployment.run("export", str(status["job_id"]), "--format", "jsonl").stdout.splitlines()
    ledger = {Path(row["path"]).name: row for row in map(json.loads, lines)}
    # Then each file has exactly the terminal state expected, with a reason for the bad ones
    assert {name: row["status"] for name, row in ledger.items()} == expected
    for name, row in ledger.items():
        if row["status"] == "done":
            assert row["reason"] is None
            w, h = row["width"], row["height"]
            (det,) = row["detections"]
            assert det["label"] == "thing"
            assert det["box"] == pytest.approx([w / 4, h / 4, 3 * w / 4, 3 * h / 4], abs=0.02)
        else:
            assert row["reason"], f"{name} has no reason"
            assert row["detections"] == []
    assert "empty" in ledger["empty.jpg"]["reason"]
    assert "truncated" in ledger["truncated.jpg"]["reason"]
    assert "not a recognised image" in ledger["notes.jpg"]["reason"]
    assert "outside the job root" in ledger["escape.jpg"]["reason"]
    # And no input was modified
    assert _digests(folder) == before
    return log
