"""Synthetic scenes of filled circles, squares and triangles on textured backgrounds, with ground truth."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageChops, ImageDraw

CLASSES: tuple[str, ...] = ("circle", "square", "triangle")

# (width, height) choices for write_dataset / random_image_size; each side is then jittered by up to 8 %.
IMAGE_SIZES: tuple[tuple[int, int], ...] = (
    (320, 240),
    (640, 480),
    (480, 640),
    (800, 450),
    (512, 512),
    (1024, 768),
    (1280, 720),
)
SIZE_JITTER = 0.08
MIN_SHAPE_FRACTION = 0.07
MAX_SHAPE_FRACTION = 0.30
MAX_SHAPES = 6
MAX_OVERLAP_IOU = 0.1
MIN_COLOUR_DISTANCE = 110.0
JPEG_QUALITY = 90
GROUND_TRUTH_FILE = "ground_truth.json"

Colour = tuple[int, int, int]


@dataclass(frozen=True)
class GroundTruthBox:
    """One drawn shape: class and tight pixel box; x2/y2 are exclusive (one past the last drawn pixel)."""

    label_id: int
    label: str
    x1: float
    y1: float
    x2: float
    y2: float

    def as_list(self) -> list[float]:
        """The box as [x1, y1, x2, y2]."""
        return [self.x1, self.y1, self.x2, self.y2]


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    ix = min(a[2], b[2]) - max(a[0], b[0])
    iy = min(a[3], b[3]) - max(a[1], b[1])
    if ix <= 0 or iy <= 0:
        return 0.0
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _random_colour(rng: random.Random) -> Colour:
    return (rng.randint(0, 255), rng.randint(0, 255), rng.randint(0, 255))


def _solid(width: int, height: int, colour: Colour) -> Image.Image:
    return Image.new("RGB", (width, height), colour)


def _gradient(rng: random.Random, width: int, height: int) -> Image.Image:
    """A linear two-colour ramp at a random angle."""
    angle = rng.uniform(0.0, 2.0 * math.pi)
    cos_a, sin_a = math.cos(angle), math.sin(angle)
    xs = np.arange(width, dtype=np.float32)[None, :] * np.float32(cos_a)
    ys = np.arange(height, dtype=np.float32)[:, None] * np.float32(sin_a)
    low = float(xs.min() + ys.min())
    span = max(float(xs.max() + ys.max()) - low, 1e-6)
    ramp = ((xs - np.float32(low)) * np.float32(255.0 / span)) + ys * np.float32(255.0 / span)
    mask = Image.fromarray(ramp.astype(np.uint8))
    return Image.composite(
        _solid(width, height, _random_colour(rng)), _solid(width, height, _random_colour(rng)), mask
    )


def _pattern_mask(rng: random.Random, width: int, height: int) -> Image.Image:
    """An L-mode 0/255 mask of stripes at a random angle or of a checkerboard."""
    period = rng.uniform(0.03, 0.15) * min(width, height)
    if rng.random() < 0.5:
        angle = rng.uniform(0.0, math.pi)
        xs = np.arange(width, dtype=np.float32)[None, :] * np.float32(math.cos(angle) / period)
        ys = np.arange(height, dtype=np.float32)[:, None] * np.float32(math.sin(angle) / period)
        phase = xs + ys
        phase -= np.floor(phase)
        mask = phase < np.float32(rng.uniform(0.3, 0.7))
    else:
        cell = max(2, round(period))
        cols = (np.arange(width) // cell % 2).astype(np.bool_)
        rows = (np.arange(height) // cell % 2).astype(np.bool_)
        mask = rows[:, None] ^ cols[None, :]
    return Image.fromarray(mask.astype(np.uint8) * np.uint8(255))


def _background(rng: random.Random, width: int, height: int) -> Image.Image:
    """An RGB background: gradient, optionally blended with value-noise blotches, a pattern and grain."""
    nrng = np.random.default_rng(rng.getrandbits(63))
    image = _gradient(rng, width, height)

    if rng.random() < 0.7:
        # Value noise: a coarse random grid upsampled smoothly gives soft blotches.
        cells = rng.randint(2, 14)
        grid_w = max(2, round(cells * width / max(width, height)))
        grid_h = max(2, round(cells * height / max(width, height)))
        grid = nrng.integers(0, 256, size=(grid_h, grid_w, 3), dtype=np.uint8)
        noise = Image.fromarray(grid).resize((width, height), Image.Resampling.BILINEAR)
        image = Image.blend(image, noise, rng.uniform(0.25, 0.7))

    if rng.random() < 0.45:
        mask = _pattern_mask(rng, width, height)
        first = _solid(width, height, _random_colour(rng))
        second = _solid(width, height, _random_colour(rng))
        image = Image.blend(image, Image.composite(first, second, mask), rng.uniform(0.15, 0.45))

    if rng.random() < 0.5:
        # Uniform grain centred on 128, added with ImageChops-style saturation.
        amplitude = rng.randint(3, 12)
        grain = nrng.integers(128 - amplitude, 129 + amplitude, size=(height, width), dtype=np.uint8)
        image = ImageChops.add(image, Image.fromarray(grain).convert("RGB"), scale=1.0, offset=-128)
    return image


def _contrasting_colour(rng: random.Random, background: npt.NDArray[np.float64]) -> Colour:
    """A random colour far enough (RGB distance) from the mean background colour under the shape."""
    best: Colour = (0, 0, 0)
    best_distance = -1.0
    for _ in range(40):
        colour = _random_colour(rng)
        distance = float(np.linalg.norm(np.asarray(colour, dtype=np.float64) - background))
        if distance >= MIN_COLOUR_DISTANCE:
            return colour
        if distance > best_distance:
            best, best_distance = colour, distance
    return best


def _triangle(rng: random.Random, size: float) -> list[tuple[float, float]]:
    """An upright-ish triangle (apex up) about the origin, roughly size x size."""
    half = size / 2.0
    height = size * rng.uniform(0.8, 1.05)
    apex = (rng.uniform(-0.25, 0.25) * size, -height / 2.0)
    left = (-half + rng.uniform(-0.05, 0.05) * size, height / 2.0 + rng.uniform(-0.06, 0.06) * size)
    right = (half + rng.uniform(-0.05, 0.05) * size, height / 2.0 + rng.uniform(-0.06, 0.06) * size)
    tilt = math.radians(rng.uniform(-12.0, 12.0))
    cos_t, sin_t = math.cos(tilt), math.sin(tilt)
    return [(x * cos_t - y * sin_t, x * sin_t + y * cos_t) for x, y in (apex, left, right)]


def _draw(
    draw: ImageDraw.ImageDraw,
    label_id: int,
    geometry: list[tuple[int, int]],
    fill: Colour | int,
    outline: Colour | int | None,
    width: int,
) -> None:
    if label_id == 0:
        draw.ellipse([geometry[0], geometry[1]], fill=fill, outline=outline, width=width)
    elif label_id == 1:
        draw.rectangle([geometry[0], geometry[1]], fill=fill, outline=outline, width=width)
    else:
        draw.polygon(geometry, fill=fill, outline=outline, width=width)


def render_scene(rng: random.Random, width: int, height: int) -> tuple[Image.Image, list[GroundTruthBox]]:
    """Render one RGB scene of 1-6 mostly non-overlapping shapes; return it with their tight boxes."""
    image = _background(rng, width, height)
    background = np.asarray(image)
    draw = ImageDraw.Draw(image)
    short_side = min(width, height)
    boxes: list[GroundTruthBox] = []

    for _ in range(rng.randint(1, MAX_SHAPES)):
        for _attempt in range(30):
            label_id = rng.randrange(len(CLASSES))
            size = max(4, round(rng.uniform(MIN_SHAPE_FRACTION, MAX_SHAPE_FRACTION) * short_side))
            geometry: list[tuple[int, int]]
            if label_id in (0, 1):
                x0 = rng.randint(0, width - size)
                y0 = rng.randint(0, height - size)
                geometry = [(x0, y0), (x0 + size - 1, y0 + size - 1)]
            else:
                corners = _triangle(rng, size)
                min_x = min(x for x, _ in corners)
                min_y = min(y for _, y in corners)
                span_x = max(x for x, _ in corners) - min_x
                span_y = max(y for _, y in corners) - min_y
                if span_x >= width - 1 or span_y >= height - 1:
                    continue
                dx = rng.uniform(0.0, width - 1 - span_x) - min_x
                dy = rng.uniform(0.0, height - 1 - span_y) - min_y
                geometry = [(round(x + dx), round(y + dy)) for x, y in corners]
            left = min(x for x, _ in geometry)
            top = min(y for _, y in geometry)
            right = max(x for x, _ in geometry) + 1
            bottom = max(y for _, y in geometry) + 1

            # The tight box is measured from the exact pixels the shape covers.
            mask = Image.new("L", (right - left, bottom - top), 0)
            local = [(x - left, y - top) for x, y in geometry]
            outline_width = rng.choice((0, 0, 1, 2, 3))
            _draw(ImageDraw.Draw(mask), label_id, local, 255, 255 if outline_width else None, outline_width)
            tight = mask.getbbox()
            if tight is None:
                continue
            box = (left + tight[0], top + tight[1], left + tight[2], top + tight[3])
            if any(_iou(box, other.as_list()) > MAX_OVERLAP_IOU for other in boxes):
                continue

            under = background[box[1] : box[3], box[0] : box[2]].reshape(-1, 3).mean(axis=0)
            fill = _contrasting_colour(rng, under)
            outline: Colour | None = None
            if outline_width:
                shade = rng.uniform(0.3, 0.7)
                outline = (round(fill[0] * shade), round(fill[1] * shade), round(fill[2] * shade))
            _draw(draw, label_id, geometry, fill, outline, outline_width)
            boxes.append(GroundTruthBox(label_id, CLASSES[label_id], *(float(v) for v in box)))
            break
    return image, boxes


def random_image_size(rng: random.Random) -> tuple[int, int]:
    """A (width, height) picked from IMAGE_SIZES with each side jittered by up to SIZE_JITTER."""
    base_w, base_h = rng.choice(IMAGE_SIZES)
    width = round(base_w * rng.uniform(1.0 - SIZE_JITTER, 1.0 + SIZE_JITTER))
    height = round(base_h * rng.uniform(1.0 - SIZE_JITTER, 1.0 + SIZE_JITTER))
    return width, height


def write_dataset(out_dir: Path, count: int, seed: int) -> Path:
    """Write count JPEG scenes plus ground_truth.json into out_dir, deterministically per seed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    images: list[dict[str, Any]] = []
    for index in range(count):
        width, height = random_image_size(rng)
        image, boxes = render_scene(rng, width, height)
        name = f"img_{index:05d}.jpg"
        image.save(out_dir / name, "JPEG", quality=JPEG_QUALITY)
        images.append(
            {
                "file": name,
                "width": width,
                "height": height,
                "boxes": [{"label": b.label, "label_id": b.label_id, "box": b.as_list()} for b in boxes],
            }
        )
    path = out_dir / GROUND_TRUTH_FILE
    path.write_text(json.dumps({"classes": list(CLASSES), "images": images}, indent=1), encoding="utf-8")
    return path


def load_ground_truth(path: Path) -> dict[str, list[GroundTruthBox]]:
    """Read a ground_truth.json written by write_dataset, keyed by image file name."""
    data = json.loads(path.read_text(encoding="utf-8"))
    classes = [str(c) for c in data.get("classes", CLASSES)]
    result: dict[str, list[GroundTruthBox]] = {}
    for entry in data["images"]:
        boxes: list[GroundTruthBox] = []
        for item in entry["boxes"]:
            label_id = int(item["label_id"])
            x1, y1, x2, y2 = (float(v) for v in item["box"])
            boxes.append(GroundTruthBox(label_id, str(item.get("label", classes[label_id])), x1, y1, x2, y2))
        result[str(entry["file"])] = boxes
    return result
