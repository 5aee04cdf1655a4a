"""Translate the config.txt that Ultralytics/YOLOv5 TorchScript exports carry into detq model metadata."""

from __future__ import annotations

import json
from typing import Any

from worker.yolo import DEFAULT_CONF, DEFAULT_IOU, DEFAULT_MAX_DET, FORMAT_BOXES

SOURCE = "ultralytics config.txt"
# Class ids are filled densely up to the largest; a bigger id is a corrupt file, not a real model.
_MAX_CLASS_ID = 100_000


def parse_ultralytics_config(text: str) -> dict[str, Any]:
    """Parse config.txt (JSON) into detq metadata keys; raise ValueError for non-detect or malformed files."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"Ultralytics config.txt is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"Ultralytics config.txt must be a JSON object, got {type(raw).__name__}")
    task = raw.get("task")
    if task is not None and task != "detect":
        raise ValueError(f"Ultralytics model task {task!r} is not supported; export a detect model")
    channels = raw.get("channels")
    if channels is not None and channels != 3:
        raise ValueError(f"Ultralytics model expects {channels!r} input channels; only RGB (3) is supported")
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        raise ValueError(f"Ultralytics config 'args' must be an object, got {type(args).__name__}")

    meta: dict[str, Any] = {"source": SOURCE, "letterbox": True}
    if "names" in raw:
        meta["classes"] = _class_names(raw["names"])
    size = _input_size(raw)
    if size is not None:
        meta["input_size"] = size
    # nms=True exports wrap the model in NMS; end2end models (YOLOv10, YOLO26) pick final boxes themselves.
    # Either way the output is [B, max_det, 6] x1, y1, x2, y2, score, class.
    if args.get("nms") or raw.get("end2end"):
        meta["format"] = FORMAT_BOXES
    meta["score_threshold"] = _number(args, "conf", DEFAULT_CONF, 0.0, 1.0)
    meta["iou_threshold"] = _number(args, "iou", DEFAULT_IOU, 0.0, 1.0)
    max_det = args.get("max_det")
    if max_det is None:
        meta["max_detections"] = DEFAULT_MAX_DET
    elif isinstance(max_det, int) and not isinstance(max_det, bool) and max_det > 0:
        meta["max_detections"] = max_det
    else:
        raise ValueError(f"Ultralytics config args.max_det must be a positive integer, got {max_det!r}")
    description = raw.get("description")
    if isinstance(description, str) and description.strip():
        meta["name"] = description.strip()
    return meta


def _class_names(names: Any) -> list[str]:
    if isinstance(names, list):
        return [str(n) for n in names]
    if not isinstance(names, dict):
        raise ValueError(
            f"Ultralytics config 'names' must be a list or an object, got {type(names).__name__}"
        )
    by_id: dict[int, str] = {}
    for key, value in names.items():
        try:
            class_id = int(key)
        except ValueError:
            raise ValueError(f"Ultralytics config 'names' has a non-integer class id {key!r}") from None
        if not 0 <= class_id <= _MAX_CLASS_ID:
            raise ValueError(f"Ultralytics config 'names' has an out-of-range class id {class_id}")
        by_id[class_id] = str(value)
    if not by_id:
        return []
    return [by_id.get(i, str(i)) for i in range(max(by_id) + 1)]


def _input_size(raw: dict[str, Any]) -> list[int] | None:
    """[h, w] from imgsz (int or [h, w]) or from YOLOv5's shape [B, C, H, W]."""
    if "imgsz" in raw:
        imgsz = raw["imgsz"]
        if isinstance(imgsz, int):
            size = [imgsz, imgsz]
        elif isinstance(imgsz, list) and len(imgsz) == 1:
            size = [imgsz[0], imgsz[0]]
        elif isinstance(imgsz, list) and len(imgsz) == 2:
            size = list(imgsz)
        else:
            raise ValueError(f"Ultralytics config 'imgsz' must be an int or [h, w], got {imgsz!r}")
    elif "shape" in raw:
        shape = raw["shape"]
        if not isinstance(shape, list) or len(shape) != 4:
            raise ValueError(f"YOLOv5 config 'shape' must be [batch, channels, h, w], got {shape!r}")
        size = list(shape[2:])
    else:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size):
        raise ValueError(f"Ultralytics config input size must be positive integers, got {size!r}")
    return [int(v) for v in size]


def _number(args: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = args.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"Ultralytics config args.{key} must be a number in [{low}, {high}], got {value!r}")
    return float(value)
