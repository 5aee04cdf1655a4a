"""scripts/gpu_smoke.py rehearsed on the CPU pool: the script itself works end to end before a GPU is lent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tests.support import SCRIPTS, load_script

pytestmark = pytest.mark.integration

SCRIPT = SCRIPTS / "gpu_smoke.py"


def test_the_gpu_smoke_script_rehearsed_on_cpu_passes_and_reports_every_figure(tmp_path: Path) -> None:
    # Given the GPU smoke script in its rehearsal mode on the demo model and a dozen shape images
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETQ_")}
    # When it runs (a worker on the tested pool, then the CPU pool for the reference detections)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rehearse-on-cpu", "--model", "demo", "--images", "12"]
        + ["--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    # Then it passes, every image done by the one process that loaded the model once
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["rehearsal_on_cpu"] is True
    assert report["pool"] == "cpu" and report["devices"] == ["cpu"]
    assert report["images"] == report["done"] == 12
    assert report["model_loads"] == 1
    # And its detections match the reference run's, and the figures a GPU run records are all there
    assert report["detections"] == report["detections_cpu_reference"] > 0
    assert report["images_per_s"] > 0
    # (the enqueue command's start-up apart: the pace from the first claimed image is the faster)
    assert report["start_up_s"] > 0
    assert report["images_per_s_after_first_claim"] > report["images_per_s"]
    if shutil.which("nvidia-smi") is None:  # sampled only where the NVIDIA tools are
        assert report["gpu_busy_percent"] is None and report["busy_samples"] == 0
        assert report["gpu_busy_percent_after_first_claim"] is None
    assert "loaded model" in (tmp_path / "out" / "gpu_worker.log").read_text()


def test_nvidia_smi_samples_are_read_with_their_time_and_averaged_from_a_moment_on() -> None:
    smoke = load_script("gpu_smoke")
    # Given two GPUs sampled twice, 200 ms apart (nvidia-smi's local time), a blank line, a timestamp in
    # another format and a GPU reporting no utilisation (both left out)
    text = (
        "2026/12/02 14:50:01.000, 10\n2026/12/02 14:50:01.000, 20\n"
        "2026/12/02 14:50:01.200, 90\n2026/12/02 14:50:01.200, 100\n"
    )
    samples = smoke.parse_busy(text + "\n2026-12-02T14:50:01, 50\n2026/12/02 14:50:01.300, [N/A]\n")
    moment = datetime(2026, 12, 2, 14, 50, 1, 100_000).timestamp()
    assert [percent for _, percent in samples] == [10, 20, 90, 100]
    assert samples[2][0] - samples[0][0] == pytest.approx(0.2)
    sampler = smoke.BusySampler()
    sampler.samples = samples
    # Then the mean is over every sample, or over those from the moment on
    assert sampler.mean_percent() == 55.0
    assert sampler.mean_percent(since=moment) == 95.0
