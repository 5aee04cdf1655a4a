"""detq.json metadata parsing."""

from __future__ import annotations

import pytest

from worker.metadata import ModelMetaError, parse_model_meta


def test_full_metadata_is_parsed() -> None:
    meta = parse_model_meta(
        {"format": "torchvision", "classes": ["a", "b"], "input_size": [256, 320], "score_threshold": 0.3}
    )
    assert meta.classes == ("a", "b")
    assert meta.input_size == (256, 320)
    assert meta.score_threshold == 0.3
    assert meta.label_name(1) == "b" and meta.label_name(5) == "5"


@pytest.mark.parametrize(
    "raw",
    [
        {"format": "onnx"},
        {"classes": "a,b"},
        {"input_size": [256, 256, 3]},
        {"letterbox": "yes"},
        {"max_detections": 0},
        {"mean": [0.5, 0.5]},
        {"input_size": [0, 10]},
        {"score_threshold": 3},
    ],
)
def test_bad_metadata_is_refused(raw: dict[str, object]) -> None:
    with pytest.raises(ModelMetaError):
        parse_model_meta(raw)
