"""The reference side of the parity test, in its own process: importing ultralytics patches PIL.Image.open.

Usage: python ultralytics_reference.py WORKDIR
Writes to WORKDIR the photos, a YOLOv8n TorchScript export built by Ultralytics from its packaged yaml (no
weights downloaded), and predictions.json: per photo, Ultralytics predict's (score, class, [x1, y1, x2, y2]).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

INPUT = 320
# (width, height, EXIF orientation): shrunk by 4, 2 and 1.6, unchanged, enlarged, a thin strip, rotated.
PHOTOS = [
    (1280, 960, 1),
    (640, 480, 1),
    (333, 517, 1),
    (320, 320, 1),
    (200, 150, 1),
    (97, 301, 1),
    (480, 360, 6),
]


def write_photo(path: Path, width: int, height: int, seed: int, orientation: int = 1) -> Path:
    """A smooth random background with filled ellipses: structure a random-weight detector responds to."""
    rng = np.random.default_rng(seed)
    cells = 40 / max(width, height)  # about the same texture at the model's input, whatever the size
    coarse = rng.integers(0, 255, (int(height * cells) + 1, int(width * cells) + 1, 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        size = int(rng.integers(max(width, height) // 30 + 1, max(width, height) // 4 + 2))
        draw.ellipse([x, y, x + size, y + size], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    exif = Image.Exif()
    exif[0x0112] = orientation
    img.save(path, quality=90, exif=exif.tobytes())
    return path


def calibrated_yolov8n(ultralytics: Any, work: Path) -> Any:
    """YOLOv8n with batch norm calibrated on photos like the test's and a class head that scores some boxes
    above 0.25: random weights otherwise find nothing."""
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
                path = write_photo(work / f"calibration-{batch}-{i}.jpg", INPUT, INPUT, 100 + 4 * batch + i)
                pixels.append(torch.from_numpy(np.array(Image.open(path))).permute(2, 0, 1).float() / 255)
            net(torch.stack(pixels))
    net.eval()
    for head in net.model[-1].cv3:
        torch.nn.init.normal_(head[-1].weight, std=0.05)
        torch.nn.init.constant_(head[-1].bias, -2.0)
    return yolo


def main(work: Path) -> None:
    os.environ.update(YOLO_CONFIG_DIR=str(work / "config"), YOLO_OFFLINE="1", YOLO_VERBOSE="False")
    os.chdir(work)  # the exporter writes beside the yaml's name, in the working directory
    warnings.simplefilter("ignore")  # torch.jit.trace and torch.jit.load deprecations, inside ultralytics
    torch.set_num_threads(1)  # as the test: sums split over other thread counts round differently
    import ultralytics

    export = Path(calibrated_yolov8n(ultralytics, work).export(format="torchscript", imgsz=INPUT)).resolve()
    predictor = ultralytics.YOLO(str(export), task="detect")
    predictions = {}
    for i, (width, height, orientation) in enumerate(PHOTOS):
        photo = write_photo(work / f"photo{i}.jpg", width, height, seed=i, orientation=orientation)
        (result,) = predictor.predict(str(photo), imgsz=INPUT, verbose=False)
        boxes = result.boxes
        predictions[photo.name] = [
            [score, int(label), box]
            for score, label, box in zip(
                boxes.conf.tolist(), boxes.cls.tolist(), boxes.xyxy.tolist(), strict=True
            )
        ]
    (work / "predictions.json").write_text(json.dumps({"export": str(export), "photos": predictions}))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
