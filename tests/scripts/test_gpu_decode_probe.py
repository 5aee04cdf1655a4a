"""scripts/gpu_decode_probe.py: its pixel comparison, and the whole probe rehearsed on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support import SCRIPTS, load_script

SCRIPT = SCRIPTS / "gpu_decode_probe.py"


def test_the_gap_between_two_decodes_counts_each_differing_channel_value() -> None:
    probe = load_script("gpu_decode_probe")
    # Given a 4 x 5 decode and another whose one red value is 3 higher and one blue value 1 lower
    ours = np.full((4, 5, 3), 100, dtype=np.uint8)
    theirs = ours.copy()
    theirs[0, 0, 0] = 103
    theirs[3, 4, 2] = 99
    # Then the gap names the largest difference, the mean over all 60 values, and the share equal
    gap = probe.pixel_gap(ours, theirs)
    assert gap.max_abs == 3
    assert gap.mean_abs == pytest.approx(4 / 60)
    assert gap.equal_fraction == pytest.approx(58 / 60)
    # And values that would wrap around in uint8 arithmetic count at their true distance
    assert probe.pixel_gap(np.zeros((1, 1, 3), np.uint8), np.full((1, 1, 3), 255, np.uint8)).max_abs == 255


def test_decodes_of_another_size_are_refused_and_gaps_summarised_over_photos() -> None:
    probe = load_script("gpu_decode_probe")
    with pytest.raises(ValueError, match="decoded to"):
        probe.pixel_gap(np.zeros((4, 5, 3), np.uint8), np.zeros((5, 4, 3), np.uint8))
    same = probe.PixelGap(0, 0.0, 1.0)
    off = probe.PixelGap(7, 0.5, 0.75)
    summary = probe.summarize([same, off])
    assert summary == {
        "identical_images": 1,
        "max_abs_diff": 7,
        "mean_abs_diff": 0.25,
        "equal_fraction_min": 0.75,
    }


@pytest.mark.integration
def test_the_decode_probe_rehearsed_on_cpu_decodes_every_photo_both_ways_and_compares_them() -> None:
    # Given the probe in its rehearsal mode (torchvision's CPU decoder in place of nvJPEG) on 6 photos
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETQ_")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rehearse-on-cpu", "--images", "6", "--size", "320x240"]
        + ["--batch", "4", "--threads", "2", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    # Then it passes, with both paths timed over every photo
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["device"] == "cpu" and report["gpu_name"] is None
    assert report["images"] == 6 and report["size"] == [320, 240] and report["threads"] == 2
    assert report["exact_then_to_device_images_per_s"] > 0 and report["torchvision_images_per_s"] > 0
    # And the comparison covers them: as many photos alike as the worst gap allows
    assert 0 <= report["max_abs_diff"] <= 255
    assert 0 <= report["equal_fraction_min"] <= 1
    if report["max_abs_diff"] == 0:
        assert report["identical_images"] == 6 and report["equal_fraction_min"] == 1
    else:
        assert report["identical_images"] < 6 and report["mean_abs_diff"] > 0
