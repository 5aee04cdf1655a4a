"""The reference side of the parity test, in its own process: importing ultralytics patches PIL.Image.open.

Usage: python ultralytics_reference.py WORKDIR (with the repository root on PYTHONPATH)
Writes to WORKDIR the photos, a YOLOv8n TorchScript export built by Ultralytics (bench.yolo_export), and
predictions.json: per photo, Ultralytics predict's (score, class, [x1, y1, x2, y2]).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from bench.photos import write_photo
from bench.yolo_export import export_yolov8n, prepare_ultralytics

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


def main(work: Path) -> None:
    ultralytics = prepare_ultralytics(work)
    torch.set_num_threads(1)  # as the test: sums split over other thread counts round differently
    export = export_yolov8n(ultralytics, work, INPUT)
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
