"""Settings: defaults run embedded; DETQ_* variables override; empty values mean the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from detq.setting_values import SettingsError
from detq.settings import BUNDLED_MODEL, SETTING_NAMES, Settings
from detq.vocabulary import ModelFormat, Precision


def test_defaults_are_embedded_in_the_users_data_folder_wherever_detq_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    for folder in (tmp_path, tmp_path / "elsewhere"):
        folder.mkdir(exist_ok=True)
        monkeypatch.chdir(folder)
        settings = Settings(_env_file=None)
        assert settings.resolved_data_dir == tmp_path / "share" / "detq"
    assert settings.resolved_database_url == f"sqlite:///{tmp_path / 'share' / 'detq' / 'detq.db'}"
    assert settings.is_embedded_broker
    assert settings.model == BUNDLED_MODEL
    assert settings.allowed_root_paths == []


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DETQ_BROKER_URL", "redis://h:6379/0")
    monkeypatch.setenv("DETQ_DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("DETQ_ALLOWED_ROOTS", f"{tmp_path / 'a'}:{tmp_path / 'b'},{tmp_path / 'c'}")
    monkeypatch.setenv("DETQ_BATCH_SIZE", "32")
    monkeypatch.setenv("DETQ_SCORE_THRESHOLD", "")
    settings = Settings(_env_file=None)
    assert not settings.is_embedded_broker
    assert settings.resolved_database_url == "postgresql://u@h/db"
    assert settings.allowed_root_paths == [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    assert settings.batch_size == 32
    assert settings.score_threshold is None


def test_env_file_example_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    example = Path(__file__).resolve().parents[2] / ".env.example"
    documented = {line.split("=", 1)[0] for line in example.read_text().splitlines() if line[:5] == "DETQ_"}
    assert documented == {f"DETQ_{name.upper()}" for name in SETTING_NAMES}
    Settings(_env_file=example)


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETQ_BATCH_SIZE", "0")
    with pytest.raises(SettingsError, match="^DETQ_BATCH_SIZE: must be at least 1, not 0$"):
        Settings(_env_file=None)


def test_the_configuration_page_documents_every_setting() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [name for name in SETTING_NAMES if f"DETQ_{name.upper()}" not in page]
    assert missing == []


def test_env_file_then_environment_then_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Given a .env file with four settings (one empty, one in lower case) and a name detq does not know,
    env_file = tmp_path / ".env"
    env_file.write_text(
        "DETQ_BATCH_SIZE=24\nDETQ_MICRO_BATCH=4\nDETQ_SCORE_THRESHOLD=\n"
        "detq_broker_url='redis://from-file:6379/0'\nDETQ_NO_SUCH_SETTING=1\nOTHER=2\n"
    )
    # and the environment setting one of them again
    monkeypatch.setenv("DETQ_MICRO_BATCH", "2")
    monkeypatch.delenv("DETQ_BATCH_SIZE", raising=False)
    monkeypatch.delenv("DETQ_BROKER_URL", raising=False)
    # When settings are read from the folder of that file, and once more with an argument
    monkeypatch.chdir(tmp_path)
    read = Settings()
    given = Settings(micro_batch=16)
    # Then the file's values hold where nothing else sets them, the environment wins over the file, an
    # argument over both; an empty value is the default and unknown names are ignored
    assert (read.batch_size, read.micro_batch, read.score_threshold) == (24, 2, None)
    assert read.resolved_broker_url == "redis://from-file:6379/0"
    assert given.micro_batch == 16
    # And without the file, only the environment counts
    assert Settings(_env_file=None).batch_size == 16


def test_every_bad_value_is_named_at_once_with_what_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETQ_MICRO_BATCH", "eight")
    monkeypatch.setenv("DETQ_PRECISION", "fp8")
    with pytest.raises(SettingsError) as raised:
        Settings(_env_file=None, fast_decode="maybe", model_sha256="ABC")
    assert raised.value.problems == [
        "DETQ_MODEL_SHA256: must be 64 lower-case hex digits, not 'ABC'",
        "DETQ_MICRO_BATCH: must be a whole number, not 'eight'",
        "DETQ_FAST_DECODE: must be true or false, not 'maybe'",
        "DETQ_PRECISION: must be one of fp32, fp16, bf16, not 'fp8'",
    ]


def test_values_are_read_to_their_types(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "DETQ_WORKER_TIMEOUT": "45",
        "DETQ_FAST_DECODE": "Yes",
        "DETQ_BACKUPS": "off",
        "DETQ_PRECISION": "bf16",
        "DETQ_MODEL_FORMAT": "yolov8",
        "DETQ_SCHEDULE_FOLDER": "/data/in",
        "DETQ_METRICS_PORT": " 9100 ",
    }.items():
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)
    assert settings.worker_timeout == 45.0 and isinstance(settings.worker_timeout, float)
    assert (settings.fast_decode, settings.backups) == (True, False)
    assert (settings.precision, settings.model_format) == (Precision.BF16, ModelFormat.YOLOV8)
    assert settings.schedule_folder == Path("/data/in")
    assert settings.metrics_port == 9100


def test_replace_checks_its_values_and_leaves_the_original() -> None:
    settings = Settings(_env_file=None)
    changed = settings.replace(batch_size="32", precision=Precision.FP16)
    assert (changed.batch_size, changed.precision) == (32, Precision.FP16)
    assert (settings.batch_size, settings.precision) == (16, Precision.FP32)
    with pytest.raises(SettingsError, match="DETQ_BROKER_POLLING_INTERVAL: must be greater than 0"):
        settings.replace(broker_polling_interval=0)
    with pytest.raises(TypeError, match="no such settings"):
        settings.replace(no_such=1)
