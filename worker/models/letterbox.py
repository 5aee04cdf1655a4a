"""Fit images to a model's input (letterbox or stretch), batch them, and map boxes back to source pixels."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image


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


def letterbox_image(
    img: Image.Image, dst_w: int, dst_h: int, fill: int = 114
) -> tuple[Image.Image, InputTransform]:
    """Resize keeping the aspect ratio and pad to dst_w x dst_h RGB with grey `fill`, centred."""
    transform, (new_w, new_h), (left, top) = letterbox_transform(img.width, img.height, dst_w, dst_h)
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    resized = rgb if rgb.size == (new_w, new_h) else rgb.resize((new_w, new_h), Image.Resampling.BILINEAR)
    canvas = Image.new("RGB", (dst_w, dst_h), (fill, fill, fill))
    canvas.paste(resized, (left, top))
    return canvas, transform


def stretch_image(img: Image.Image, dst_w: int, dst_h: int) -> tuple[Image.Image, InputTransform]:
    """Resize to dst_w x dst_h RGB ignoring the aspect ratio."""
    if min(img.width, img.height, dst_w, dst_h) <= 0:
        raise ValueError(f"sizes must be positive, got {img.width}x{img.height} into {dst_w}x{dst_h}")
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    resized = rgb if rgb.size == (dst_w, dst_h) else rgb.resize((dst_w, dst_h), Image.Resampling.BILINEAR)
    transform = InputTransform(scale_x=dst_w / img.width, scale_y=dst_h / img.height, pad_x=0.0, pad_y=0.0)
    return resized, transform


def images_to_batch(
    images: Sequence[Image.Image], mean: Sequence[float] | None, std: Sequence[float] | None
) -> torch.Tensor:
    """Stack same-size RGB images into float32 [B, 3, H, W] in [0, 1], then (x - mean) / std if given."""
    if not images:
        raise ValueError("images_to_batch needs at least one image")
    size = images[0].size
    for i, img in enumerate(images):
        if img.mode != "RGB":
            raise ValueError(f"image {i} has mode {img.mode!r}; convert it to RGB first")
        if img.size != size:
            raise ValueError(f"image {i} is {img.size[0]}x{img.size[1]}, expected {size[0]}x{size[1]}")
    array = np.stack([np.asarray(img, dtype=np.uint8) for img in images])  # [B, H, W, 3]
    batch = torch.from_numpy(array).permute(0, 3, 1, 2).to(torch.float32).div_(255.0).contiguous()
    if mean is not None:
        batch.sub_(_per_channel(mean, "mean"))
    if std is not None:
        std_t = _per_channel(std, "std")
        if bool((std_t == 0).any()):
            raise ValueError("std must not contain zeros")
        batch.div_(std_t)
    return batch


def _per_channel(values: Sequence[float], name: str) -> torch.Tensor:
    if len(values) != 3:
        raise ValueError(f"{name} must have 3 values (R, G, B), got {len(values)}")
    return torch.tensor([float(v) for v in values], dtype=torch.float32).view(1, 3, 1, 1)
