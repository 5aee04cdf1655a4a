"""YOLO decoding: confidence filtering, class-aware NMS, yolov5 scoring, final boxes, layout guessing."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from worker.models.outputs import ModelOutputError, RawDetections
from worker.models.yolo import decode_final_boxes, decode_yolov5, decode_yolov8, guess_layout, yolo_tensor

DEFAULTS: dict[str, Any] = {"conf": 0.25, "iou": 0.7, "max_det": 300}


def _v8(rows: list[list[float]]) -> torch.Tensor:
    """One image's candidates given as [cx, cy, w, h, class scores...] rows -> [1, 4 + nc, N]."""
    return torch.tensor(rows, dtype=torch.float32).T.unsqueeze(0)


def _assert_empty(det: RawDetections) -> None:
    assert det.boxes.shape == (0, 4) and det.boxes.dtype == torch.float32
    assert det.labels.shape == (0,) and det.labels.dtype == torch.int64
    assert det.scores.shape == (0,) and det.scores.dtype == torch.float32


def test_yolov8_filters_by_conf_and_suppresses_only_within_a_class() -> None:
    pred = _v8(
        [
            [50, 50, 20, 20, 0.9, 0.1],  # A: class 0, kept
            [52, 50, 20, 20, 0.8, 0.0],  # B: class 0, IoU 0.82 with A -> suppressed
            [51, 50, 20, 20, 0.1, 0.7],  # C: overlaps A but class 1 -> kept
            [200, 200, 10, 10, 0.0, 0.2],  # below conf
            [300, 300, 10, 10, 0.25, 0.0],  # exactly conf: ultralytics keeps only score > conf
        ]
    )
    (det,) = decode_yolov8(pred, **DEFAULTS)
    assert det.boxes.tolist() == [[40.0, 40.0, 60.0, 60.0], [41.0, 40.0, 61.0, 60.0]]
    assert det.labels.tolist() == [0, 1]
    assert det.scores.tolist() == pytest.approx([0.9, 0.7])
    assert det.boxes.dtype == torch.float32 and det.labels.dtype == torch.int64
    assert det.boxes.device.type == "cpu"


def test_yolov8_keeps_same_class_boxes_below_the_iou_threshold() -> None:
    # [40, 60] and [50, 70] squares of side 20 offset 10 in x: IoU = 200 / 600 = 0.33 < 0.7.
    pred = _v8([[50, 50, 20, 20, 0.9], [60, 50, 20, 20, 0.8]])
    (det,) = decode_yolov8(pred, **DEFAULTS)
    assert det.scores.tolist() == pytest.approx([0.9, 0.8])
    (strict,) = decode_yolov8(pred, conf=0.25, iou=0.3, max_det=300)
    assert strict.scores.tolist() == pytest.approx([0.9])


def test_yolov8_truncates_to_max_det_best_first() -> None:
    pred = _v8([[100.0 * i, 0, 10, 10, 0.3 + 0.1 * i] for i in range(5)])
    (det,) = decode_yolov8(pred, conf=0.25, iou=0.7, max_det=3)
    assert det.scores.tolist() == pytest.approx([0.7, 0.6, 0.5])
    assert det.boxes[:, 0].tolist() == [395.0, 295.0, 195.0]


def test_yolov8_batch_with_an_empty_image_and_half_input() -> None:
    image_a = _v8([[10, 10, 4, 4, 0.9, 0.0]])
    image_b = _v8([[10, 10, 4, 4, 0.1, 0.2]])
    (a, b) = decode_yolov8(torch.cat([image_a, image_b]).half(), **DEFAULTS)
    assert a.boxes.tolist() == [[8.0, 8.0, 12.0, 12.0]] and a.boxes.dtype == torch.float32
    _assert_empty(b)


def test_yolov8_zero_anchors_gives_empty_results() -> None:
    (det,) = decode_yolov8(torch.zeros((1, 6, 0)), **DEFAULTS)
    _assert_empty(det)


def test_yolov5_scores_are_objectness_times_best_class() -> None:
    pred = torch.tensor(
        [
            [
                [50, 50, 20, 20, 0.9, 0.5, 0.9],  # 0.9 * 0.9 = 0.81, class 1
                [100, 100, 10, 10, 0.2, 1.0, 0.0],  # objectness below conf -> dropped
                [200, 200, 10, 10, 0.5, 0.4, 0.3],  # 0.5 * 0.4 = 0.2 < conf -> dropped
                [300, 300, 10, 10, 0.6, 0.6, 0.1],  # 0.36, class 0
                [52, 50, 20, 20, 0.9, 0.1, 0.8],  # 0.72, class 1, overlaps the first -> suppressed
            ]
        ]
    )
    (det,) = decode_yolov5(pred, **DEFAULTS)
    assert det.scores.tolist() == pytest.approx([0.81, 0.36])
    assert det.labels.tolist() == [1, 0]
    assert det.boxes.tolist() == [[40.0, 40.0, 60.0, 60.0], [295.0, 295.0, 305.0, 305.0]]


def test_yolov5_no_candidates() -> None:
    (det,) = decode_yolov5(torch.full((1, 4, 7), 0.1), **DEFAULTS)
    _assert_empty(det)


def test_final_boxes_drop_padding_and_low_scores_and_sort() -> None:
    pred = torch.tensor(
        [
            [
                [5, 6, 7, 8, 0.3, 0],
                [1, 2, 3, 4, 0.9, 2],
                [9, 9, 10, 10, 0.1, 1],  # below conf
                [0, 0, 0, 0, 0, 0],  # padding
            ]
        ]
    )
    (det,) = decode_final_boxes(pred, conf=0.25, max_det=300)
    assert det.boxes.tolist() == [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
    assert det.labels.tolist() == [2, 0] and det.labels.dtype == torch.int64
    assert det.scores.tolist() == pytest.approx([0.9, 0.3])
    (top,) = decode_final_boxes(pred, conf=0.0, max_det=1)
    assert top.scores.tolist() == pytest.approx([0.9])
    (all_but_padding,) = decode_final_boxes(pred, conf=0.0, max_det=300)
    assert all_but_padding.labels.tolist() == [2, 0, 1]


def test_final_boxes_all_padding_is_empty() -> None:
    (det,) = decode_final_boxes(torch.zeros((1, 300, 6)), conf=0.25, max_det=300)
    _assert_empty(det)


@pytest.mark.parametrize(
    ("decode", "pred"),
    [
        (lambda p: decode_yolov8(p, **DEFAULTS), torch.zeros((84, 8400))),
        (lambda p: decode_yolov8(p, **DEFAULTS), torch.zeros((1, 4, 8400))),
        (lambda p: decode_yolov5(p, **DEFAULTS), torch.zeros((1, 8400, 5))),
        (lambda p: decode_final_boxes(p, conf=0.25, max_det=300), torch.zeros((1, 300, 7))),
    ],
)
def test_decoders_reject_bad_shapes(decode: Any, pred: torch.Tensor) -> None:
    with pytest.raises(ModelOutputError):
        decode(pred)


def test_yolo_tensor_unwraps_tuples_and_lists() -> None:
    pred = torch.zeros((1, 84, 8400))
    assert yolo_tensor(pred) is pred
    assert yolo_tensor((pred, torch.zeros((1, 32, 160, 160)))) is pred
    assert yolo_tensor([pred]) is pred


@pytest.mark.parametrize("output", [{"pred": torch.zeros(1)}, (), ["x"], None])
def test_yolo_tensor_rejects_other_outputs(output: Any) -> None:
    with pytest.raises(ModelOutputError, match="YOLO prediction tensor"):
        yolo_tensor(output)


@pytest.mark.parametrize(
    ("shape", "num_classes", "expected"),
    [
        ((1, 84, 8400), 80, "yolov8"),
        ((1, 25200, 85), 80, "yolov5"),
        ((1, 300, 6), 80, "boxes"),
        ((1, 84, 21), 80, "yolov8"),  # tiny input: fewer anchors than rows, the class count decides
        ((1, 5, 8400), 1, "yolov8"),
        ((1, 84, 8400), None, "yolov8"),
        ((2, 25200, 85), None, "yolov5"),
    ],
)
def test_guess_layout(shape: tuple[int, int, int], num_classes: int | None, expected: str) -> None:
    assert guess_layout(shape, num_classes) == (expected, None)


def test_guess_layout_warns_when_six_columns_are_ambiguous() -> None:
    fmt, warning = guess_layout(torch.Size([1, 300, 6]), None)
    assert fmt == "boxes"
    assert warning is not None and "ambiguous" in warning and "yolov5" in warning


def test_guess_layout_one_class_yolov5_warns_too() -> None:
    fmt, warning = guess_layout((1, 25200, 6), 1)
    assert fmt == "yolov5"
    assert warning is not None and "boxes" in warning


@pytest.mark.parametrize(
    ("shape", "num_classes"),
    [
        ((1, 8400), None),
        ((1, 3, 8400), None),
        ((1, 8400, 5), None),
        ((1, 10, 10), None),
        ((1, 84, 8400), 3),
        ((1, 84, 8400), 0),
    ],
)
def test_guess_layout_rejects_unreadable_shapes(shape: tuple[int, ...], num_classes: int | None) -> None:
    with pytest.raises(ModelOutputError):
        guess_layout(shape, num_classes)
