"""What the worker needs to know about a model: output format, class names, input size, thresholds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_FORMATS = ("torchvision",)


class ModelMetaError(ValueError):
    """The model's metadata is malformed."""


@dataclass(frozen=True)
class ModelMeta:
    """Parsed detq.json metadata of a model file."""

    format: str = "torchvision"
    classes: tuple[str, ...] = ()
    input_size: tuple[int, int] | None = None
    score_threshold: float | None = None
    name: str | None = None

    def label_name(self, label_id: int) -> str:
        """Class name of a label id, or its number when the model carries no name for it."""
        if 0 <= label_id < len(self.classes):
            return self.classes[label_id]
        return str(label_id)


def parse_model_meta(raw: dict[str, Any]) -> ModelMeta:
    """Validate a detq.json dict into ModelMeta."""
    fmt = str(raw.get("format", "torchvision"))
    if fmt not in SUPPORTED_FORMATS:
        raise ModelMetaError(f"unsupported model format {fmt!r}; supported: {', '.join(SUPPORTED_FORMATS)}")
    classes = raw.get("classes", [])
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise ModelMetaError("'classes' must be a list of names")
    input_size = raw.get("input_size")
    size: tuple[int, int] | None = None
    if input_size is not None:
        if (
            not isinstance(input_size, list)
            or len(input_size) != 2
            or not all(isinstance(v, int) and v > 0 for v in input_size)
        ):
            raise ModelMetaError("'input_size' must be [height, width] in pixels")
        size = (input_size[0], input_size[1])
    threshold = raw.get("score_threshold")
    if threshold is not None and not (isinstance(threshold, int | float) and 0 <= threshold <= 1):
        raise ModelMetaError("'score_threshold' must be a number in [0, 1]")
    name = raw.get("name")
    return ModelMeta(
        format=fmt,
        classes=tuple(classes),
        input_size=size,
        score_threshold=float(threshold) if threshold is not None else None,
        name=str(name) if name is not None else None,
    )
