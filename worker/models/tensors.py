"""Pixels to torch tensors on the model's device: the uint8 pixels travel, the float conversion runs there."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from PIL import Image

CPU = torch.device("cpu")

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


def to_tensor(image: Image.Image, device: torch.device = CPU) -> torch.Tensor:
    """RGB PIL image to a CHW float tensor in [0, 1] on device."""
    pixels = pixels_on(np.asarray(image, dtype=np.uint8), device)
    return pixels.permute(2, 0, 1).float().div_(255.0)
