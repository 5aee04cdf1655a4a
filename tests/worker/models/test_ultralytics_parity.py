"""detq finds the same boxes and scores as the real Ultralytics predict on the same export and photos."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from worker.decode import decode_image
from worker.jpeg import exact_jpeg_decoder
from worker.models.loading import LoadedModel, load_model_for_device
from worker.pipeline import decoded_rows, forward_images

REFERENCE = Path(__file__).with_name("ultralytics_reference.py")
ROOT = Path(__file__).resolve().parents[3]
PHOTO_IDS = ["1280x960", "640x480", "333x517", "320x320", "200x150", "97x301", "480x360-exif6"]
Detection = tuple[float, int, tuple[float, ...]]


@pytest.fixture()
def one_thread() -> Iterator[None]:
    """One intra-op thread, as the reference: sums split over other thread counts round differently."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Ultralytics' own export of YOLOv8n, the photos, and what its predict found on each."""
    work = tmp_path_factory.mktemp("ultralytics")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(REFERENCE), str(work)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"the Ultralytics reference failed:\n{done.stderr[-3000:]}"
    found: dict[str, Any] = json.loads((work / "predictions.json").read_text())
    assert len(found["photos"]) == len(PHOTO_IDS)
    return {"model": load_model_for_device(Path(found["export"]), "cpu"), "work": work, **found}


def ordered(detections: list[Detection]) -> list[Detection]:
    return sorted(detections, key=lambda d: (-d[0], d[1], d[2]))


def detq_detections(model: LoadedModel, photo: Path) -> list[Detection]:
    # The worker's default decode: whole JPEGs by OpenCV (checked here against Ultralytics' own cv2.imread)
    jpeg = exact_jpeg_decoder()
    decoded = decode_image(photo, target_size=None, max_pixels=10**8, max_bytes=10**8, jpeg=jpeg)
    (raw,) = forward_images(model, [decoded.image])
    rows = decoded_rows(raw, decoded, model.meta)
    return ordered([(r.score, r.label_id, (r.x1, r.y1, r.x2, r.y2)) for r in rows])


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PHOTO_IDS)), ids=PHOTO_IDS)
def test_detq_matches_ultralytics_predict_box_for_box(
    reference: dict[str, Any], index: int, one_thread: None
) -> None:
    # Given an Ultralytics export and a photo: downscaled to the 320 input, enlarged, or rotated by EXIF
    name = f"photo{index}.jpg"
    expected = ordered([(score, label, tuple(box)) for score, label, box in reference["photos"][name]])
    assert expected, "the calibrated model finds boxes on every photo, or the comparison would prove nothing"
    assert len({score for score, _, _ in expected}) == len(expected), "no tied scores: one order to compare"
    # When detq runs the same export on it
    found = detq_detections(reference["model"], reference["work"] / name)
    # Then it finds the same boxes, classes and scores
    assert len(found) == len(expected)
    for (score, label, box), (want_score, want_label, want_box) in zip(found, expected, strict=True):
        assert label == want_label
        assert score == pytest.approx(want_score, abs=1e-6)
        assert box == pytest.approx(want_box, abs=1e-3)
