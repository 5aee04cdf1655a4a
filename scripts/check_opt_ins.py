"""What each opt-in trades, measured: `detq model check` of each model family, at the defaults and with each
setting that trades exactness for speed, over photos of mixed sizes; a table for docs/models.md.

Usage: .venv/bin/python scripts/check_opt_ins.py [WORKDIR] [--photos N]
Builds its models as the suite does (tests/support.py, bench/yolo_export.py: no downloads), writes seeded
photos (bench/photos.py), and runs the real `detq model check --json` once per family and setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.photos import write_photo  # noqa: E402 - after the path is set
from bench.yolo_export import export_in_own_process  # noqa: E402
from tests.support import save_exported_conv_yolo, save_torchvision_detector  # noqa: E402

SIZES = [(640, 480), (1280, 960), (480, 640), (800, 600), (1024, 768), (500, 333)]
OPT_INS = {
    "defaults": {},
    "DETQ_FAST_DECODE=true": {"DETQ_FAST_DECODE": "true"},
    "DETQ_CPU_OPTIMIZE=true": {"DETQ_CPU_OPTIMIZE": "true"},
    "DETQ_PRECISION=bf16": {"DETQ_PRECISION": "bf16"},
}


def _yolov8n(work: Path) -> Path:
    return export_in_own_process(work / "ultralytics")


def models(work: Path) -> dict[str, Path]:
    """Each family's model, built as the suite builds it."""
    return {
        "SSD300 (VGG16)": save_torchvision_detector(work / "ssd.pt", "ssd"),
        "SSDlite": save_torchvision_detector(work / "ssdlite.pt", "ssdlite", calibrated=True),
        "Faster R-CNN (R18 FPN)": save_torchvision_detector(work / "frcnn.pt", "fasterrcnn_r18"),
        "RetinaNet (R18 FPN)": save_torchvision_detector(work / "retinanet.pt", "retinanet"),
        "FCOS (R18 FPN)": save_torchvision_detector(work / "fcos.pt", "fcos"),
        "YOLOv8n export": _yolov8n(work),
        "torch.export program": save_exported_conv_yolo(work / "conv_yolo.pt2"),
    }


def check(model: Path, photos: Path, env: dict[str, str], work: Path) -> dict[str, Any]:
    """The JSON report of `detq model check` under these settings."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("DETQ_")}
    environment |= {"DETQ_DATA_DIR": str(work / "data"), **env}
    done = subprocess.run(
        [sys.executable, "-m", "cli", "model", "check", str(model), str(photos), "--json"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        check=False,
    )
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", nargs="?", type=Path)
    parser.add_argument("--photos", type=int, default=12)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="detq-opt-ins-"))
    photos = work / "photos"
    photos.mkdir(parents=True, exist_ok=True)
    for i in range(args.photos):
        write_photo(
            photos / f"p{i:02d}.jpg", *SIZES[i % len(SIZES)], seed=i, orientation=6 if i % 5 == 4 else 1
        )
    columns = ["model", "setting", "images agreeing", "recall", "precision", "largest score diff"]
    print("| " + " | ".join([*columns, "largest corner diff (px)"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for name, model in models(work).items():
        for setting, env in OPT_INS.items():
            report = check(model, photos, env, work)
            agreeing = sum(1 for image in report["images"] if image["agrees"])
            print(
                f"| {name} | {setting} | {agreeing} of {len(report['images'])} | {report['recall']:.3f} |"
                f" {report['precision']:.3f} | {report['max_score_diff']:.2g} |"
                f" {report['max_corner_diff']:.3g} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
