"""A YOLOv8n TorchScript export made by Ultralytics itself from its packaged yaml: no weights downloaded.

Run in its own process (python -m bench.yolo_export WORKDIR [INPUT [BIAS]]): importing ultralytics patches
PIL.Image.open for the rest of the process. Prints the export's path.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from bench.photos import write_photo


def calibrated_yolov8n(ultralytics: Any, work: Path, size: int, bias: float = -2.0) -> Any:
    """YOLOv8n with batch norm calibrated on photos like the benchmark's, and a class head that scores some
    boxes above 0.25 (fewer the lower the bias): random weights otherwise find nothing."""
    torch.manual_seed(0)
    yolo = ultralytics.YOLO("yolov8n.yaml")
    net = yolo.model
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # a plain average over the calibration batches
    net.train()
    with torch.no_grad():
        for batch in range(4):
            pixels = []
            for i in range(4):
                path = write_photo(work / f"calibration-{batch}-{i}.jpg", size, size, 100 + 4 * batch + i)
                pixels.append(torch.from_numpy(np.array(Image.open(path))).permute(2, 0, 1).float() / 255)
            net(torch.stack(pixels))
    net.eval()
    for head in net.model[-1].cv3:
        torch.nn.init.normal_(head[-1].weight, std=0.05)
        torch.nn.init.constant_(head[-1].bias, bias)
    return yolo


def prepare_ultralytics(work: Path) -> Any:
    """Import ultralytics offline, its settings kept in work, its exports written there."""
    os.environ.update(YOLO_CONFIG_DIR=str(work / "config"), YOLO_OFFLINE="1", YOLO_VERBOSE="False")
    os.chdir(work)  # the exporter writes beside the yaml's name, in the working directory
    warnings.simplefilter("ignore")  # torch.jit.trace and torch.jit.load deprecations, inside ultralytics
    import ultralytics

    return ultralytics


def export_yolov8n(ultralytics: Any, work: Path, size: int = 320, bias: float = -2.0) -> Path:
    """The TorchScript export's path."""
    exported = calibrated_yolov8n(ultralytics, work, size, bias).export(format="torchscript", imgsz=size)
    return Path(exported).resolve()


def export_in_own_process(work: Path, timeout: float = 600) -> Path:
    """The export's path, made by `python -m bench.yolo_export work` (its own process: importing
    ultralytics patches Pillow for the process that does); RuntimeError with its output if it fails."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "bench.yolo_export", str(work)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the YOLOv8n export failed: {done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    folder = Path(sys.argv[1]).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 320
    bias = float(sys.argv[3]) if len(sys.argv) > 3 else -2.0
    print(export_yolov8n(prepare_ultralytics(folder), folder, size, bias))
