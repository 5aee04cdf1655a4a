"""Synthetic scene generator: determinism, tight in-bounds boxes, ground-truth JSON round trip, sizes."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from demo import shapes
from demo.shapes import (
    CLASSES,
    GroundTruthBox,
    load_ground_truth,
    random_image_size,
    render_scene,
    write_dataset,
)

REPO = Path(__file__).resolve().parents[2]


def _iou(a: GroundTruthBox, b: GroundTruthBox) -> float:
    iw = min(a.x2, b.x2) - max(a.x1, b.x1)
    ih = min(a.y2, b.y2) - max(a.y1, b.y1)
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    return inter / ((a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter)


def test_classes() -> None:
    assert CLASSES == ("circle", "square", "triangle")


def test_render_scene_is_deterministic_for_a_seed() -> None:
    first_image, first_boxes = render_scene(random.Random(3), 320, 240)
    second_image, second_boxes = render_scene(random.Random(3), 320, 240)
    other_image, _ = render_scene(random.Random(4), 320, 240)
    assert first_boxes == second_boxes
    assert first_image.tobytes() == second_image.tobytes()
    assert first_image.tobytes() != other_image.tobytes()


@pytest.mark.parametrize("size", [(320, 240), (480, 640), (1280, 720), (97, 61)])
def test_boxes_lie_inside_the_image_and_barely_overlap(size: tuple[int, int]) -> None:
    width, height = size
    rng = random.Random(11)
    counts = set()
    for _ in range(25):
        image, boxes = render_scene(rng, width, height)
        assert image.mode == "RGB"
        assert image.size == (width, height)
        assert 1 <= len(boxes) <= 6
        counts.add(len(boxes))
        for box in boxes:
            assert 0 <= box.label_id < len(CLASSES)
            assert box.label == CLASSES[box.label_id]
            assert 0 <= box.x1 < box.x2 <= width
            assert 0 <= box.y1 < box.y2 <= height
            longest = max(box.x2 - box.x1, box.y2 - box.y1)
            assert 0.05 * min(width, height) <= longest <= 0.36 * min(width, height) + 2
        for a, b in itertools.combinations(boxes, 2):
            assert _iou(a, b) <= 0.1 + 1e-9
    assert len(counts) > 1


def test_boxes_are_tight_around_the_drawn_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a black background every shape pixel is non-zero: each box edge touches one, none lie outside."""

    def black(rng: random.Random, width: int, height: int) -> Image.Image:
        return Image.new("RGB", (width, height), (0, 0, 0))

    monkeypatch.setattr(shapes, "_background", black)
    rng = random.Random(5)
    for _ in range(30):
        width, height = 400, 300
        image, boxes = render_scene(rng, width, height)
        drawn = np.asarray(image).max(axis=2) > 0
        covered = np.zeros_like(drawn)
        for box in boxes:
            x1, y1, x2, y2 = (int(v) for v in (box.x1, box.y1, box.x2, box.y2))
            assert (x1, y1, x2, y2) == (box.x1, box.y1, box.x2, box.y2)
            inside = drawn[y1:y2, x1:x2]
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
            covered[y1:y2, x1:x2] = True
        assert not (drawn & ~covered).any()
        assert {b.label_id for b in boxes} <= {0, 1, 2}


def test_all_classes_and_a_range_of_sizes_appear() -> None:
    rng = random.Random(1)
    labels: set[int] = set()
    fractions: list[float] = []
    for _ in range(40):
        _, boxes = render_scene(rng, 640, 480)
        labels.update(b.label_id for b in boxes)
        fractions.extend(max(b.x2 - b.x1, b.y2 - b.y1) / 480 for b in boxes)
    assert labels == {0, 1, 2}
    assert min(fractions) < 0.12
    assert max(fractions) > 0.25


def test_write_dataset_round_trip(tmp_path: Path) -> None:
    gt_path = write_dataset(tmp_path / "set", 6, seed=21)
    assert gt_path == tmp_path / "set" / "ground_truth.json"
    data = json.loads(gt_path.read_text(encoding="utf-8"))
    assert data["classes"] == list(CLASSES)
    assert [entry["file"] for entry in data["images"]] == [f"img_{i:05d}.jpg" for i in range(6)]

    loaded = load_ground_truth(gt_path)
    rng = random.Random(21)  # write_dataset draws a size, then renders, per image
    for i, entry in enumerate(data["images"]):
        width, height = random_image_size(rng)
        _, boxes = render_scene(rng, width, height)
        assert (entry["width"], entry["height"]) == (width, height)
        assert loaded[entry["file"]] == boxes
        for item, box in zip(entry["boxes"], boxes, strict=True):
            assert item == {"label": box.label, "label_id": box.label_id, "box": box.as_list()}
        with Image.open(tmp_path / "set" / f"img_{i:05d}.jpg") as image:
            assert image.format == "JPEG"
            assert image.size == (width, height)


def test_write_dataset_is_deterministic(tmp_path: Path) -> None:
    a = write_dataset(tmp_path / "a", 4, seed=8)
    b = write_dataset(tmp_path / "b", 4, seed=8)
    c = write_dataset(tmp_path / "c", 4, seed=9)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    for i in range(4):
        name = f"img_{i:05d}.jpg"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_sizes_and_aspect_ratios_vary(tmp_path: Path) -> None:
    data = json.loads(write_dataset(tmp_path, 30, seed=2).read_text(encoding="utf-8"))
    sizes = {(entry["width"], entry["height"]) for entry in data["images"]}
    assert len(sizes) >= 10
    assert any(w > h for w, h in sizes) and any(w < h for w, h in sizes)
    assert min(w for w, _ in sizes) < 400 and max(w for w, _ in sizes) > 900


def test_producer_modules_do_not_import_torch() -> None:
    code = "import sys, demo.shapes, demo.scoring; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
