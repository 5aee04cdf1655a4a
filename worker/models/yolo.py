"""Decode raw Ultralytics/YOLOv5 outputs (and final-box exports) into per-image RawDetections."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchvision.ops import nms

from detq.vocabulary import ModelFormat
from worker.models.outputs import ModelOutputError, RawDetections

# Ultralytics caps the boxes fed to NMS (max_nms) so a flood of candidates cannot make NMS quadratic-slow.
MAX_NMS_CANDIDATES = 30000
# Ultralytics and YOLOv5 make NMS class-aware by shifting each class's boxes by class x max_wh; the shift
# rounds the float32 coordinates, so a box near the IoU threshold is kept or dropped by that rounding: detq
# shifts the same way to keep exactly the boxes they keep.
CLASS_OFFSET = 7680


def _empty() -> RawDetections:
    return RawDetections(
        boxes=torch.zeros((0, 4), dtype=torch.float32),
        labels=torch.zeros((0,), dtype=torch.int64),
        scores=torch.zeros((0,), dtype=torch.float32),
    )


def _xywh_to_xyxy(xywh: torch.Tensor) -> torch.Tensor:
    half = xywh[:, 2:4] / 2
    return torch.cat((xywh[:, 0:2] - half, xywh[:, 0:2] + half), dim=1)


def _of_classes(labels: torch.Tensor, classes: frozenset[int] | None) -> torch.Tensor:
    """Which labels are among classes (all where classes is None)."""
    if classes is None:
        return torch.ones_like(labels, dtype=torch.bool)
    wanted = torch.tensor(sorted(classes), dtype=labels.dtype, device=labels.device)
    return torch.isin(labels, wanted)


def _nms(
    boxes_xyxy: torch.Tensor,
    scores: torch.Tensor,
    labels: torch.Tensor,
    *,
    iou: float,
    max_det: int,
    classes: frozenset[int] | None = None,
) -> RawDetections:
    """Class-aware NMS over one image's candidates (of classes only, as Ultralytics' `classes=` filters
    them before NMS), best first, at most max_det, moved to the CPU."""
    finite = torch.isfinite(boxes_xyxy).all(dim=1) & torch.isfinite(scores) & _of_classes(labels, classes)
    boxes_xyxy, scores, labels = boxes_xyxy[finite], scores[finite], labels[finite]
    if scores.numel() == 0 or max_det <= 0:
        return _empty()
    if scores.numel() > MAX_NMS_CANDIDATES:
        top = torch.topk(scores, MAX_NMS_CANDIDATES).indices
        boxes_xyxy, scores, labels = boxes_xyxy[top], scores[top], labels[top]
    shifted = boxes_xyxy + labels.to(boxes_xyxy.dtype)[:, None] * CLASS_OFFSET
    keep = nms(shifted, scores, iou)[:max_det]  # sorted by descending score
    return RawDetections(
        boxes=boxes_xyxy[keep].to("cpu", torch.float32),
        labels=labels[keep].to("cpu", torch.int64),
        scores=scores[keep].to("cpu", torch.float32),
    )


def _check_3d(pred: torch.Tensor, layout: str) -> None:
    if not isinstance(pred, torch.Tensor) or pred.dim() != 3:
        shape = tuple(pred.shape) if isinstance(pred, torch.Tensor) else type(pred).__name__
        raise ModelOutputError(f"expected a 3-D {layout} tensor, got {shape}")


def decode_yolov8(
    pred: torch.Tensor, *, conf: float, iou: float, max_det: int, classes: frozenset[int] | None = None
) -> list[RawDetections]:
    """Decode [B, 4 + nc, N] (cx, cy, w, h, sigmoid class scores): best class per box, class-aware NMS."""
    _check_3d(pred, "[B, 4 + nc, N]")
    if pred.shape[1] < 5:
        raise ModelOutputError(
            f"yolov8 output needs at least 5 rows (4 box + 1 class), got {tuple(pred.shape)}"
        )
    pred = pred.detach().float()
    results = []
    for image in pred:  # [4 + nc, N]
        candidates = image.transpose(0, 1)  # [N, 4 + nc]
        scores, labels = candidates[:, 4:].max(dim=1)
        keep = scores > conf
        results.append(
            _nms(
                _xywh_to_xyxy(candidates[keep, :4]),
                scores[keep],
                labels[keep],
                iou=iou,
                max_det=max_det,
                classes=classes,
            )
        )
    return results


def decode_yolov5(
    pred: torch.Tensor, *, conf: float, iou: float, max_det: int, classes: frozenset[int] | None = None
) -> list[RawDetections]:
    """Decode [B, N, 5 + nc] (cx, cy, w, h, objectness, class scores): score = obj * best class score."""
    _check_3d(pred, "[B, N, 5 + nc]")
    if pred.shape[2] < 6:
        raise ModelOutputError(
            f"yolov5 output needs at least 6 columns (4 box + obj + 1 class), got {tuple(pred.shape)}"
        )
    pred = pred.detach().float()
    results = []
    for image in pred:  # [N, 5 + nc]
        candidates = image[image[:, 4] > conf]
        # As yolov5's non_max_suppression with multi_label=False: conf = obj * cls, best class only.
        scores, labels = (candidates[:, 5:] * candidates[:, 4:5]).max(dim=1)
        keep = scores > conf
        results.append(
            _nms(
                _xywh_to_xyxy(candidates[keep, :4]),
                scores[keep],
                labels[keep],
                iou=iou,
                max_det=max_det,
                classes=classes,
            )
        )
    return results


def decode_final_boxes(
    pred: torch.Tensor, *, conf: float, max_det: int, classes: frozenset[int] | None = None
) -> list[RawDetections]:
    """Read [B, N, 6] final boxes (x1, y1, x2, y2, score, label); zero-score rows are padding and dropped."""
    _check_3d(pred, "[B, N, 6]")
    if pred.shape[2] != 6:
        raise ModelOutputError(f"final-box output must be [B, N, 6], got {tuple(pred.shape)}")
    pred = pred.detach().to("cpu", torch.float32)
    results = []
    for image in pred:  # [N, 6]
        valid = torch.isfinite(image).all(dim=1) & (image[:, 4] > 0) & (image[:, 4] >= conf)
        valid &= _of_classes(image[:, 5].round().to(torch.int64), classes)
        rows = image[valid]
        order = torch.argsort(rows[:, 4], descending=True, stable=True)[: max(max_det, 0)]
        rows = rows[order]
        results.append(
            RawDetections(
                boxes=rows[:, :4].contiguous(),
                labels=rows[:, 5].round().to(torch.int64),
                scores=rows[:, 4].contiguous(),
            )
        )
    return results


def yolo_tensor(output: Any) -> torch.Tensor:
    """The prediction tensor of an export: the output itself, or the first item of a tuple/list."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, list | tuple) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if isinstance(output, list | tuple):
        first = type(output[0]).__name__ if output else "nothing"
        raise ModelOutputError(
            f"expected a YOLO prediction tensor, got a {type(output).__name__} whose first item is {first}"
        )
    raise ModelOutputError(
        f"expected a YOLO prediction tensor (or a tuple starting with one), got {type(output).__name__}"
    )


def guess_layout(shape: Sequence[int], num_classes: int | None) -> tuple[ModelFormat, str | None]:
    """Decide "yolov8", "yolov5" or "boxes" from a [B, A, C] output shape: (format, warning or None)."""
    dims = tuple(int(v) for v in shape)
    if len(dims) != 3:
        raise ModelOutputError(f"expected a 3-D YOLO output [B, A, C], got shape {dims}")
    _, a, c = dims
    if num_classes is not None:
        nc = num_classes
        if nc < 1:
            raise ModelOutputError(f"num_classes must be at least 1, got {nc}")
        if a == 4 + nc and c != 5 + nc:
            return ModelFormat.YOLOV8, None
        if c == 5 + nc:
            if c == 6:
                return ModelFormat.YOLOV5, (
                    f"output shape {dims} of a one-class model may be raw yolov5 or final boxes; "
                    "decoding as yolov5, set format 'boxes' if the export already applies NMS"
                )
            return ModelFormat.YOLOV5, None
        if c == 6:
            return ModelFormat.BOXES, None
        raise ModelOutputError(
            f"output shape {dims} fits no known layout for {nc} classes: expected [B, {4 + nc}, N] (yolov8), "
            f"[B, N, {5 + nc}] (yolov5) or [B, N, 6] (final boxes)"
        )
    if c == 6:
        return ModelFormat.BOXES, (
            f"output shape {dims} is ambiguous between final boxes and a one-class yolov5 output; "
            "decoding as final boxes, set the format (or the class names) in the model metadata to be sure"
        )
    if a < c:
        if a < 5:
            raise ModelOutputError(
                f"output shape {dims} has too few rows for yolov8 (need 4 box + >= 1 class)"
            )
        return ModelFormat.YOLOV8, None
    if a > c:
        if c < 6:
            raise ModelOutputError(
                f"output shape {dims} has too few columns for yolov5 (need 5 + >= 1 class)"
            )
        return ModelFormat.YOLOV5, None
    raise ModelOutputError(
        f"output shape {dims} is square, yolov8 and yolov5 look alike; set the class names in the metadata"
    )
