"""Translate the config.txt that Ultralytics/YOLOv5 TorchScript exports carry into detq model metadata."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from detq.vocabulary import ModelFormat
from worker.models.metadata import YOLO_DEFAULTS, Count, InputSize, ModelMetaError, Side, Threshold

SOURCE = "ultralytics config.txt"
DOCUMENT = "Ultralytics config.txt"
# Class ids are filled densely up to the largest; a bigger id is a corrupt file, not a real model.
_MAX_CLASS_ID = 100_000


def _class_names(names: Any) -> Any:
    """A list of names as is; {"id": name} (how json.dumps writes int keys) ordered by id, gaps numbered."""
    if names is None:
        return None
    if isinstance(names, list):
        return [str(n) for n in names]
    if not isinstance(names, dict):
        raise ValueError(f"must be a list or an object, got {type(names).__name__}")
    by_id: dict[int, str] = {}
    for key, value in names.items():
        try:
            class_id = int(key)
        except ValueError:
            raise ValueError(f"has a non-integer class id {key!r}") from None
        if not 0 <= class_id <= _MAX_CLASS_ID:
            raise ValueError(f"has an out-of-range class id {class_id}")
        by_id[class_id] = str(value)
    if not by_id:
        return []
    return [by_id.get(i, str(i)) for i in range(max(by_id) + 1)]


def _nchw(shape: Any) -> Any:
    if shape is not None and not (isinstance(shape, list) and len(shape) == 4):
        raise ValueError(f"must be [batch, channels, height, width], got {shape!r}")
    return shape


def _text_or_none(value: Any) -> Any:
    # Only a text description names the model; anything else there is some other tool's business.
    return (value.strip() or None) if isinstance(value, str) else None


def _object_or_empty(value: Any) -> Any:
    return {} if value is None else value


ClassNames = Annotated[tuple[str, ...] | None, BeforeValidator(_class_names)]
YoloV5Shape = Annotated[tuple[int, int, Side, Side] | None, BeforeValidator(_nchw)]


class UltralyticsArgs(BaseModel):
    """The export's `args`: NMS baked in or not, and the predict settings it was exported with."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    nms: bool | None = None
    conf: Threshold | None = None
    iou: Threshold | None = None
    max_det: Count | None = None


class UltralyticsConfig(BaseModel):
    """config.txt of an Ultralytics export (imgsz, names, args) or of a YOLOv5-repo export (shape, names)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    task: str | None = None
    channels: int | None = None
    names: ClassNames = None
    imgsz: InputSize = None
    shape: YoloV5Shape = None
    end2end: bool | None = None
    description: Annotated[str | None, BeforeValidator(_text_or_none)] = None
    args: Annotated[UltralyticsArgs, BeforeValidator(_object_or_empty)] = Field(
        default_factory=UltralyticsArgs
    )

    @field_validator("task")
    @classmethod
    def _detect_only(cls, task: str | None) -> str | None:
        if task is not None and task != "detect":
            raise ValueError(f"task {task!r} is not supported; export a detect model")
        return task

    @field_validator("channels")
    @classmethod
    def _rgb_only(cls, channels: int | None) -> int | None:
        if channels is not None and channels != 3:
            raise ValueError(f"the model expects {channels} input channels; only RGB (3) is supported")
        return channels

    def input_size(self) -> tuple[int, int] | None:
        """(height, width) from imgsz, else from YOLOv5's shape [B, C, H, W]."""
        if self.imgsz is not None:
            return self.imgsz
        return (self.shape[2], self.shape[3]) if self.shape is not None else None

    def detq_meta(self) -> dict[str, Any]:
        """The detq.json keys this config says; thresholds default to Ultralytics' predict defaults."""
        meta: dict[str, Any] = {"source": SOURCE, "letterbox": True}
        if self.names is not None:
            meta["classes"] = list(self.names)
        size = self.input_size()
        if size is not None:
            meta["input_size"] = list(size)
        args = self.args
        # nms=True exports wrap the model in NMS; end2end models (YOLOv10, YOLO26) pick final boxes
        # themselves. Either way the output is [B, max_det, 6] x1, y1, x2, y2, score, class.
        if args.nms or self.end2end:
            meta["format"] = ModelFormat.BOXES.value
        meta["score_threshold"] = YOLO_DEFAULTS.score_threshold if args.conf is None else args.conf
        meta["iou_threshold"] = YOLO_DEFAULTS.iou_threshold if args.iou is None else args.iou
        meta["max_detections"] = YOLO_DEFAULTS.max_detections if args.max_det is None else args.max_det
        if self.description is not None:
            meta["name"] = self.description
        return meta


def parse_ultralytics_config(text: str) -> dict[str, Any]:
    """Parse config.txt (JSON) into detq metadata keys; ModelMetaError (a ValueError) lists every problem."""
    try:
        config = UltralyticsConfig.model_validate_json(text)
    except ValidationError as exc:
        raise ModelMetaError.from_validation(exc, DOCUMENT) from None
    return config.detq_meta()
