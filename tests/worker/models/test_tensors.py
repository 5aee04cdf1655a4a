"""Pixels to tensors: the exact float conversion, and Pillow's pixels shared rather than copied on the CPU."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from worker.models.tensors import pixels_on, to_tensor


def _image() -> Image.Image:
    rng = np.random.default_rng(3)
    return Image.fromarray(rng.integers(0, 256, (24, 16, 3), dtype=np.uint8))


def test_to_tensor_is_chw_float_in_zero_one_exactly() -> None:
    image = _image()
    reference = torch.from_numpy(np.array(image)).permute(2, 0, 1).to(torch.float32) / 255.0
    tensor = to_tensor(image)
    assert tensor.dtype == torch.float32 and tensor.shape == (3, 24, 16)
    assert torch.equal(tensor, reference)


def test_pixels_on_the_cpu_share_pillows_read_only_array_instead_of_copying_it() -> None:
    array = np.asarray(_image(), dtype=np.uint8)
    assert not array.flags.writeable  # the case that was copied before
    assert pixels_on(array).data_ptr() == array.ctypes.data
