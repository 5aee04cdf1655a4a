"""What the worker knows of a model: output format, classes, input size, thresholds, and their source."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

FORMATS = ("torchvision", "yolov5", "yolov8", "boxes")
FIXED_INPUT_FORMATS = ("yolov5", "yolov8", "boxes")
DEFAULT_FIXED_INPUT = (640, 640)
# Ultralytics predict defaults, also used for final-box models without thresholds of their own.
YOLO_DEFAULTS = {"score_threshold": 0.25, "iou_threshold": 0.7, "max_detections": 300}


class ModelMetaError(ValueError):
    """The model's metadata is malformed."""


@dataclass(frozen=True)
class ModelMeta:
    """Resolved metadata of a model: from detq.json, config.txt or a sidecar, then settings overrides."""

    format: str | None = None
    classes: tuple[str, ...] = ()
    input_size: tuple[int, int] | None = None
    letterbox: bool = True
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    score_threshold: float | None = None
    iou_threshold: float | None = None
    max_detections: int | None = None
    name: str | None = None
    source: str = "none"

    def label_name(self, label_id: int) -> str:
        """Class name of a label id, or its number when the model carries no name for it."""
        if 0 <= label_id < len(self.classes):
            return self.classes[label_id]
        return str(label_id)

    def fixed_input_size(self) -> tuple[int, int]:
        """(height, width) fed to fixed-input models."""
        return self.input_size or DEFAULT_FIXED_INPUT

    def with_yolo_defaults(self) -> ModelMeta:
        """Fill unset thresholds with Ultralytics' predict defaults."""
        return replace(
            self,
            score_threshold=(
                self.score_threshold if self.score_threshold is not None else YOLO_DEFAULTS["score_threshold"]
            ),
            iou_threshold=self.iou_threshold
            if self.iou_threshold is not None
            else YOLO_DEFAULTS["iou_threshold"],
            max_detections=(
                self.max_detections
                if self.max_detections is not None
                else int(YOLO_DEFAULTS["max_detections"])
            ),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, in detq.json vocabulary."""
        return {
            "format": self.format,
            "classes": list(self.classes),
            "input_size": list(self.input_size) if self.input_size else None,
            "letterbox": self.letterbox,
            "mean": list(self.mean) if self.mean else None,
            "std": list(self.std) if self.std else None,
            "score_threshold": self.score_threshold,
            "iou_threshold": self.iou_threshold,
            "max_detections": self.max_detections,
            "name": self.name,
            "source": self.source,
        }


def _number(raw: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ModelMetaError(f"'{key}' must be a number in [{low}, {high}]")
    return float(value)


def _triple(raw: Mapping[str, Any], key: str) -> tuple[float, ...] | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (float(value),) * 3
    if not isinstance(value, list) or len(value) != 3 or not all(isinstance(v, int | float) for v in value):
        raise ModelMetaError(f"'{key}' must be a number or a list of 3 numbers")
    return tuple(float(v) for v in value)


def parse_input_size(value: Any) -> tuple[int, int] | None:
    """[height, width], a single int (square), or "H,W" / "S" text."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace("x", ",").split(",") if p.strip()]
        try:
            value = [int(p) for p in parts]
        except ValueError as exc:
            raise ModelMetaError(f"input size {value!r} is not 'H,W' or a single number") from exc
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value, value]
    if isinstance(value, list) and len(value) == 1:
        value = value * 2
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 16384 for v in value)
    ):
        raise ModelMetaError("'input_size' must be [height, width] in pixels")
    return int(value[0]), int(value[1])


def parse_model_meta(raw: Mapping[str, Any], source: str = "detq.json") -> ModelMeta:
    """Validate a detq.json-style dict into ModelMeta."""
    fmt = raw.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise ModelMetaError(f"unsupported model format {fmt!r}; supported: {', '.join(FORMATS)}")
    classes = raw.get("classes", [])
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise ModelMetaError("'classes' must be a list of names")
    letterbox = raw.get("letterbox", True)
    if not isinstance(letterbox, bool):
        raise ModelMetaError("'letterbox' must be true or false")
    max_det = raw.get("max_detections")
    if max_det is not None and (isinstance(max_det, bool) or not isinstance(max_det, int) or max_det < 1):
        raise ModelMetaError("'max_detections' must be a positive integer")
    name = raw.get("name")
    return ModelMeta(
        format=fmt,
        classes=tuple(classes),
        input_size=parse_input_size(raw.get("input_size")),
        letterbox=letterbox,
        mean=_triple(raw, "mean"),
        std=_triple(raw, "std"),
        score_threshold=_number(raw, "score_threshold", 0.0, 1.0),
        iou_threshold=_number(raw, "iou_threshold", 0.0, 1.0),
        max_detections=max_det,
        name=str(name) if name is not None else None,
        source=source,
    )


def sidecar_paths(model_path: Path) -> list[Path]:
    """model.pt -> model.json, model.pt.json."""
    return [model_path.with_suffix(".json"), model_path.with_name(model_path.name + ".json")]


def read_sidecar(model_path: Path) -> tuple[dict[str, Any], str] | None:
    """The first sidecar JSON next to the model, with its name, or None."""
    for candidate in sidecar_paths(model_path):
        if candidate.is_file():
            try:
                loaded = json.loads(candidate.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise ModelMetaError(f"sidecar {candidate.name} is not valid JSON: {exc}") from exc
            if not isinstance(loaded, dict):
                raise ModelMetaError(f"sidecar {candidate.name} must hold a JSON object")
            return loaded, f"sidecar {candidate.name}"
    return None


@dataclass(frozen=True)
class MetaOverrides:
    """Settings and CLI flags that win over whatever the model file says."""

    format: str | None = None
    input_size: tuple[int, int] | None = None
    score_threshold: float | None = None
    iou_threshold: float | None = None
    max_detections: int | None = None

    def apply(self, meta: ModelMeta) -> ModelMeta:
        """Meta with every override that is set."""
        if self.format is not None and self.format not in FORMATS:
            raise ModelMetaError(f"unsupported model format {self.format!r}; supported: {', '.join(FORMATS)}")
        changes: dict[str, Any] = {
            key: value
            for key, value in (
                ("format", self.format),
                ("input_size", self.input_size),
                ("score_threshold", self.score_threshold),
                ("iou_threshold", self.iou_threshold),
                ("max_detections", self.max_detections),
            )
            if value is not None
        }
        return replace(meta, **changes) if changes else meta
