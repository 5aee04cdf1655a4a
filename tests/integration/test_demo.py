"""`detq demo` end to end, small: it generates images, runs workers, scores, writes COCO and exits 0."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.harness import DETQ, Deployment

pytestmark = pytest.mark.integration


def test_demo_runs_and_scores(embedded: Deployment, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = subprocess.run(
        [*DETQ, "demo", "--images", "12", "--workers", "1", "--out", str(out), "--json"],
        env=embedded.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # With --json the summary is standard output's one line, as summary.json holds it; people's text
    # goes to standard error
    assert "detq demo summary" in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    (line,) = done.stdout.strip().splitlines()
    assert json.loads(line) == summary
    assert summary["done"] == summary["images"] == 12
    assert summary["precision@0.5"] >= 0.8 and summary["recall@0.5"] >= 0.8
    coco = json.loads((out / "detections_coco.json").read_text())
    assert len(coco) == summary["detections"]  # COCO results: one entry per detection
    assert len(list((out / "annotated").glob("*.jpg"))) == 6
    assert "Warm shutdown" in (out / "worker.log").read_text()
