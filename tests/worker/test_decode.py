"""Decoding: bounded sizes, EXIF orientation, JPEG draft toward the model size, clear failure reasons."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support import write_jpeg
from worker.decode import Geometry, ImageRejected, ImageUnreadable, decode_image
from worker.jpeg import exact_jpeg_decoder

LIMITS = {"max_pixels": 50_000_000, "max_bytes": 50_000_000}


def test_full_decode_without_target_keeps_size(tmp_path: Path) -> None:
    path = write_jpeg(tmp_path / "a.jpg", (640, 480))
    decoded = decode_image(path, target_size=None, **LIMITS)
    assert decoded.image.size == (640, 480)
    assert (decoded.width, decoded.height) == (640, 480)
    assert decoded.scale_x == decoded.scale_y == 1.0


def test_jpeg_draft_reduces_toward_target_and_reports_scale(tmp_path: Path) -> None:
    path = write_jpeg(tmp_path / "big.jpg", (4000, 3000))
    decoded = decode_image(path, target_size=(240, 320), **LIMITS)
    w, h = decoded.image.size
    # Given a 320x240 target, draft picks 1/8 scale: 500x375, still at least the target.
    assert (w, h) == (500, 375)
    assert (decoded.width, decoded.height) == (4000, 3000)
    assert decoded.scale_x == pytest.approx(8.0)
    assert decoded.scale_y == pytest.approx(8.0)


def test_png_is_reduced_by_integer_factor(tmp_path: Path) -> None:
    path = tmp_path / "big.png"
    Image.new("L", (1200, 900), 128).save(path)
    decoded = decode_image(path, target_size=(200, 200), **LIMITS)
    assert decoded.image.mode == "RGB"
    assert decoded.image.size == (300, 225)
    assert decoded.scale_x == pytest.approx(4.0)


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    path = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise for display
    Image.new("RGB", (400, 200), (10, 20, 30)).save(path, "JPEG", exif=exif.tobytes())
    decoded = decode_image(path, target_size=None, **LIMITS)
    assert (decoded.width, decoded.height) == (200, 400)
    assert decoded.image.size == (200, 400)


def test_exif_orientation_with_draft_keeps_scale_per_axis(tmp_path: Path) -> None:
    path = tmp_path / "rotated_big.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (1600, 800), (10, 20, 30)).save(path, "JPEG", exif=exif.tobytes())
    decoded = decode_image(path, target_size=(200, 100), **LIMITS)
    assert (decoded.width, decoded.height) == (800, 1600)
    dw, dh = decoded.image.size
    assert dw >= 100 and dh >= 200
    assert decoded.scale_x == pytest.approx(800 / dw)
    assert decoded.scale_y == pytest.approx(1600 / dh)


def test_empty_file_fails(tmp_path: Path) -> None:
    (tmp_path / "e.jpg").write_bytes(b"")
    with pytest.raises(ImageUnreadable, match="empty file"):
        decode_image(tmp_path / "e.jpg", target_size=None, **LIMITS)


def test_text_file_fails(tmp_path: Path) -> None:
    (tmp_path / "t.jpg").write_text("hello")
    with pytest.raises(ImageUnreadable, match="not a recognised image"):
        decode_image(tmp_path / "t.jpg", target_size=None, **LIMITS)


def test_truncated_jpeg_fails(tmp_path: Path) -> None:
    full = write_jpeg(tmp_path / "full.jpg", (640, 480)).read_bytes()
    (tmp_path / "cut.jpg").write_bytes(full[: len(full) // 3])
    with pytest.raises(ImageUnreadable, match="truncated"):
        decode_image(tmp_path / "cut.jpg", target_size=None, **LIMITS)


def test_too_many_pixels_is_rejected_before_decoding(tmp_path: Path) -> None:
    path = write_jpeg(tmp_path / "wide.jpg", (3000, 2000))
    with pytest.raises(ImageRejected, match="over the limit"):
        decode_image(path, target_size=None, max_pixels=1_000_000, max_bytes=10_000_000)


def test_decompression_bomb_is_rejected(tmp_path: Path) -> None:
    # Given a tiny PNG file that claims a huge pixel area (a classic decompression bomb)
    path = tmp_path / "bomb.png"
    Image.new("1", (20000, 20000), 0).save(path, optimize=True)
    assert path.stat().st_size < 200_000
    # Then it is refused on its header, without decoding 400 megapixels, naming our limit
    with pytest.raises(ImageRejected, match=f"over the limit of {LIMITS['max_pixels']} pixels"):
        decode_image(path, target_size=None, **LIMITS)


def test_file_too_large_is_rejected(tmp_path: Path) -> None:
    path = write_jpeg(tmp_path / "a.jpg", (64, 64))
    with pytest.raises(ImageRejected, match="bytes"):
        decode_image(path, target_size=None, max_pixels=10**8, max_bytes=10)


def test_an_extreme_aspect_ratio_is_rejected_on_its_header(tmp_path: Path) -> None:
    # Given a 2 x 1,000,000 PNG: 2 megapixels, under the pixel limit, a few KB on disk
    path = tmp_path / "strip.png"
    Image.new("RGB", (1_000_000, 2), (10, 20, 30)).save(path)
    assert path.stat().st_size < 50_000
    # Then it is refused before decoding, in both orientations of the same file
    with pytest.raises(ImageRejected, match="aspect ratio over 100:1"):
        decode_image(path, target_size=(256, 256), **LIMITS)
    tall = tmp_path / "tall.png"
    Image.new("RGB", (3, 400), (1, 2, 3)).save(tall)
    with pytest.raises(ImageRejected, match="1000000x2|3x400"):
        decode_image(tall, target_size=None, **LIMITS)
    # And a panorama-like 10:1 image still decodes
    wide = tmp_path / "pano.png"
    Image.new("RGB", (1000, 100), (1, 2, 3)).save(wide)
    assert decode_image(wide, target_size=None, **LIMITS).width == 1000


def test_whole_jpegs_decoded_by_opencv_are_pillows_pixels_turned(tmp_path: Path) -> None:
    # Given a photo-like JPEG shown rotated (EXIF 6), decoded from a path and from an open file
    rng = np.random.default_rng(1)
    pixels = np.clip(rng.integers(0, 90, (300, 400, 3)) + np.arange(400)[None, :, None] // 3, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "photo.jpg"
    Image.fromarray(pixels.astype(np.uint8)).save(path, "JPEG", quality=88, exif=exif.tobytes())
    pillow = decode_image(path, target_size=None, **LIMITS)
    by_path = decode_image(path, target_size=None, jpeg=exact_jpeg_decoder(), **LIMITS)
    with path.open("rb") as handle:
        by_handle = decode_image(handle, target_size=None, jpeg=exact_jpeg_decoder(), **LIMITS)
    # Then OpenCV's pixels come as an array, equal to Pillow's, with the same geometry
    for decoded in (by_path, by_handle):
        assert isinstance(decoded.image, np.ndarray)
        assert np.array_equal(decoded.image, np.asarray(pillow.image))
        assert decoded.geometry() == pillow.geometry() == Geometry(300, 400, 1.0, 1.0)


def test_a_jpeg_cut_short_fails_as_pillow_says_whatever_the_decoder(tmp_path: Path) -> None:
    full = write_jpeg(tmp_path / "full.jpg", (640, 480)).read_bytes()
    (tmp_path / "cut.jpg").write_bytes(full[: len(full) // 3])
    (tmp_path / "no_end.jpg").write_bytes(full[:-2])
    for name in ("cut.jpg", "no_end.jpg"):
        with pytest.raises(ImageUnreadable, match="truncated"):
            decode_image(tmp_path / name, target_size=None, jpeg=exact_jpeg_decoder(), **LIMITS)


def test_jpegs_opencv_is_not_used_for_go_to_pillow(tmp_path: Path) -> None:
    # Given a grey JPEG, a CMYK one and one with bytes after its end marker
    Image.new("L", (64, 48), 77).save(tmp_path / "grey.jpg", "JPEG")
    Image.new("CMYK", (64, 48), (10, 200, 30, 5)).save(tmp_path / "cmyk.jpg", "JPEG")
    tail = write_jpeg(tmp_path / "tail.jpg", (64, 48))
    tail.write_bytes(tail.read_bytes() + b"\0" * 16)
    for name in ("grey.jpg", "cmyk.jpg", "tail.jpg"):
        decoded = decode_image(tmp_path / name, target_size=None, jpeg=exact_jpeg_decoder(), **LIMITS)
        # Then Pillow decodes them to RGB as before
        assert isinstance(decoded.image, Image.Image) and decoded.image.mode == "RGB"
        assert decoded.image.size == (64, 48)
