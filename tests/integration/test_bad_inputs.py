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


def test_names_holding_escape_sequences_print_visibly_escaped_in_every_command(
    embedded: Deployment, tmp_path: Path
) -> None:
    import os
    import subprocess

    from tests.integration.faults import write_images
    from tests.integration.harness import DETQ

    # Given a folder holding a good image, a FIFO whose name retitles the terminal (OSC) and clears it (CSI),
    # a file of garbage whose name rings the bell and breaks the line, and a folder named with a colour code
    folder = tmp_path / "in\x1b[31mred"
    write_images(folder, 1)
    os.mkfifo(folder / "\x1b]0;pwned\x07\x1b[2Jfifo.jpg")
    (folder / "bad\x07bell\nline.jpg").write_bytes(b"not an image")
    embedded.model = save_fixed_box_model(tmp_path / "fixed.pt", classes=("bg", "thing"), input_size=[64, 64])
    out = tmp_path / "results"
    # When each command a person reads runs over them
    with running_worker(embedded, concurrency=1):
        enqueued = embedded.run("enqueue", str(folder), "--wait", codes=(4,))
        said = {
            "enqueue --wait": enqueued.stdout + enqueued.stderr,
            "status": embedded.run("status", "1").stdout,
            "jobs": embedded.run("jobs").stdout,
        }
    run = embedded.run("run", str(folder), "--out", str(out), "--workers", "1", "--force", codes=(4,))
    said["run"] = run.stdout + run.stderr
    missing = subprocess.run(
        [*DETQ, "run", str(folder / "gone\x1b[2J.jpg")], env=embedded.env(), capture_output=True, text=True
    )
    said["an error"] = missing.stderr
    # Then no line carries a control character: each is written as its escape
    for command, text in said.items():
        shown = text.replace("\n", "")
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in shown), (command, text)
    assert "\\x1b]0;pwned\\x07\\x1b[2Jfifo.jpg" in said["enqueue --wait"]  # the FIFO's reason, escaped
    assert "\\x1b]0;pwned\\x07\\x1b[2Jfifo.jpg" in said["run"]
    assert "in\\x1b[31mred" in said["status"] and "in\\x1b[31mred" in said["jobs"]
    assert said["an error"].count("\n") == 1 and "gone\\x1b[2J.jpg" in said["an error"]  # one line
    # And the data files keep the names as they are
    rows = [json.loads(line) for line in (out / "detections.jsonl").read_text().splitlines()]
    assert str(folder / "\x1b]0;pwned\x07\x1b[2Jfifo.jpg") in {row["path"] for row in rows}
