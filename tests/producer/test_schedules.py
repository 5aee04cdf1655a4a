"""Schedules files: parsed into schedules, or every error reported with its line; the environment form."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.cli import main
from producer.schedules import (
    ScheduleConfigError,
    check_paths,
    combine_schedules,
    load_schedules_file,
    parse_schedules,
    schedule_from_environment,
)

GOOD = """\
# nightly runs
[[schedule]]
name = "cams"
folders = ["cams/a", "/data/b"]
cron = "0 2 * * *"
timezone = "Europe/Paris"
pool = "gpu"
batch_size = 32

[[schedule]]
name = "fast"
folders = ["scans"]
cron = "*/5 * * * * *"
model = "models/m.pt"
recursive = false
"""


def test_good_file_is_parsed(tmp_path: Path) -> None:
    schedules, issues = parse_schedules(GOOD, tmp_path)
    assert issues == []
    cams, fast = schedules
    assert (cams.name, cams.folders, cams.pool, cams.batch_size) == (
        "cams",
        (tmp_path / "cams/a", Path("/data/b")),
        "gpu",
        32,
    )
    assert (cams.cron.expression, cams.cron.timezone, cams.line) == ("0 2 * * *", "Europe/Paris", 2)
    assert (fast.model, fast.recursive, fast.batch_size, fast.pool, fast.line) == (
        tmp_path / "models/m.pt",
        False,
        None,
        "any",
        10,
    )


BAD = """\
colour = "blue"

[[schedule]]
name = "cams"
folders = "not-a-list"
cron = "0 2 * *"
pool = "tpu"

[[schedule]]
name = "cams"
folders = ["x"]
cron = "0 2 * * *"
timezone = "Nowhere/Else"
batch_size = 0
frequency = "daily"

[[schedule]]
folders = ["y"]
"""


def test_every_error_is_reported_with_its_line(tmp_path: Path) -> None:
    _, issues = parse_schedules(BAD, tmp_path)
    found = {(issue.line, issue.message.split(" ")[0]) for issue in issues}
    assert (1, "unknown") in found  # colour
    assert (5, "folders") in found
    assert (6, "cron") in found
    assert (7, "pool") in found
    assert (13, "unknown") in found  # time zone
    assert (14, "batch_size") in found
    assert (15, "unknown") in found  # frequency
    assert (17, "schedule") in found  # missing name and cron, at the table's header
    assert len([i for i in issues if i.line == 17]) == 2


def test_duplicate_names_point_at_the_second(tmp_path: Path) -> None:
    text = '[[schedule]]\nname = "a"\nfolders = ["x"]\ncron = "* * * * *"\n\n' * 2
    _, issues = parse_schedules(text, tmp_path)
    assert [(i.line, i.message) for i in issues] == [(7, "duplicate schedule name 'a' (first at line 1)")]


def test_toml_syntax_error_has_its_line(tmp_path: Path) -> None:
    _, issues = parse_schedules('[[schedule]]\nname = "a\n', tmp_path)
    assert len(issues) == 1 and issues[0].line == 2 and issues[0].message.startswith("invalid TOML")


def test_missing_paths_are_reported_by_validate(tmp_path: Path) -> None:
    (tmp_path / "cams" / "a").mkdir(parents=True)
    schedules, _ = parse_schedules(GOOD, tmp_path)
    lines = sorted((issue.line, issue.message) for issue in check_paths(schedules))
    assert [line for line, _ in lines] == [4, 12, 14]


def test_validate_command_prints_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    assert main(["schedule", "validate", str(bad)]) == 1
    errors = capsys.readouterr().err.splitlines()
    assert f"{bad}:1: unknown key 'colour'; expected [[schedule]]" in errors
    assert any(line.startswith(f"{bad}:14: batch_size") for line in errors)
    good = tmp_path / "good.toml"
    (tmp_path / "scans").mkdir()
    good.write_text('[[schedule]]\nname = "s"\nfolders = ["scans"]\ncron = "0 * * * *"\n')
    assert main(["schedule", "validate", str(good)]) == 0
    assert "1 schedules, no errors" in capsys.readouterr().out


def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ScheduleConfigError, match="cannot read"):
        load_schedules_file(tmp_path / "absent.toml")


def test_environment_schedule(tmp_path: Path) -> None:
    assert (
        schedule_from_environment(name="default", folder=None, cron=None, timezone="UTC", pool="any") is None
    )
    schedule = schedule_from_environment(
        name="nightly", folder=tmp_path, cron="30 1 * * *", timezone="UTC", pool="cpu"
    )
    assert schedule is not None and (schedule.folders, schedule.pool) == ((tmp_path,), "cpu")
    with pytest.raises(ScheduleConfigError, match="must be set together"):
        schedule_from_environment(name="n", folder=tmp_path, cron=None, timezone="UTC", pool="any")
    with pytest.raises(ScheduleConfigError, match="defined in the file and the environment"):
        combine_schedules([schedule], schedule)


def test_the_documented_example_parses() -> None:
    example = Path(__file__).resolve().parents[2] / "docs" / "schedules.example.toml"
    (schedule,) = load_schedules_file(example)
    assert (schedule.name, schedule.pool, schedule.batch_size) == ("nightly-cameras", "gpu", 32)
