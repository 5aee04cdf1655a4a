"""Fit images to a model's input (letterbox or stretch, as Ultralytics does), batch them, map boxes back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from worker.models.tensors import CPU, Pixels, pixels_on, rgb_array, size_of


@dataclass(frozen=True)
class InputTransform:
    """Maps model-input pixels back to source-image pixels: x_src = (x_in - pad_x) / scale_x."""

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float

    def to_source(self, boxes: torch.Tensor) -> torch.Tensor:
        """Map [N, 4] x1, y1, x2, y2 boxes from model-input pixels to source pixels (a new tensor)."""
        if boxes.dim() != 2 or boxes.shape[1] != 4:
            raise ValueError(f"boxes must be [N, 4], got {tuple(boxes.shape)}")
        out = boxes.to(torch.float32) if not boxes.is_floating_point() else boxes.clone()
        out[:, 0::2] = (out[:, 0::2] - self.pad_x) / self.scale_x
        out[:, 1::2] = (out[:, 1::2] - self.pad_y) / self.scale_y
        return out


IDENTITY = InputTransform(scale_x=1.0, scale_y=1.0, pad_x=0.0, pad_y=0.0)


def letterbox_transform(
    src_w: int, src_h: int, dst_w: int, dst_h: int
) -> tuple[InputTransform, tuple[int, int], tuple[int, int]]:
    """Ultralytics LetterBox geometry (centred, may scale up): (transform, (new_w, new_h), (left, top))."""
    if min(src_w, src_h, dst_w, dst_h) <= 0:
        raise ValueError(f"sizes must be positive, got {src_w}x{src_h} into {dst_w}x{dst_h}")
    r = min(dst_h / src_h, dst_w / src_w)
    # max(1, ...) keeps an extreme aspect ratio from rounding a side to zero pixels.
    new_w, new_h = max(1, round(src_w * r)), max(1, round(src_h * r))
    dw, dh = (dst_w - new_w) / 2, (dst_h - new_h) / 2
    # The -0.1 mirrors ultralytics' LetterBox, which puts the odd pixel of padding on the right/bottom.
    left, top = round(dw - 0.1), round(dh - 0.1)
    transform = InputTransform(
        scale_x=new_w / src_w, scale_y=new_h / src_h, pad_x=float(left), pad_y=float(top)
    )
    return transform, (new_w, new_h), (left, top)


def _resize(pixels: np.ndarray, new_w: int, new_h: int) -> np.ndarray:
    # OpenCV's INTER_LINEAR, as Ultralytics' LetterBox: it does not smooth when it shrinks, Pillow's
    # BILINEAR does, and the two give different boxes on a downscaled photo.
    if pixels.shape[1] == new_w and pixels.shape[0] == new_h:
        return pixels
    return cv2.resize(pixels, (new_w, new_h), interpolation=cv2.INTER_LINEAR)


def letterbox_image(
    img: Pixels, dst_w: int, dst_h: int, fill: int = 114
) -> tuple[np.ndarray, InputTransform]:
    """Resize keeping the aspect ratio and pad to dst_w x dst_h with grey `fill`, centred, exactly as
    Ultralytics' predict does: HxWx3 uint8 RGB."""
    transform, (new_w, new_h), (left, top) = letterbox_transform(*size_of(img), dst_w, dst_h)
    resized = _resize(rgb_array(img), new_w, new_h)
    right, bottom = dst_w - new_w - left, dst_h - new_h - top
    canvas = cv2.copyMakeBorder(
        resized, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(fill, fill, fill)
    )
    return canvas, transform


def stretch_image(img: Pixels, dst_w: int, dst_h: int) -> tuple[np.ndarray, InputTransform]:
    """Resize to dst_w x dst_h ignoring the aspect ratio: HxWx3 uint8 RGB."""
    width, height = size_of(img)
    if min(width, height, dst_w, dst_h) <= 0:
        raise ValueError(f"sizes must be positive, got {width}x{height} into {dst_w}x{dst_h}")
    resized = _resize(rgb_array(img), dst_w, dst_h)
    transform = InputTransform(scale_x=dst_w / width, scale_y=dst_h / height, pad_x=0.0, pad_y=0.0)
    return resized, transform


def images_to_batch(
    images: Sequence[np.ndarray],
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    device: torch.device = CPU,
) -> torch.Tensor:
    """Stack same-size HxWx3 uint8 RGB images into float32 [B, 3, H, W] in [0, 1] on device, then
    (x - mean) / std if given. The pixels travel as uint8; the arithmetic runs on the device."""
    if not images:
        raise ValueError("images_to_batch needs at least one image")
    shape = images[0].shape
    for i, pixels in enumerate(images):
        if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
            raise ValueError(f"image {i} is {pixels.dtype} {pixels.shape}; expected H x W x 3 uint8 RGB")
        if pixels.shape != shape:
            raise ValueError(
                f"image {i} is {pixels.shape[1]}x{pixels.shape[0]}, expected {shape[1]}x{shape[0]}"
            )
    stacked = pixels_on(np.stack(images), device)  # [B, H, W, 3]
    batch = stacked.permute(0, 3, 1, 2).to(torch.float32).div_(255.0).contiguous()
    if mean is not None:
        batch.sub_(_per_channel(mean, "mean").to(device))
    if std is not None:
        std_t = _per_channel(std, "std")
        if bool((std_t == 0).any()):
            raise ValueError("std must not contain zeros")
        batch.div_(std_t.to(device))
    return batch


def _per_channel(values: Sequence[float], name: str) -> torch.Tensor:
    if len(values) != 3:
        raise ValueError(f"{name} must have 3 values (R, G, B), got {len(values)}")
    return torch.tensor([float(v) for v in values], dtype=torch.float32).view(1, 3, 1, 1)
