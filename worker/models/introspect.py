"""What a loaded torchvision detector says about its own input: the size its transform resizes toward."""

from __future__ import annotations

from typing import Any


def torchvision_fixed_size(module: Any) -> tuple[int, int] | None:
    """(height, width) a torchvision detector's GeneralizedRCNNTransform resizes every image to (SSD and
    SSDlite: its fixed_size, stored as width, height); None where it keeps the aspect ratio, or for any
    other model."""
    fixed = getattr(getattr(module, "transform", None), "fixed_size", None)
    if (
        isinstance(fixed, tuple | list)
        and len(fixed) == 2
        and all(isinstance(v, int) and v > 0 for v in fixed)
    ):
        return int(fixed[1]), int(fixed[0])
    return None


def torchvision_input_size(module: Any) -> tuple[int, int] | None:
    """(height, width) a torchvision detector's GeneralizedRCNNTransform resizes to or toward: its fixed_size
    (torchvision_fixed_size), else its shortest min_size on both sides; None for any other model."""
    transform = getattr(module, "transform", None)
    if transform is None:
        return None
    fixed = torchvision_fixed_size(module)
    if fixed is not None:
        return fixed
    smallest = getattr(transform, "min_size", None)
    sizes = smallest if isinstance(smallest, tuple | list) else (smallest,)
    valid = [int(v) for v in sizes if isinstance(v, int) and v > 0]
    return (min(valid), min(valid)) if valid else None
