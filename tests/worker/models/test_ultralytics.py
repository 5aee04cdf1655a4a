"""Ultralytics and YOLOv5 config.txt translated into detq model metadata."""

from __future__ import annotations

import json

import pytest

from detq.vocabulary import ModelFormat
from worker.models.metadata import YOLO_DEFAULTS, ModelMetaError, parse_model_meta
from worker.models.ultralytics import parse_ultralytics_config

DESCRIPTION = "Ultralytics YOLO11n model trained on /usr/src/ultralytics/ultralytics/cfg/datasets/coco.yaml"
# As ultralytics' TorchScript exporter writes it: json.dumps(metadata), so int keys of names become strings.
YOLO11_CONFIG = json.dumps(
    {
        "description": DESCRIPTION,
        "author": "Ultralytics",
        "date": "2025-01-10T12:34:56.789012",
        "version": "8.3.59",
        "license": "AGPL-3.0 License (https://ultralytics.com/license)",
        "docs": "https://docs.ultralytics.com",
        "stride": 32,
        "task": "detect",
        "batch": 1,
        "imgsz": [640, 640],
        "names": {"0": "person", "1": "bicycle", "2": "car"},
        "args": {"batch": 1, "optimize": False, "half": False, "nms": False, "dynamic": False},
        "channels": 3,
    }
)


def test_yolo11_config() -> None:
    meta = parse_ultralytics_config(YOLO11_CONFIG)
    assert meta == {
        "source": "ultralytics config.txt",
        "letterbox": True,
        "classes": ["person", "bicycle", "car"],
        "input_size": [640, 640],
        "score_threshold": 0.25,
        "iou_threshold": 0.7,
        "max_detections": 300,
        "name": DESCRIPTION,
    }
    assert "format" not in meta  # decided later from the warm-up output shape


def test_yolov5_repo_config() -> None:
    text = '{"shape": [1, 3, 384, 640], "stride": 32, "names": ["person", "bicycle"]}'
    meta = parse_ultralytics_config(text)
    assert meta["classes"] == ["person", "bicycle"]
    assert meta["input_size"] == [384, 640]
    assert meta["letterbox"] is True
    assert "format" not in meta and "name" not in meta


def test_names_dict_is_ordered_by_id_and_gaps_are_filled() -> None:
    meta = parse_ultralytics_config('{"names": {"10": "ten", "0": "zero", "2": "two"}, "imgsz": 320}')
    assert meta["classes"] == ["zero", "1", "two", "3", "4", "5", "6", "7", "8", "9", "ten"]
    assert meta["input_size"] == [320, 320]


def test_nms_export_reads_final_boxes_and_its_args() -> None:
    config = json.loads(YOLO11_CONFIG)
    config["args"].update({"nms": True, "conf": 0.4, "iou": 0.5, "max_det": 100})
    meta = parse_ultralytics_config(json.dumps(config))
    assert meta["format"] == "boxes"
    assert (meta["score_threshold"], meta["iou_threshold"], meta["max_detections"]) == (0.4, 0.5, 100)


def test_end2end_model_returns_final_boxes() -> None:
    config = json.loads(YOLO11_CONFIG)
    config["end2end"] = True  # YOLOv10 / YOLO26 exports pick their top boxes without NMS
    assert parse_ultralytics_config(json.dumps(config))["format"] == "boxes"


def test_segment_task_is_rejected() -> None:
    config = json.loads(YOLO11_CONFIG)
    config["task"] = "segment"
    with pytest.raises(ValueError, match="task 'segment' is not supported; export a detect model"):
        parse_ultralytics_config(json.dumps(config))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"names": {"person": "x"}}', "class id"),
        ('{"names": "coco.yaml"}', "'names'"),
        ('{"imgsz": [640, 640, 3]}', "imgsz"),
        ('{"imgsz": [0, 640]}', "positive"),
        ('{"shape": [640, 640]}', "shape"),
        ('{"args": {"conf": 2}}', "args.conf"),
        ('{"args": {"max_det": 0}}', "max_det"),
        ('{"channels": 1}', "channels"),
    ],
)
def test_malformed_configs_are_rejected(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_ultralytics_config(text)


def test_several_problems_are_reported_together_one_line_each() -> None:
    text = '{"task": "pose", "channels": 1, "imgsz": [640, -1], "args": {"conf": true, "max_det": 0}}'
    with pytest.raises(ModelMetaError) as caught:
        parse_ultralytics_config(text)
    lines = str(caught.value).splitlines()
    assert len(lines) == 5 and all(line.startswith("Ultralytics config.txt '") for line in lines)
    assert [line.split("'")[1] for line in lines] == [
        "task",
        "channels",
        "imgsz[1]",
        "args.conf",
        "args.max_det",
    ]
    assert "http" not in str(caught.value)


def test_thresholds_default_to_the_shared_yolo_defaults() -> None:
    meta = parse_ultralytics_config('{"imgsz": 640, "args": null, "description": 7}')
    assert (meta["score_threshold"], meta["iou_threshold"], meta["max_detections"]) == (
        YOLO_DEFAULTS.score_threshold,
        YOLO_DEFAULTS.iou_threshold,
        YOLO_DEFAULTS.max_detections,
    )
    assert "name" not in meta  # a description that is not text names nothing


def test_result_is_valid_detq_metadata() -> None:
    config = json.loads(YOLO11_CONFIG)
    config["args"].update({"nms": True, "conf": 1})
    meta = parse_model_meta(parse_ultralytics_config(json.dumps(config)), source="Ultralytics config.txt")
    assert meta.format is ModelFormat.BOXES and meta.score_threshold == 1.0
    assert meta.classes == ("person", "bicycle", "car") and meta.input_size == (640, 640)


def test_non_object_args_and_empty_names_dict() -> None:
    with pytest.raises(ModelMetaError, match="'args': must be a JSON object"):
        parse_ultralytics_config('{"args": [1]}')
    assert parse_ultralytics_config('{"names": {}}')["classes"] == []
