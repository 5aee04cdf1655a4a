"""Letterbox/stretch geometry, the padded canvas, the inverse box transform and batching."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from worker.models.letterbox import (
    IDENTITY,
    InputTransform,
    images_to_batch,
    letterbox_image,
    letterbox_transform,
    stretch_image,
)


def test_landscape_1280x720_into_640_pads_top_and_bottom() -> None:
    transform, new_size, offset = letterbox_transform(1280, 720, 640, 640)
    assert new_size == (640, 360)
    assert offset == (0, 140)  # (640 - 360) / 2 = 140
    assert transform == InputTransform(scale_x=0.5, scale_y=0.5, pad_x=0.0, pad_y=140.0)


def test_portrait_480x640_into_640_pads_left_and_right() -> None:
    transform, new_size, offset = letterbox_transform(480, 640, 640, 640)
    assert new_size == (480, 640)
    assert offset == (80, 0)
    assert transform == InputTransform(scale_x=1.0, scale_y=1.0, pad_x=80.0, pad_y=0.0)


def test_small_square_is_scaled_up() -> None:
    transform, new_size, offset = letterbox_transform(100, 100, 640, 640)
    assert new_size == (640, 640)
    assert offset == (0, 0)
    assert transform.scale_x == transform.scale_y == 6.4


def test_odd_padding_goes_right_and_bottom_as_in_ultralytics() -> None:
    # 1000x333 into 640x640: r = 0.64, new 640x213, dh = 213.5 -> top round(213.4) = 213, bottom gets 214.
    transform, new_size, offset = letterbox_transform(1000, 333, 640, 640)
    assert new_size == (640, 213)
    assert offset == (0, 213)
    assert transform.scale_y == pytest.approx(213 / 333)  # exact per-axis scale, not r


def test_non_square_destination() -> None:
    # 1920x1080 into 640 wide x 384 high: r = min(384/1080, 640/1920) = 1/3, new 640x360, dh = 12.
    _, new_size, offset = letterbox_transform(1920, 1080, 640, 384)
    assert new_size == (640, 360)
    assert offset == (0, 12)


def test_round_trip_maps_a_box_back_to_source_pixels() -> None:
    transform, _, _ = letterbox_transform(1280, 720, 640, 640)
    source_box = [100.0, 50.0, 900.0, 700.0]
    # Forward by hand: x_in = x_src * 0.5 + 0, y_in = y_src * 0.5 + 140.
    model_box = torch.tensor([[50.0, 165.0, 450.0, 490.0]])
    back = transform.to_source(model_box)
    assert torch.allclose(back, torch.tensor([source_box]), atol=1e-4)
    assert model_box.tolist() == [[50.0, 165.0, 450.0, 490.0]]  # input untouched


def test_round_trip_with_inexact_scale() -> None:
    transform, _, _ = letterbox_transform(1000, 333, 640, 640)
    source = torch.tensor([[12.5, 7.0, 999.0, 330.0]])
    forward = source.clone()
    forward[:, 0::2] = forward[:, 0::2] * transform.scale_x + transform.pad_x
    forward[:, 1::2] = forward[:, 1::2] * transform.scale_y + transform.pad_y
    assert torch.allclose(transform.to_source(forward), source, atol=1e-4)


def test_identity_and_empty_boxes() -> None:
    boxes = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert IDENTITY.to_source(boxes).tolist() == boxes.tolist()
    assert IDENTITY.to_source(torch.zeros((0, 4))).shape == (0, 4)
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        IDENTITY.to_source(torch.zeros(4))


def test_letterbox_canvas_has_grey_padding_and_the_image_inside() -> None:
    img = Image.new("RGB", (1280, 720), (200, 10, 30))
    canvas, transform = letterbox_image(img, 640, 640)
    assert (canvas.shape, canvas.dtype) == ((640, 640, 3), np.uint8)
    assert transform.pad_y == 140.0
    assert canvas[139, 320].tolist() == [114, 114, 114]
    assert canvas[500, 320].tolist() == [114, 114, 114]
    assert canvas[140, 0].tolist() == [200, 10, 30]
    assert canvas[499, 639].tolist() == [200, 10, 30]


def test_letterbox_converts_mode_and_honours_fill() -> None:
    img = Image.new("L", (50, 100), 255)
    canvas, transform = letterbox_image(img, 64, 64, fill=0)
    assert canvas.shape == (64, 64, 3)
    assert (transform.pad_x, transform.pad_y) == (16.0, 0.0)
    assert canvas[32, 0].tolist() == [0, 0, 0]
    assert canvas[32, 32].tolist() == [255, 255, 255]


def test_letterbox_shrinks_with_opencv_inter_linear_not_a_smoothing_filter() -> None:
    # Given one-pixel stripes, shrunk by 2: INTER_LINEAR samples between two source pixels, no wider
    stripes = np.zeros((8, 8, 3), dtype=np.uint8)
    stripes[:, ::2] = 255
    canvas, _ = letterbox_image(Image.fromarray(stripes), 4, 4)
    # Then each output pixel is the mean of its two source pixels, as cv2.resize and Ultralytics give
    assert canvas[:, :, 0].tolist() == [[128] * 4] * 4


def test_stretch_image_scales_each_axis_without_padding() -> None:
    img = Image.new("RGB", (200, 100), (1, 2, 3))
    out, transform = stretch_image(img, 64, 64)
    assert out.shape == (64, 64, 3)
    assert out[10, 10].tolist() == [1, 2, 3]
    assert transform == InputTransform(scale_x=0.32, scale_y=0.64, pad_x=0.0, pad_y=0.0)
    back = transform.to_source(torch.tensor([[64.0, 64.0, 64.0, 64.0]]))
    assert torch.allclose(back, torch.tensor([[200.0, 100.0, 200.0, 100.0]]), atol=1e-4)


def _pixels(size: tuple[int, int], colour: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    return np.asarray(Image.new("RGB", size, colour))


def test_images_to_batch_shape_dtype_and_range() -> None:
    images = [_pixels((4, 3), (255, 0, 51)), _pixels((4, 3))]
    batch = images_to_batch(images, None, None)
    assert batch.shape == (2, 3, 3, 4)
    assert batch.dtype == torch.float32
    assert float(batch.min()) == 0.0 and float(batch.max()) == 1.0
    assert batch[0, :, 0, 0].tolist() == pytest.approx([1.0, 0.0, 0.2])


def test_images_to_batch_normalises_per_channel() -> None:
    batch = images_to_batch([_pixels((2, 2), (255, 0, 51))], [0.5, 0.5, 0.0], [0.5, 0.25, 0.1])
    assert batch[0, :, 1, 1].tolist() == pytest.approx([1.0, -2.0, 2.0])


@pytest.mark.parametrize(
    ("images", "mean", "match"),
    [
        ([], None, "at least one"),
        ([_pixels((2, 2)), _pixels((3, 2))], None, "expected 2x2"),
        ([np.zeros((2, 2), dtype=np.uint8)], None, "RGB"),
        ([_pixels((2, 2))], [0.5], "3 values"),
    ],
)
def test_images_to_batch_rejects_bad_input(
    images: list[np.ndarray], mean: list[float] | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        images_to_batch(images, mean, None)
