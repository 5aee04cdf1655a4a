"""Decode an image file: bounded size, EXIF orientation, RGB; JPEG draft near the model's size, or OpenCV."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from worker.jpeg import RgbDecoder, orient

# EXIF orientations 5-8 transpose the image: raw width becomes displayed height.
_TRANSPOSING_ORIENTATIONS = frozenset({5, 6, 7, 8})
_EXIF_ORIENTATION_TAG = 0x0112
_END_OF_IMAGE = b"\xff\xd9"
# Longer side over shorter side; panoramas reach about 10:1, line-scan strips far more.
MAX_ASPECT_RATIO = 100


class ImageRejected(Exception):
    """Policy refuses the image (too large in bytes or pixels)."""


class ImageUnreadable(Exception):
    """The file's content cannot be decoded as an image (empty, truncated, not an image): so until the file
    changes. A read that fails (an OSError with an errno) is not this: it may work next time."""


@dataclass(frozen=True)
class Geometry:
    """An image's size in original pixels, and the factors that map its decoded pixels back to them."""

    width: int
    height: int
    scale_x: float
    scale_y: float


@dataclass(frozen=True)
class DecodedImage(Geometry):
    """An RGB image ready for the model (a Pillow image, or H x W x 3 uint8 pixels), with its geometry."""

    image: Image.Image | np.ndarray

    def geometry(self) -> Geometry:
        """The geometry alone: what is left to keep once the pixels are in the model's input."""
        return Geometry(width=self.width, height=self.height, scale_x=self.scale_x, scale_y=self.scale_y)


def _orientation(img: Image.Image) -> int:
    try:
        value = img.getexif().get(_EXIF_ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001 - a broken EXIF block must not sink a readable image
        return 1
    return value if isinstance(value, int) else 1


def decode_image(
    source: Path | BinaryIO,
    *,
    target_size: tuple[int, int] | None,
    max_pixels: int,
    max_bytes: int,
    jpeg: RgbDecoder | None = None,
) -> DecodedImage:
    """Decode a file (a path, or a file already opened) to RGB in its displayed orientation, reduced
    toward `target_size` (height, width).

    The returned width/height are the original displayed size; scale_x/scale_y convert decoded pixels
    to original pixels. Raises ImageRejected or ImageUnreadable with a reason. With `jpeg` (see
    worker.jpeg.exact_jpeg_decoder) and no target, a whole 8-bit RGB JPEG is decoded by it instead of Pillow:
    the same pixels, as an array; a file it cannot read goes to Pillow, which names the problem.
    """
    size = os.stat(source).st_size if isinstance(source, Path) else os.fstat(source.fileno()).st_size
    if size == 0:
        raise ImageUnreadable("empty file (0 bytes)")
    if size > max_bytes:
        raise ImageRejected(f"file is {size} bytes, over the limit of {max_bytes}")
    try:
        with warnings.catch_warnings():
            # We enforce our own pixel limit below, before any pixel is decoded.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(source)
    except Image.DecompressionBombError as exc:
        # Pillow's own message names twice our limit, its threshold for refusing to open at all.
        raise ImageRejected(
            f"image is over the limit of {max_pixels} pixels (refused before decoding: decompression bomb)"
        ) from exc
    except UnidentifiedImageError as exc:
        raise ImageUnreadable("not a recognised image format") from exc
    except OSError as exc:
        if exc.errno is not None:
            raise  # the file could not be read (EIO on a share, EACCES): not the image's content
        raise ImageUnreadable(f"cannot open image: {exc}") from exc
    try:
        whole = _reader(jpeg, source, size)
        return _decode_opened(img, target_size=target_size, max_pixels=max_pixels, jpeg=whole)
    finally:
        img.close()


def _reader(jpeg: RgbDecoder | None, source: Path | BinaryIO, size: int) -> JpegReader | None:
    """How to decode the whole file with `jpeg`: its `size` bytes (checked against the limit), from the
    start of a path or of an open file."""
    if jpeg is None:
        return None

    def read() -> np.ndarray | None:
        if isinstance(source, Path):
            with source.open("rb") as handle:
                data = handle.read(size)
        else:
            data = os.pread(source.fileno(), size, 0)
        # Pillow fails a file cut short ("image file is truncated") where libjpeg fills in grey: one
        # whose last bytes are not its end marker goes to Pillow (as does one with bytes after it).
        return jpeg(data) if data.endswith(_END_OF_IMAGE) else None

    return read


JpegReader = Callable[[], "np.ndarray | None"]


def _decode_opened(
    img: Image.Image, *, target_size: tuple[int, int] | None, max_pixels: int, jpeg: JpegReader | None = None
) -> DecodedImage:
    raw_w, raw_h = img.size
    if raw_w <= 0 or raw_h <= 0:
        raise ImageUnreadable(f"invalid image size {raw_w}x{raw_h}")
    if raw_w * raw_h > max_pixels:
        raise ImageRejected(
            f"image is {raw_w}x{raw_h} = {raw_w * raw_h} pixels, over the limit of {max_pixels}"
        )
    if max(raw_w, raw_h) > MAX_ASPECT_RATIO * min(raw_w, raw_h):
        # Checked on the header, before a pixel is decoded: a 2 x 1,000,000 strip under the pixel limit
        # would otherwise become a full-size tensor that no detector input can show anyway.
        raise ImageRejected(f"image is {raw_w}x{raw_h}, an aspect ratio over {MAX_ASPECT_RATIO}:1")
    orientation = _orientation(img)
    transposed = orientation in _TRANSPOSING_ORIENTATIONS
    width, height = (raw_h, raw_w) if transposed else (raw_w, raw_h)
    if jpeg is not None and target_size is None and _whole_rgb_jpeg(img):
        pixels = jpeg()
        if pixels is not None and pixels.shape == (raw_h, raw_w, 3):
            return DecodedImage(
                image=orient(pixels, orientation), width=width, height=height, scale_x=1.0, scale_y=1.0
            )
    try:
        if target_size is not None and img.format == "JPEG":
            target_h, target_w = target_size
            # draft() picks the largest DCT scale whose result is still at least the requested raw size.
            want = (target_h, target_w) if transposed else (target_w, target_h)
            img.draft("RGB", want)
        img.load()
        oriented = ImageOps.exif_transpose(img) or img
        rgb = oriented if oriented.mode == "RGB" else oriented.convert("RGB")
        if target_size is not None:
            rgb = _reduce_toward(rgb, target_size)
    except Image.DecompressionBombError as exc:
        raise ImageRejected(f"decompression bomb: {exc}") from exc
    except OSError as exc:
        if exc.errno is not None:
            raise  # a read that failed (Pillow reads the file as it decodes): not the image's content
        raise ImageUnreadable(f"cannot decode image (corrupt or truncated): {exc}") from exc
    except (SyntaxError, ValueError) as exc:
        raise ImageUnreadable(f"cannot decode image (corrupt or truncated): {exc}") from exc
    dec_w, dec_h = rgb.size
    return DecodedImage(image=rgb, width=width, height=height, scale_x=width / dec_w, scale_y=height / dec_h)


def _whole_rgb_jpeg(img: Image.Image) -> bool:
    """An 8-bit JPEG that Pillow decodes to RGB (YCbCr or RGB; not CMYK, grey, 12-bit nor MPO)."""
    return img.format == "JPEG" and img.mode == "RGB" and getattr(img, "bits", 8) == 8


def _reduce_toward(img: Image.Image, target_size: tuple[int, int]) -> Image.Image:
    """Shrink by an integer factor while both sides stay at least the target (cheap, box-filtered)."""
    target_h, target_w = target_size
    factor = min(img.width // max(target_w, 1), img.height // max(target_h, 1))
    if factor >= 2:
        return img.reduce(factor)
    return img
