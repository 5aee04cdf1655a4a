"""Deterministic test photos: smooth random texture with filled ellipses, saved as JPEG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def write_photo(path: Path, width: int, height: int, seed: int, orientation: int = 1) -> Path:
    """A smooth random background with filled ellipses: structure a random-weight detector responds to."""
    rng = np.random.default_rng(seed)
    cells = 40 / max(width, height)  # about the same texture at a model's input, whatever the size
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


def write_photos(folder: Path, count: int, size: tuple[int, int], seed: int = 0) -> list[Path]:
    """count photos of size (width, height) in folder, named in order."""
    folder.mkdir(parents=True, exist_ok=True)
    return [write_photo(folder / f"photo{i:05d}.jpg", *size, seed=seed + i) for i in range(count)]
