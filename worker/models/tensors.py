"""PIL images to torch tensors."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


def to_tensor(image: Image.Image) -> torch.Tensor:
    """RGB PIL image to a CHW float tensor in [0, 1]."""
    array = np.asarray(image, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255.0)
