"""Detections to ledger rows: scaling to original pixels, thresholds, clamping, order, label names."""

from __future__ import annotations

import pytest
import torch

from worker.models.metadata import ModelMeta
from worker.models.outputs import RawDetections
from worker.pipeline import to_detection_rows


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
