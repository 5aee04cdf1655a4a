"""`detq model check` over every model family detq supports, on photos of mixed sizes: what detq's
pipeline stores is what the model as saved gives, the plain way, image by image; and an opt-in that
trades exactness says so and fails the check."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.photos import write_photo
from bench.yolo_export import export_in_own_process
from tests.integration.harness import DETQ
from tests.support import save_exported_conv_yolo, save_torchvision_detector

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SIZES = [(640, 480), (1280, 960), (480, 640), (800, 600), (1024, 768), (500, 333)]


def _yolov8n(path: Path) -> Path:
    """YOLOv8n as Ultralytics exports it (built in its own process: importing ultralytics patches Pillow)."""
    return export_in_own_process(path.parent / "ultralytics")


FAMILIES: dict[str, Callable[[Path], Path]] = {
    "ssd": lambda p: save_torchvision_detector(p, "ssd"),
    "ssdlite": lambda p: save_torchvision_detector(p, "ssdlite", calibrated=True),
    "faster-rcnn": lambda p: save_torchvision_detector(p, "fasterrcnn_r18"),
    "retinanet": lambda p: save_torchvision_detector(p, "retinanet"),
    "fcos": lambda p: save_torchvision_detector(p, "fcos"),
    "yolov8n-export": _yolov8n,
    "torch.export": save_exported_conv_yolo,
}


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten photos of six sizes, two turned by EXIF."""
    folder = tmp_path_factory.mktemp("photos")
    for i in range(10):
        write_photo(
            folder / f"p{i:02d}.jpg", *SIZES[i % len(SIZES)], seed=i, orientation=6 if i % 5 == 4 else 1
        )
    return folder


def _check(model: Path, folder: Path, tmp_path: Path, **env: str) -> tuple[int, dict[str, Any]]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("DETQ_")}
    environment |= {"DETQ_DATA_DIR": str(tmp_path / "data"), **env}
    done = subprocess.run(
        [*DETQ, "model", "check", str(model), str(folder), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
        check=False,
    )
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_stores_what_the_model_gives_alone(family: str, photos: Path, tmp_path: Path) -> None:
    # Given a model of the family and a folder of mixed photos
    model = FAMILIES[family](tmp_path / "model.pt")
    # When detq checks it at the defaults
    code, report = _check(model, photos, tmp_path)
    # Then every image's boxes are the plain way's: recall and precision 1.0 at IoU 0.99, scores within 1e-3
    assert code == 0 and report["agrees"], json.dumps(report)[:3000]
    assert len(report["images"]) == 10 and report["recall"] == report["precision"] == 1.0
    assert sum(image["plain_boxes"] for image in report["images"]) > 0  # there was something to compare
    assert report["trades"] == []


def test_an_opt_in_that_trades_exactness_is_named_and_fails_the_check(photos: Path, tmp_path: Path) -> None:
    # Given a RetinaNet, and DETQ_FAST_DECODE on (JPEGs decoded at a reduced DCT scale)
    model = save_torchvision_detector(tmp_path / "r.pt", "retinanet")
    # When detq checks it
    code, report = _check(model, photos, tmp_path, DETQ_FAST_DECODE="true")
    # Then the check fails, naming the setting, and says how far the answers moved
    assert code == 1 and not report["agrees"]
    assert report["trades"] == ["DETQ_FAST_DECODE=true"]
    assert report["recall"] < 1.0 and report["max_corner_diff"] > 0


@pytest.mark.parametrize(
    ("setting", "value", "exact"),
    [("DETQ_CPU_OPTIMIZE", "true", True), ("DETQ_PRECISION", "bf16", False)],
)
def test_each_other_opt_in_is_named_and_measured(
    setting: str, value: str, exact: bool, photos: Path, tmp_path: Path
) -> None:
    # Given an SSDlite (calibrated: scores that differ, as a trained model's do), and the opt-in on
    model = save_torchvision_detector(tmp_path / "s.pt", "ssdlite", calibrated=True)
    # When detq checks it
    code, report = _check(model, photos, tmp_path, **{setting: value})
    # Then the report names the trade; a frozen, optimised graph stays within the tolerance (scores move by
    # about 1e-7, docs/models.md), bf16 arithmetic does not and fails the check
    assert report["trades"] == [f"{setting}={value}"]
    assert (code == 0) == exact == report["agrees"], json.dumps(report)[:3000]
    if not exact:
        assert report["recall"] < 1.0 and report["max_score_diff"] > 1e-3
