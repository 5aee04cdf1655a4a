"""Model output adapters: torchvision dicts and tuples, scaling to original pixels, thresholds, clamping."""

from __future__ import annotations

import pytest
import torch

from worker.adapters import ModelOutputError, RawDetections, parse_torchvision_output, to_detection_rows
from worker.metadata import ModelMeta


def _dets(boxes: list[list[float]], labels: list[int], scores: list[float]) -> dict[str, torch.Tensor]:
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "labels": torch.tensor(labels, dtype=torch.int64),
        "scores": torch.tensor(scores, dtype=torch.float32),
    }


def test_list_of_dicts_is_parsed() -> None:
    parsed = parse_torchvision_output([_dets([[1, 2, 3, 4]], [1], [0.5]), _dets([], [], [])], expected=2)
    assert parsed[0].boxes.tolist() == [[1.0, 2.0, 3.0, 4.0]]
    assert parsed[1].boxes.shape == (0, 4)


def test_scripted_detector_tuple_is_unwrapped() -> None:
    losses: dict[str, torch.Tensor] = {}
    parsed = parse_torchvision_output((losses, [_dets([[0, 0, 5, 5]], [3], [0.9])]), expected=1)
    assert parsed[0].labels.tolist() == [3]


@pytest.mark.parametrize(
    "output",
    [
        torch.zeros(1, 6),
        [_dets([[0, 0, 1, 1]], [1], [0.5])] * 2,
        [{"boxes": torch.zeros(1, 4)}],
        [{"boxes": torch.zeros(1, 3), "labels": torch.zeros(1), "scores": torch.zeros(1)}],
    ],
)
def test_contract_violations_are_reported(output: object) -> None:
    with pytest.raises(ModelOutputError):
        parse_torchvision_output(output, expected=1)


def test_rows_are_scaled_clamped_thresholded_and_sorted() -> None:
    raw = RawDetections(
        boxes=torch.tensor([[10.0, 10.0, 20.0, 30.0], [-5.0, 0.0, 200.0, 10.0], [0.0, 0.0, 1.0, 1.0]]),
        labels=torch.tensor([1, 0, 2]),
        scores=torch.tensor([0.6, 0.9, 0.1]),
    )
    meta = ModelMeta(classes=("cat", "dog"))
    rows = to_detection_rows(
        raw, scale_x=2.0, scale_y=4.0, width=300, height=100, meta=meta, score_threshold=0.5
    )
    assert [r.label for r in rows] == ["cat", "dog"]
    assert (rows[0].x1, rows[0].y1, rows[0].x2, rows[0].y2) == (0.0, 0.0, 300.0, 40.0)
    assert (rows[1].x1, rows[1].y1, rows[1].x2, rows[1].y2) == (20.0, 40.0, 40.0, 100.0)
    assert rows[0].score == pytest.approx(0.9)


def test_label_without_name_uses_its_number() -> None:
    raw = RawDetections(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([7]), torch.tensor([0.5]))
    rows = to_detection_rows(
        raw, scale_x=1, scale_y=1, width=10, height=10, meta=ModelMeta(classes=("a",)), score_threshold=None
    )
    assert rows[0].label == "7" and rows[0].label_id == 7


def test_non_finite_detections_are_dropped() -> None:
    raw = RawDetections(
        torch.tensor([[0.0, 0.0, float("nan"), 1.0], [0.0, 0.0, 1.0, 1.0]]),
        torch.tensor([0, 0]),
        torch.tensor([0.5, float("nan")]),
    )
    rows = to_detection_rows(
        raw, scale_x=1, scale_y=1, width=10, height=10, meta=ModelMeta(), score_threshold=None
    )
    assert rows == ()
