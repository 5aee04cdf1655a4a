"""detq.json metadata parsing."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from detq.errors import DetqError
from detq.vocabulary import ModelFormat
from worker.models.metadata import (
    YOLO_DEFAULTS,
    MetaOverrides,
    ModelMeta,
    ModelMetaError,
    parse_input_size,
    parse_model_meta,
)


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


def test_error_names_the_key_on_one_line() -> None:
    with pytest.raises(ModelMetaError) as caught:
        parse_model_meta({"score_threshold": 3})
    assert str(caught.value).startswith("'score_threshold': must be at most 1")
    assert "\n" not in str(caught.value)
    assert caught.value.problems == (str(caught.value),)


def test_several_problems_are_reported_together_one_line_each() -> None:
    raw = {"format": "onnx", "classes": ["a", 1], "input_size": [0, 64], "max_detections": True}
    with pytest.raises(ModelMetaError) as caught:
        parse_model_meta(raw)
    lines = str(caught.value).splitlines()
    assert lines == list(caught.value.problems)
    assert [line.split(":")[0] for line in lines] == [
        "'format'",
        "'classes[1]'",
        "'input_size[0]'",
        "'max_detections'",
    ]
    assert "'yolov5'" in lines[0] and "'onnx'" in lines[0]
    assert lines[2] == "'input_size[0]': must be positive, got 0"
    # pydantic's own dump (its model name, error counts, documentation links) never reaches the user.
    assert "ModelMeta" not in str(caught.value) and "http" not in str(caught.value)


def test_metadata_error_is_a_user_facing_value_error() -> None:
    assert issubclass(ModelMetaError, DetqError) and issubclass(ModelMetaError, ValueError)


@pytest.mark.parametrize(
    "raw",
    [
        {"score_threshold": True},
        {"iou_threshold": False},
        {"max_detections": True},
        {"max_detections": 2.0},
        {"score_threshold": "0.5"},
        {"name": 5},
        {"std": [1, 2, 3, 4]},
        {"input_size": "big"},
        {"input_size": [64, 20000]},
    ],
)
def test_strict_types_are_refused(raw: dict[str, object]) -> None:
    (key,) = raw
    with pytest.raises(ModelMetaError, match=f"^'{key}"):
        parse_model_meta(raw)


def test_unknown_keys_are_ignored_and_source_is_ours() -> None:
    meta = parse_model_meta({"format": "yolov5", "author": "someone", "source": "x"}, source="sidecar m.json")
    assert meta.format is ModelFormat.YOLOV5
    assert meta.source == "sidecar m.json"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("320,256", (320, 256)), ("320x256", (320, 256)), (640, (640, 640)), ([512], (512, 512)), ("", None)],
)
def test_input_size_forms(value: object, expected: tuple[int, int] | None) -> None:
    assert parse_input_size(value) == expected
    assert parse_model_meta({"input_size": value}).input_size == expected


@pytest.mark.parametrize("value", ["a,b", "0", [1, 2, 3], True, "16385"])
def test_bad_input_size_setting_is_refused(value: object) -> None:
    with pytest.raises(ModelMetaError, match="^'input_size"):
        parse_input_size(value)


def test_mean_and_std_spread_a_single_number() -> None:
    meta = parse_model_meta({"mean": 0.5, "std": [0.2, 0.3, 0.4]})
    assert meta.mean == (0.5, 0.5, 0.5) and meta.std == (0.2, 0.3, 0.4)


def test_yolo_defaults_are_the_single_source() -> None:
    filled = ModelMeta(format=ModelFormat.YOLOV8).with_yolo_defaults()
    assert (filled.score_threshold, filled.iou_threshold, filled.max_detections) == (0.25, 0.7, 300)
    assert (YOLO_DEFAULTS.score_threshold, YOLO_DEFAULTS.iou_threshold, YOLO_DEFAULTS.max_detections) == (
        0.25,
        0.7,
        300,
    )
    assert ModelMeta().fixed_input_size() == YOLO_DEFAULTS.input_size == (640, 640)
    assert ModelMeta(score_threshold=0.0).yolo_thresholds() == (0.0, 0.7, 300)  # 0 is set, not missing


def test_meta_is_frozen_and_copies_keep_it_valid() -> None:
    meta = parse_model_meta({"classes": ["a"]})
    with pytest.raises(ValidationError):
        meta.letterbox = False  # type: ignore[misc]
    assert meta.with_format("boxes").format is ModelFormat.BOXES
    assert meta.with_format("boxes").fixed_input and not meta.fixed_input
    with pytest.raises(ValueError):
        meta.with_format("onnx")


def test_overrides_win_and_unset_ones_keep_the_model_value() -> None:
    meta = parse_model_meta({"format": "yolov8", "score_threshold": 0.4, "max_detections": 50})
    overrides = MetaOverrides(format=ModelFormat.BOXES, input_size=(320, 320), score_threshold=0.1)
    applied = overrides.apply(meta)
    assert applied.format is ModelFormat.BOXES and applied.input_size == (320, 320)
    assert (applied.score_threshold, applied.max_detections) == (0.1, 50)
    assert MetaOverrides().apply(meta) is meta
    with pytest.raises(ValidationError):
        MetaOverrides(score_threshold=2)


def test_as_dict_is_json_ready() -> None:
    meta = parse_model_meta({"format": "yolov5", "classes": ["a"], "input_size": 64, "mean": 0})
    as_json = json.loads(json.dumps(meta.as_dict()))
    assert as_json["format"] == "yolov5" and as_json["input_size"] == [64, 64]
    assert as_json["mean"] == [0.0, 0.0, 0.0] and as_json["source"] == "detq.json"
