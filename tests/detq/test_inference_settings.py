"""A job's inference settings: what they record, their key, and how they read back."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from detq.inference_settings import DEFAULT_KEY, DEFAULTS, InferenceSettings
from detq.settings import Settings
from detq.vocabulary import ModelFormat, Precision

CHANGED = [
    InferenceSettings(score_threshold=0.5),
    InferenceSettings(classes=("person",)),
    InferenceSettings(input_size=(320, 320)),
    InferenceSettings(iou_threshold=0.5),
    InferenceSettings(max_detections=10),
    InferenceSettings(model_format=ModelFormat.YOLOV8),
    InferenceSettings(precision=Precision.FP16),
    InferenceSettings(fast_decode=True),
]


def test_every_setting_changes_the_key_and_the_defaults_key_is_the_one_migration_0008_gave() -> None:
    keys = [s.key for s in CHANGED]
    assert len(set(keys)) == len(keys) and DEFAULT_KEY not in keys
    assert DEFAULT_KEY == hashlib.sha256(b"{}").hexdigest()[:16]
    migration = (
        Path(__file__).resolve().parents[2] / "db" / "migrations" / "versions" / "0008_job_settings.py"
    )
    spec = importlib.util.spec_from_file_location("migration_0008", migration)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.DEFAULT_KEY == DEFAULT_KEY


@pytest.mark.parametrize("settings", [DEFAULTS, *CHANGED, InferenceSettings(0.25, ("a", "7"), (480, 640))])
def test_settings_read_back_as_they_were_recorded(settings: InferenceSettings) -> None:
    assert InferenceSettings.from_json(settings.to_json()) == settings


def test_a_newer_detqs_setting_is_ignored_and_an_older_ones_missing_setting_is_its_default() -> None:
    assert InferenceSettings.from_json({"score_threshold": 0.4, "tile": 2}) == InferenceSettings(
        score_threshold=0.4
    )
    with pytest.raises(ValueError, match="cannot be read"):
        InferenceSettings.from_json({"precision": "fp8"})


def test_settings_come_from_detq_settings_and_say_what_differs() -> None:
    settings = Settings(_env_file=None, score_threshold="0.6", classes="person, dog", input_size="480x640")
    made = InferenceSettings.from_settings(settings)
    assert made == InferenceSettings(score_threshold=0.6, classes=("person", "dog"), input_size=(480, 640))
    assert made.describe() == "conf 0.6, classes person,dog, imgsz 480x640"
    assert DEFAULTS.describe() == "the model's defaults"
    assert made.keeps(0, "person") and made.keeps(7, "dog") and not made.keeps(1, "cat")
    assert InferenceSettings(classes=("3",)).keeps(3, "truck")
