"""Reading model outputs: torchvision dicts and the (losses, detections) tuple; contract violations."""

from __future__ import annotations

import pytest
import torch

from worker.models.outputs import ModelOutputError, parse_torchvision_output


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
