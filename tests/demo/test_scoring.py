"""Detection metrics against hand-computed values: IoU, precision/recall, VOC all-point AP and mAP."""

from __future__ import annotations

import math

import pytest

from demo.scoring import (
    PredictedBox,
    average_precision,
    box_iou,
    mean_average_precision,
    precision_recall,
)
from demo.shapes import CLASSES, GroundTruthBox


def gt_box(label_id: int, x1: float, y1: float, x2: float, y2: float) -> GroundTruthBox:
    return GroundTruthBox(label_id, CLASSES[label_id], x1, y1, x2, y2)


def test_box_iou_hand_computed() -> None:
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert box_iou([0, 0, 2, 2], [1, 1, 3, 3]) == pytest.approx(1 / 7)
    assert box_iou([0, 0, 4, 4], [1, 1, 3, 3]) == pytest.approx(0.25)
    assert box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert box_iou([0, 0, 2, 2], [2, 0, 4, 2]) == 0.0  # touching edges
    assert box_iou([0, 0, 2, 2], [5, 5, 6, 6]) == 0.0
    assert box_iou([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0  # empty boxes


def scenario() -> tuple[dict[str, list[GroundTruthBox]], dict[str, list[PredictedBox]]]:
    gt = {
        "a": [gt_box(0, 0, 0, 10, 10), gt_box(1, 20, 20, 30, 30)],
        "b": [gt_box(2, 0, 0, 10, 10)],
    }
    pred = {
        "a": [
            PredictedBox(0, 0.9, 0, 0, 10, 10),  # TP
            PredictedBox(0, 0.8, 0, 0, 10, 10),  # duplicate of a matched box: FP
            PredictedBox(1, 0.7, 25, 25, 35, 35),  # IoU 25/175 with the square: FP, square stays FN
            PredictedBox(2, 0.6, 0, 0, 10, 10),  # right place, class with no box in "a": FP
        ],
        "b": [],  # the triangle is missed: FN
    }
    return gt, pred


def test_precision_recall_counts_tp_fp_fn() -> None:
    gt, pred = scenario()
    precision, recall, tp, fp, fn = precision_recall(gt, pred)
    assert (tp, fp, fn) == (1, 3, 2)
    assert precision == pytest.approx(1 / 4)
    assert recall == pytest.approx(1 / 3)


def test_precision_recall_score_threshold() -> None:
    gt, pred = scenario()
    assert precision_recall(gt, pred, score_threshold=0.85) == pytest.approx((1.0, 1 / 3, 1, 0, 2))
    assert precision_recall(gt, pred, score_threshold=0.75)[2:] == (1, 1, 2)


def test_precision_recall_iou_threshold() -> None:
    gt, pred = scenario()
    # At IoU >= 0.1 the shifted square (IoU 1/7) matches.
    assert precision_recall(gt, pred, iou_threshold=0.1)[2:] == (2, 2, 1)


def test_predictions_on_unknown_images_are_false_positives() -> None:
    gt = {"a": [gt_box(0, 0, 0, 10, 10)]}
    pred = {"a": [PredictedBox(0, 0.9, 0, 0, 10, 10)], "zzz": [PredictedBox(0, 0.95, 0, 0, 10, 10)]}
    assert precision_recall(gt, pred)[2:] == (1, 1, 0)


def test_greedy_matching_prefers_higher_scores() -> None:
    gt = {"a": [gt_box(0, 0, 0, 10, 10)]}
    pred = {"a": [PredictedBox(0, 0.4, 0, 0, 10, 10), PredictedBox(0, 0.6, 1, 1, 10, 10)]}
    # The 0.6 box (IoU 0.81) claims the ground truth first; the perfect 0.4 box becomes a FP.
    assert precision_recall(gt, pred)[2:] == (1, 1, 0)
    assert precision_recall(gt, pred, score_threshold=0.5)[2:] == (1, 0, 0)


def test_empty_inputs() -> None:
    assert precision_recall({}, {}) == (1.0, 1.0, 0, 0, 0)
    gt = {"a": [gt_box(0, 0, 0, 10, 10)]}
    assert precision_recall(gt, {}) == (1.0, 0.0, 0, 0, 1)


def test_map_is_one_for_perfect_predictions() -> None:
    gt = {
        "a": [gt_box(0, 0, 0, 10, 10), gt_box(1, 20, 20, 30, 30)],
        "b": [gt_box(2, 5, 5, 9, 9), gt_box(0, 50, 50, 70, 80)],
    }
    pred = {
        name: [PredictedBox(b.label_id, 0.5 + 0.1 * i, b.x1, b.y1, b.x2, b.y2) for i, b in enumerate(boxes)]
        for name, boxes in gt.items()
    }
    mean, per_class = mean_average_precision(gt, pred, num_classes=3)
    assert mean == pytest.approx(1.0)
    assert per_class == pytest.approx([1.0, 1.0, 1.0])


def test_map_hand_worked_example() -> None:
    # One class, 3 ground-truth boxes; ranked predictions TP, FP, TP, FP; one box never found.
    # (recall, precision): (1/3, 1), (1/3, 1/2), (2/3, 2/3), (2/3, 1/2)
    # envelope: 1 up to recall 1/3, 2/3 up to recall 2/3, then 0 -> AP = 1/3 * 1 + 1/3 * 2/3 = 5/9.
    gt = {"a": [gt_box(0, 0, 0, 10, 10), gt_box(0, 20, 0, 30, 10)], "b": [gt_box(0, 0, 0, 10, 10)]}
    pred = {
        "a": [
            PredictedBox(0, 0.9, 0, 0, 10, 10),
            PredictedBox(0, 0.8, 50, 50, 60, 60),
            PredictedBox(0, 0.6, 40, 40, 45, 45),
        ],
        "b": [PredictedBox(0, 0.7, 0, 0, 10, 11)],
    }
    mean, per_class = mean_average_precision(gt, pred, num_classes=1)
    assert per_class == pytest.approx([5 / 9])
    assert mean == pytest.approx(5 / 9)


def test_classes_without_ground_truth_are_left_out_of_the_mean() -> None:
    gt = {"a": [gt_box(0, 0, 0, 10, 10)]}
    pred = {"a": [PredictedBox(0, 0.9, 0, 0, 10, 10), PredictedBox(2, 0.9, 30, 30, 40, 40)]}
    mean, per_class = mean_average_precision(gt, pred, num_classes=3)
    assert per_class[0] == pytest.approx(1.0)
    assert math.isnan(per_class[1]) and math.isnan(per_class[2])
    assert mean == pytest.approx(1.0)
    mean_empty, per_class_empty = mean_average_precision({}, pred, num_classes=2)
    assert math.isnan(mean_empty) and all(math.isnan(ap) for ap in per_class_empty)


def test_map_is_zero_when_nothing_matches() -> None:
    gt = {"a": [gt_box(1, 0, 0, 10, 10)]}
    pred = {"a": [PredictedBox(1, 0.9, 20, 20, 30, 30)]}
    mean, per_class = mean_average_precision(gt, pred, num_classes=3)
    assert mean == 0.0
    assert per_class[1] == 0.0
    assert math.isnan(per_class[0]) and math.isnan(per_class[2])


def test_average_precision_all_point_interpolation() -> None:
    assert average_precision([0.5, 1.0], [1.0, 0.5]) == pytest.approx(0.75)
    # A dip in precision is filled by the later, higher precision (the envelope).
    assert average_precision([0.25, 0.25, 0.5], [1.0, 0.5, 0.667]) == pytest.approx(0.25 + 0.25 * 0.667)
    assert average_precision([], []) == 0.0
