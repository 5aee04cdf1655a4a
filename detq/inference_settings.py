"""What shapes a job's results beside the model file: recorded on the job, applied by every worker that runs
it, and, with the model's sha256, the key under which a file counts as done.

A threshold changed between two runs over one folder is new work, not "nothing new": the second run's
settings make another key, and its results are those of its settings. The producer (`detq run`, `detq
enqueue`, the scheduler) takes them from its own settings (DETQ_SCORE_THRESHOLD, DETQ_CLASSES, ...) and
flags (--conf, --classes, --imgsz); workers apply the job's, whatever their own environment says (a job
recorded before there were settings on jobs runs as the worker's settings say).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from detq.setting_values import BadValue, names, size
from detq.settings import Settings
from detq.vocabulary import ModelFormat, Precision

KEY_LENGTH = 16  # hex digits of the sha256 of the settings' JSON: a job's results key beside its model


@dataclass(frozen=True)
class InferenceSettings:
    """The settings that change what a model's results on an image are."""

    score_threshold: float | None = None  # None: the model's own
    classes: tuple[str, ...] = ()  # names or label ids kept; empty: every class
    input_size: tuple[int, int] | None = None  # (height, width) of a fixed-input model; None: its own
    iou_threshold: float | None = None
    max_detections: int | None = None
    model_format: ModelFormat | None = None  # None: the model's metadata, else guessed
    precision: Precision = Precision.FP32
    fast_decode: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> InferenceSettings:
        """The inference settings that these settings give (flags already folded in by Settings.replace)."""
        return cls(
            score_threshold=settings.score_threshold,
            classes=tuple(settings.classes),
            input_size=settings.input_size,
            iou_threshold=settings.iou_threshold,
            max_detections=settings.max_detections,
            model_format=settings.model_format,
            precision=settings.precision,
            fast_decode=settings.fast_decode,
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form, every field named (what the job records)."""
        raw = asdict(self)
        raw["classes"] = list(self.classes)
        raw["input_size"] = list(self.input_size) if self.input_size is not None else None
        raw["model_format"] = self.model_format.value if self.model_format is not None else None
        raw["precision"] = self.precision.value
        return raw

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> InferenceSettings:
        """Read what to_json wrote; a name it does not know is ignored (a newer detq's), a missing one is
        the default (an older detq's)."""
        try:
            return cls(
                score_threshold=_optional_float(raw.get("score_threshold")),
                classes=names(raw.get("classes") or []),
                input_size=size(raw["input_size"]) if raw.get("input_size") else None,
                iou_threshold=_optional_float(raw.get("iou_threshold")),
                max_detections=int(raw["max_detections"]) if raw.get("max_detections") is not None else None,
                model_format=ModelFormat(raw["model_format"]) if raw.get("model_format") else None,
                precision=Precision(raw.get("precision") or Precision.FP32),
                fast_decode=bool(raw.get("fast_decode", False)),
            )
        except (BadValue, ValueError, TypeError) as exc:
            raise ValueError(f"a job's settings cannot be read: {exc}") from exc

    @property
    def key(self) -> str:
        """What tells results of these settings apart from others of the same model: a digest of those
        that differ from the defaults (so a setting added later, at its default, keeps every key; the
        defaults' key is the digest of {}, which migration 0008 gave the jobs made before it)."""
        defaults = InferenceSettings().to_json()
        changed = {name: value for name, value in self.to_json().items() if value != defaults[name]}
        text = json.dumps(changed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]

    def describe(self) -> str:
        """One line of what differs from the defaults ("the model's defaults" where nothing does)."""
        parts = []
        if self.score_threshold is not None:
            parts.append(f"conf {self.score_threshold:g}")
        if self.classes:
            parts.append(f"classes {','.join(self.classes)}")
        if self.input_size is not None:
            parts.append(f"imgsz {self.input_size[0]}x{self.input_size[1]}")
        if self.iou_threshold is not None:
            parts.append(f"iou {self.iou_threshold:g}")
        if self.max_detections is not None:
            parts.append(f"max_det {self.max_detections}")
        if self.model_format is not None:
            parts.append(f"format {self.model_format}")
        if self.precision is not Precision.FP32:
            parts.append(str(self.precision))
        if self.fast_decode:
            parts.append("fast decode")
        return ", ".join(parts) or "the model's defaults"

    def keeps(self, label_id: int, label: str) -> bool:
        """Whether a detection of this class is kept (its name or its id among classes, or no classes)."""
        return not self.classes or label in self.classes or str(label_id) in self.classes


DEFAULTS = InferenceSettings()
DEFAULT_KEY = DEFAULTS.key


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
