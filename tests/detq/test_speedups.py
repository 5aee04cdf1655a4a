"""The speed-ups in one list: each has a switch that Settings reads, and DETQ_AS_SAVED turns them all off."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from detq.settings import Settings
from detq.speedups import SPEEDUPS, as_saved_values, off_by_settings

ROOT = Path(__file__).resolve().parents[2]


def test_every_speedup_names_a_setting_a_module_and_a_section_of_the_models_page() -> None:
    names = {field.name for field in fields(Settings)}
    page = (ROOT / "docs" / "models.md").read_text()
    section = page.split("## Speed-ups", 1)[1].split("\n## ", 1)[0]
    for speedup in SPEEDUPS:
        assert speedup.switch in names, speedup
        assert (ROOT / speedup.module).is_file(), speedup
        assert f"| {speedup.name} |" in section and f"`{speedup.variable}`" in section, speedup.name
    assert len({speedup.name for speedup in SPEEDUPS}) == len(SPEEDUPS)


def test_the_defaults_run_every_exact_speedup_and_no_trade() -> None:
    off = {speedup.name for speedup in off_by_settings(Settings(_env_file=None))}
    assert off == {speedup.name for speedup in SPEEDUPS if not speedup.exact}


def test_as_saved_turns_every_speedup_off_whatever_else_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETQ_AS_SAVED", "true")
    monkeypatch.setenv("DETQ_MICRO_BATCH", "8")
    monkeypatch.setenv("DETQ_CPU_OPTIMIZE", "true")
    monkeypatch.setenv("DETQ_FAST_DECODE", "true")
    settings = Settings(_env_file=None)
    assert off_by_settings(settings) == list(SPEEDUPS)
    assert settings.micro_batch == 1 and not settings.fast_decode and not settings.process_tuning
    # A flag folded in later does not turn one back on; without as_saved it does.
    assert settings.replace(micro_batch=4, cpu_optimize=True).micro_batch == 1
    assert off_by_settings(settings.replace(micro_batch=4, cpu_optimize=True)) == list(SPEEDUPS)
    monkeypatch.delenv("DETQ_AS_SAVED")
    plain = Settings(_env_file=None)
    assert plain.micro_batch == 8 and plain.cpu_optimize and plain.fast_decode
    assert off_by_settings(plain.replace(as_saved=True)) == list(SPEEDUPS)
    assert set(as_saved_values()) == {speedup.switch for speedup in SPEEDUPS}
