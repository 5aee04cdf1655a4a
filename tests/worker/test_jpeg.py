"""OpenCV's JPEG decode: Pillow's exact pixels on this build; EXIF orientations turned as Pillow does."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from worker import jpeg as jpeg_module
from worker.jpeg import exact_jpeg_decoder, opencv_rgb, orient


def _photo(width: int = 97, height: int = 61) -> Image.Image:
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 120, (height, width, 3), dtype=np.uint8)
    ramp = np.linspace(0, 130, width, dtype=np.float32)[None, :, None]
    return Image.fromarray(np.clip(noise + ramp, 0, 255).astype(np.uint8))


def _jpeg(image: Image.Image, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


def _pillow(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def test_this_build_decodes_jpegs_as_pillow_does() -> None:
    # The probes passed: the worker and the ceiling decode JPEGs with OpenCV here
    assert exact_jpeg_decoder() is opencv_rgb


@pytest.mark.parametrize(
    "options",
    [
        {"quality": 95, "subsampling": 0},
        {"quality": 85, "subsampling": 1},
        {"quality": 70, "subsampling": 2, "optimize": True},
        {"quality": 90, "progressive": True},
    ],
)
def test_opencv_gives_pillows_pixels(options: dict[str, object]) -> None:
    data = _jpeg(_photo(1283, 961), **options)
    pixels = opencv_rgb(data)
    assert pixels is not None and pixels.dtype == np.uint8 and pixels.flags["C_CONTIGUOUS"]
    assert np.array_equal(pixels, _pillow(data))


def test_what_opencv_cannot_read_is_none() -> None:
    assert opencv_rgb(b"not a jpeg at all") is None


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_turns_pixels_as_pillows_exif_transpose(orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _jpeg(_photo(), quality=90, exif=exif.tobytes())
    with Image.open(io.BytesIO(data)) as img:
        expected = np.asarray(ImageOps.exif_transpose(img))
    pixels = opencv_rgb(data)
    assert pixels is not None
    turned = orient(pixels, orientation)
    assert turned.shape == expected.shape and turned.flags["C_CONTIGUOUS"]
    assert np.array_equal(turned, expected)


def test_a_build_whose_pixels_differ_leaves_jpegs_to_pillow(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an OpenCV whose decode is one grey level off Pillow's
    def off_by_one(data: bytes) -> np.ndarray | None:
        pixels = opencv_rgb(data)
        return None if pixels is None else pixels ^ 1

    monkeypatch.setattr(jpeg_module, "opencv_rgb", off_by_one)
    jpeg_module.exact_jpeg_decoder.cache_clear()
    try:
        # Then the probes find it out: no OpenCV decoder, and a warning says Pillow decodes the JPEGs
        assert jpeg_module.exact_jpeg_decoder() is None
        assert "JPEGs are decoded by Pillow" in caplog.text
    finally:
        jpeg_module.exact_jpeg_decoder.cache_clear()
