"""Whole JPEGs decoded by OpenCV straight into an RGB array: Pillow's exact pixels, without its two copies."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from functools import lru_cache

import cv2
import numpy as np
from PIL import Image

log = logging.getLogger(__name__)

# Bytes of a JPEG file in, its H x W x 3 uint8 RGB pixels out (EXIF orientation not applied), or None where
# the decoder cannot read it (the caller then decodes with Pillow, which names the problem).
RgbDecoder = Callable[[bytes], "np.ndarray | None"]

# Pillow's Image.transpose methods of EXIF orientations 2-8 (ImageOps.exif_transpose), as array views.
_ORIENT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda a: a[:, ::-1],  # FLIP_LEFT_RIGHT
    3: lambda a: a[::-1, ::-1],  # ROTATE_180
    4: lambda a: a[::-1],  # FLIP_TOP_BOTTOM
    5: lambda a: a.transpose(1, 0, 2),  # TRANSPOSE
    6: lambda a: a.transpose(1, 0, 2)[:, ::-1],  # ROTATE_270
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),  # TRANSVERSE
    8: lambda a: a.transpose(1, 0, 2)[::-1],  # ROTATE_90
}


def orient(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """The pixels as displayed under an EXIF orientation, as Pillow's exif_transpose turns them."""
    turn = _ORIENT.get(orientation)
    return pixels if turn is None else np.ascontiguousarray(turn(pixels))


def opencv_rgb(data: bytes) -> np.ndarray | None:
    """OpenCV's decode of a JPEG file's bytes to RGB, its own EXIF handling off; None where it fails."""
    flags = cv2.IMREAD_IGNORE_ORIENTATION
    as_rgb = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.11 decodes to RGB itself
    buffer = np.frombuffer(data, dtype=np.uint8)
    try:
        pixels = cv2.imdecode(buffer, flags | (as_rgb if as_rgb is not None else cv2.IMREAD_COLOR))
    except cv2.error:  # over OpenCV's own size limits, say: Pillow decides
        return None
    if pixels is None or pixels.ndim != 3:
        return None
    return pixels if as_rgb is not None else cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)


def _probe_jpegs() -> list[bytes]:
    """Small JPEGs of each chroma subsampling, progressive and with restart markers, odd-sized."""
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 96, (53, 71, 3), dtype=np.uint8)
    ramp = np.linspace(0, 150, 71, dtype=np.float32)[None, :, None]
    image = Image.fromarray(np.clip(noise + ramp, 0, 255).astype(np.uint8))
    found = []
    for options in (
        {"quality": 90, "subsampling": 0},
        {"quality": 90, "subsampling": 1},
        {"quality": 90, "subsampling": 2},
        {"quality": 75, "progressive": True},
        {"quality": 60, "restart_marker_blocks": 3},
    ):
        out = io.BytesIO()
        image.save(out, "JPEG", **options)
        found.append(out.getvalue())
    return found


@lru_cache(maxsize=1)
def exact_jpeg_decoder() -> RgbDecoder | None:
    """OpenCV's JPEG decoder where it gives Pillow's pixels on every probe (both bundle libjpeg-turbo and
    decode with its defaults); None, with a warning, where this process's builds differ."""
    for index, data in enumerate(_probe_jpegs()):
        with Image.open(io.BytesIO(data)) as img:
            expected = np.asarray(img.convert("RGB"))
        got = opencv_rgb(data)
        if got is None or not np.array_equal(got, expected):
            log.warning(
                "detq: OpenCV decodes probe JPEG %d differently from Pillow: JPEGs are decoded by Pillow",
                index,
            )
            return None
    return opencv_rgb
