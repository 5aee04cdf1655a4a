"""Evaluate a detq TorchScript detector on freshly rendered held-out shape scenes: mAP, precision, recall.

    .venv/bin/python scripts/eval_demo_model.py                          # worker/assets/demo_detector.pt
    .venv/bin/python scripts/eval_demo_model.py --count 200 --seed 424242 --jpeg

The model is loaded exactly as the worker loads it (torch.jit.load with map_location="cpu", detq.json read
through _extra_files) and is fed full-size CHW float RGB tensors in [0, 1] of mixed sizes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from demo.scoring import PredictedBox, mean_average_precision, precision_recall  # noqa: E402
from demo.shapes import (  # noqa: E402
    CLASSES,
    GroundTruthBox,
    load_ground_truth,
    random_image_size,
    render_scene,
    write_dataset,
)
from detq.vocabulary import Precision  # noqa: E402
from worker.models.precision import with_precision  # noqa: E402

DEFAULT_MODEL = REPO / "worker" / "assets" / "demo_detector.pt"


def to_tensor(image: Image.Image) -> torch.Tensor:
    array = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).to(torch.float32) / 255.0


def held_out_scenes(
    count: int, seed: int, jpeg: bool
) -> tuple[list[Image.Image], dict[str, list[GroundTruthBox]]]:
    """count scenes of mixed sizes; with jpeg, written by write_dataset and read back from disk."""
    if jpeg:
        folder = Path(tempfile.mkdtemp(prefix="detq-eval-"))
        truth = load_ground_truth(write_dataset(folder, count, seed))
        names = sorted(truth)
        images = []
        for name in names:
            with Image.open(folder / name) as handle:
                images.append(handle.convert("RGB"))
        return images, {str(i): truth[name] for i, name in enumerate(names)}
    rng = random.Random(seed)
    images = []
    gt: dict[str, list[GroundTruthBox]] = {}
    for i in range(count):
        width, height = random_image_size(rng)
        image, boxes = render_scene(rng, width, height)
        images.append(image)
        gt[str(i)] = boxes
    return images, gt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--count", type=int, default=200, help="held-out scenes to render")
    parser.add_argument("--seed", type=int, default=424242, help="differs from every training seed")
    parser.add_argument("--iou", type=float, default=0.5, help="IoU threshold for a match")
    parser.add_argument("--score-threshold", type=float, default=None, help="default: the model's own")
    parser.add_argument("--batch", type=int, default=8, help="images per forward call (mixed sizes)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--jpeg", action="store_true", help="go through write_dataset's JPEG files")
    parser.add_argument(
        "--precision", choices=[p.value for p in Precision], default="fp32", help="as DETQ_PRECISION"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    extra: dict[str, Any] = {"detq.json": ""}
    model = torch.jit.load(str(args.model), map_location="cpu", _extra_files=extra)
    model.eval()
    model = with_precision(model, Precision(args.precision), torch.device("cpu"))
    raw = extra["detq.json"]
    meta = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw) if raw else {}
    classes = list(meta.get("classes") or CLASSES)
    threshold = args.score_threshold
    if threshold is None:
        threshold = float(meta.get("score_threshold") or 0.3)
    size_mb = args.model.stat().st_size / 1e6
    print(f"model {args.model} ({size_mb:.2f} MB, {args.precision}): {json.dumps(meta)}")

    images, gt = held_out_scenes(args.count, args.seed, args.jpeg)
    num_boxes = sum(len(v) for v in gt.values())
    print(
        f"held-out set: {len(images)} scenes (seed {args.seed}{', via JPEG' if args.jpeg else ''}), "
        f"{num_boxes} boxes"
    )

    pred: dict[str, list[PredictedBox]] = {}
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(images), args.batch):
            chunk = images[start : start + args.batch]
            outputs = model([to_tensor(image) for image in chunk])
            for offset, output in enumerate(outputs):
                boxes = output["boxes"].tolist()
                labels = output["labels"].tolist()
                scores = output["scores"].tolist()
                pred[str(start + offset)] = [
                    PredictedBox(int(label), float(score), *box)
                    for box, label, score in zip(boxes, labels, scores, strict=True)
                ]
    elapsed = time.perf_counter() - started
    print(
        f"inference: {elapsed:.1f}s ({len(images) / elapsed:.1f} images/s incl. resize, "
        f"{args.threads} threads)"
    )

    mean_ap, per_class = mean_average_precision(gt, pred, len(classes), iou_threshold=args.iou)
    print(f"mAP@{args.iou:g}: {mean_ap:.4f}")
    for name, ap in zip(classes, per_class, strict=True):
        print(f"  AP {name:<9} {ap:.4f}")
    precision, recall, tp, fp, fn = precision_recall(
        gt, pred, iou_threshold=args.iou, score_threshold=threshold
    )
    print(
        f"at score >= {threshold:g}, IoU >= {args.iou:g}: precision {precision:.4f} recall {recall:.4f} "
        f"(TP {tp}, FP {fp}, FN {fn})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
