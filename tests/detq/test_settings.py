"""Settings: defaults run embedded; DETQ_* variables override; empty values mean the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from detq.settings import BUNDLED_MODEL, Settings


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
    assert documented == {f"DETQ_{name.upper()}" for name in Settings.model_fields}
    Settings(_env_file=example)


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("DETQ_BATCH_SIZE", "0")
    with pytest.raises(ValidationError):
        Settings(_env_file=None)


def test_readme_documents_every_setting() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    missing = [name for name in Settings.model_fields if f"DETQ_{name.upper()}" not in readme]
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
    assert Settings(_env_file=None).batch_size == Settings.model_fields["batch_size"].default
