"""Detection metrics in pure Python: box IoU, precision/recall at a threshold, VOC-style mAP."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class LabelledBox(Protocol):
    """Anything with a class id and x1, y1, x2, y2 pixel coordinates (GroundTruthBox, PredictedBox)."""

    @property
    def label_id(self) -> int: ...
    @property
    def x1(self) -> float: ...
    @property
    def y1(self) -> float: ...
    @property
    def x2(self) -> float: ...
    @property
    def y2(self) -> float: ...


@dataclass
class PredictedBox:
    """One detection: class id, confidence and pixel box (x1, y1, x2, y2)."""

    label_id: int
    score: float
    x1: float
    y1: float
    x2: float
    y2: float


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two [x1, y1, x2, y2] boxes; 0.0 when they do not overlap or are empty."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0.0 or ih <= 0.0:
        return 0.0
    inter = iw * ih
    area_a = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])
    area_b = max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])
    union = area_a + area_b - inter
    return inter / union if union > 0.0 else 0.0


def _coords(box: LabelledBox) -> tuple[float, float, float, float]:
    return (box.x1, box.y1, box.x2, box.y2)


def _match_class(
    gt: Mapping[str, Sequence[LabelledBox]],
    pred: Mapping[str, Sequence[PredictedBox]],
    label_id: int,
    iou_threshold: float,
    score_threshold: float,
) -> tuple[list[tuple[float, bool]], int]:
    """Greedy matching of one class's predictions, highest score first, across all images.

    Each prediction takes the still-unmatched ground-truth box of its image with the highest IoU; it is a
    true positive when that IoU is at least iou_threshold. Returns (score, is_true_positive) per kept
    prediction, in descending score order, and the number of ground-truth boxes of the class.
    """
    gt_boxes: dict[str, list[tuple[float, float, float, float]]] = {}
    for name, boxes in gt.items():
        gt_boxes[name] = [_coords(b) for b in boxes if b.label_id == label_id]
    num_gt = sum(len(boxes) for boxes in gt_boxes.values())

    candidates: list[tuple[float, int, str, tuple[float, float, float, float]]] = []
    order = 0
    for name, boxes_p in pred.items():
        for p in boxes_p:
            if p.label_id == label_id and p.score >= score_threshold:
                candidates.append((p.score, order, name, _coords(p)))
                order += 1
    # Descending score; ties keep their input order so the result is deterministic.
    candidates.sort(key=lambda c: (-c[0], c[1]))

    taken: dict[str, list[bool]] = {name: [False] * len(boxes) for name, boxes in gt_boxes.items()}
    results: list[tuple[float, bool]] = []
    for score, _, name, box in candidates:
        best_iou = 0.0
        best_index = -1
        for index, target in enumerate(gt_boxes.get(name, [])):
            if taken[name][index]:
                continue
            iou = box_iou(box, target)
            if iou > best_iou:
                best_iou, best_index = iou, index
        if best_index >= 0 and best_iou >= iou_threshold:
            taken[name][best_index] = True
            results.append((score, True))
        else:
            results.append((score, False))
    return results, num_gt


def _label_ids(
    gt: Mapping[str, Sequence[LabelledBox]], pred: Mapping[str, Sequence[PredictedBox]]
) -> set[int]:
    labels = {b.label_id for boxes in gt.values() for b in boxes}
    labels.update(p.label_id for boxes in pred.values() for p in boxes)
    return labels


def precision_recall(
    gt: Mapping[str, Sequence[LabelledBox]],
    pred: Mapping[str, Sequence[PredictedBox]],
    iou_threshold: float = 0.5,
    score_threshold: float = 0.0,
) -> tuple[float, float, int, int, int]:
    """Precision, recall, TP, FP, FN over all images and classes for predictions scoring >= score_threshold.

    Matching is greedy per class by descending score (see _match_class). Images present only in pred count
    their predictions as false positives. A ratio whose denominator is zero is reported as 1.0 (nothing was
    predicted wrongly / nothing was missed).
    """
    tp = fp = fn = 0
    for label_id in sorted(_label_ids(gt, pred)):
        results, num_gt = _match_class(gt, pred, label_id, iou_threshold, score_threshold)
        hits = sum(1 for _, ok in results if ok)
        tp += hits
        fp += len(results) - hits
        fn += num_gt - hits
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    return precision, recall, tp, fp, fn


def average_precision(recalls: Sequence[float], precisions: Sequence[float]) -> float:
    """VOC all-point interpolated AP: area under the monotone (right-to-left max) precision envelope."""
    mrec = [0.0, *recalls, 1.0]
    mpre = [0.0, *precisions, 0.0]
    for i in range(len(mpre) - 2, -1, -1):
        mpre[i] = max(mpre[i], mpre[i + 1])
    return sum((mrec[i + 1] - mrec[i]) * mpre[i + 1] for i in range(len(mrec) - 1) if mrec[i + 1] != mrec[i])


def mean_average_precision(
    gt: Mapping[str, Sequence[LabelledBox]],
    pred: Mapping[str, Sequence[PredictedBox]],
    num_classes: int,
    iou_threshold: float = 0.5,
) -> tuple[float, list[float]]:
    """Mean of per-class VOC all-point AP at iou_threshold, and the per-class APs.

    A class without ground-truth boxes gets NaN in the list and is left out of the mean; the mean is NaN
    when no class has ground truth.
    """
    per_class: list[float] = []
    for label_id in range(num_classes):
        results, num_gt = _match_class(gt, pred, label_id, iou_threshold, 0.0)
        if num_gt == 0:
            per_class.append(math.nan)
            continue
        recalls: list[float] = []
        precisions: list[float] = []
        tp = fp = 0
        for _, ok in results:
            if ok:
                tp += 1
            else:
                fp += 1
            recalls.append(tp / num_gt)
            precisions.append(tp / (tp + fp))
        per_class.append(average_precision(recalls, precisions))
    valid = [ap for ap in per_class if not math.isnan(ap)]
    mean = sum(valid) / len(valid) if valid else math.nan
    return mean, per_class
