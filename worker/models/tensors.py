"""Pixels to torch tensors on the model's device: the uint8 pixels travel, the float conversion runs there."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from PIL import Image

CPU = torch.device("cpu")

# A decoded image: a Pillow image, or H x W x 3 uint8 RGB pixels (worker.decode's OpenCV JPEG path).
Pixels = Image.Image | np.ndarray

# Pillow's pixels come as a read-only array, and torch warns (once) that a tensor over it could write it.
# Ours are only read: the float conversion makes the tensor the model gets. Filtered here, once, rather
# than with catch_warnings on every image, which is not safe beside the decode threads.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


def pixels_on(array: np.ndarray, device: torch.device = CPU) -> torch.Tensor:
    """A uint8 array as a tensor on device, never written: shared with the array on the CPU; on a GPU
    copied from pinned memory without blocking (what is queued after it on the stream waits for it)."""
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def size_of(image: Pixels | torch.Tensor) -> tuple[int, int]:
    """(width, height) of a decoded image, or of a model's input made ahead as C x H x W floats."""
    if isinstance(image, torch.Tensor):
        return int(image.shape[-1]), int(image.shape[-2])
    if isinstance(image, np.ndarray):
        return int(image.shape[1]), int(image.shape[0])
    return image.size


def rgb_array(image: Pixels) -> np.ndarray:
    """H x W x 3 uint8 RGB pixels of a decoded image (an array as it is; a Pillow image copied out)."""
    if isinstance(image, np.ndarray):
        return image
    return np.asarray(image if image.mode == "RGB" else image.convert("RGB"), dtype=np.uint8)


def to_tensor(image: Pixels, device: torch.device = CPU) -> torch.Tensor:
    """An RGB image (Pillow, or H x W x 3 uint8) to a CHW float tensor in [0, 1] on device."""
    pixels = pixels_on(rgb_array(image), device)
    return pixels.permute(2, 0, 1).float().div_(255.0)
