"""Schedules files: parsed into schedules, or every error reported with its line; the environment form."""

from __future__ import annotations

from pathlib import Path

import pytest

from detq.errors import DetqError
from detq.vocabulary import JobPool
from producer.scheduler.schedules import (
    ScheduleConfigError,
    ScheduleIssue,
    check_paths,
    combine_schedules,
    load_schedules_file,
    parse_schedules,
    schedule_from_environment,
    validate_schedules_file,
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


def test_validate_reports_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    _, issues = validate_schedules_file(bad)
    rendered = [issue.render(str(bad)) for issue in issues]
    assert f"{bad}:1: unknown key 'colour'; expected [[schedule]]" in rendered
    assert any(line.startswith(f"{bad}:14: batch_size") for line in rendered)
    assert [issue.line for issue in issues] == sorted(issue.line for issue in issues)
    good = tmp_path / "good.toml"
    (tmp_path / "scans").mkdir()
    good.write_text('[[schedule]]\nname = "s"\nfolders = ["scans"]\ncron = "0 * * * *"\n')
    schedules, issues = validate_schedules_file(good)
    assert ([s.name for s in schedules], issues) == (["s"], [])


def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ScheduleConfigError, match="cannot read"):
        load_schedules_file(tmp_path / "absent.toml")
    schedules, issues = validate_schedules_file(tmp_path / "absent.toml")
    assert schedules == [] and len(issues) == 1 and issues[0].message.startswith("cannot read")


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
    example = Path(__file__).resolve().parents[3] / "docs" / "schedules.example.toml"
    (schedule,) = load_schedules_file(example)
    assert (schedule.name, schedule.pool, schedule.batch_size) == ("nightly-cameras", "any", 32)
    # What compose mounts on a fresh clone: a folder every container has, a pool every deployment runs
    assert schedule.folders == (Path("/data/images"),)


ALLOWED = "name, folders, cron, timezone, model, pool, batch_size, recursive"


def table(header: str = "[[schedule]]", **keys: str) -> str:
    """A [[schedule]] table: a valid one, with keys replaced (TOML values as written) or dropped ("")."""
    values = {"name": '"s"', "folders": '["scans"]', "cron": '"0 2 * * *"'} | keys
    return "\n".join([header, *(f"{key} = {value}" for key, value in values.items() if value)]) + "\n"


def test_errors_in_two_tables_are_reported_together(tmp_path: Path) -> None:
    text = table(name='"a"', cron='"0 2 * *"') + "\n" + table(name='"b"', pool='"tpu"')
    _, issues = parse_schedules(text, tmp_path)
    assert [(i.line, i.message.split(" ")[0]) for i in issues] == [(4, "cron"), (10, "pool")]
    assert issues[1].message == "pool must be one of any, gpu, cpu, not 'tpu'"


def test_several_errors_in_one_table_are_reported_together(tmp_path: Path) -> None:
    text = table(name='"bad name"', folders="[]", cron='"0 2 * *"', batch_size="0", recursive="1")
    _, issues = parse_schedules(text, tmp_path)
    assert [(i.line, i.message.split(" ")[0]) for i in issues] == [
        (2, "name"),
        (3, "folders"),
        (4, "cron"),
        (5, "batch_size"),
        (6, "recursive"),
    ]


def test_missing_folder_is_reported_with_errors_of_other_tables(tmp_path: Path) -> None:
    (tmp_path / "scans").mkdir()
    path = tmp_path / "schedules.toml"
    path.write_text(
        table(name='"ok"', folders='["scans", "gone"]')
        + table(name='"broken"', cron='"every night"')
        + table(name='"typo"', colour='"blue"')
    )
    schedules, issues = validate_schedules_file(path)
    assert [s.name for s in schedules] == ["ok"]
    assert [issue.render("f") for issue in issues] == [
        f"f:3: ok: not a folder: {tmp_path / 'gone'}",
        "f:8: cron 'every night' has 2 fields; expected 5 (minute hour day month weekday)"
        " or 6 (seconds first)",
        f"f:13: unknown key 'colour'; expected {ALLOWED}",
    ]
    with pytest.raises(ScheduleConfigError) as raised:
        load_schedules_file(path)
    assert [i.line for i in raised.value.issues] == [8, 13]  # loading does not look at the disk


def test_missing_model_file_is_reported_by_validate(tmp_path: Path) -> None:
    (tmp_path / "scans").mkdir()
    path = tmp_path / "schedules.toml"
    path.write_text(table(model='"models/m.pt"') + table(name='"t"', batch_size='"8"'))
    _, issues = validate_schedules_file(path)
    assert [(i.line, i.message) for i in issues] == [
        (5, f"s: model file not found: {tmp_path / 'models/m.pt'}"),
        (10, "batch_size must be an integer from 1 to 1024, not '8'"),
    ]


def test_unknown_key_names_the_allowed_keys(tmp_path: Path) -> None:
    _, issues = parse_schedules(table(colour='"blue"'), tmp_path)
    assert issues == [ScheduleIssue(5, f"unknown key 'colour'; expected {ALLOWED}")]


def test_wrong_types_are_refused_not_converted(tmp_path: Path) -> None:
    text = table(batch_size='"32"', recursive='"yes"', pool="1", model='""')
    _, issues = parse_schedules(text, tmp_path)
    assert [(i.line, i.message) for i in issues] == [
        (5, "batch_size must be an integer from 1 to 1024, not '32'"),
        (6, "recursive must be true or false, not 'yes'"),
        (7, "pool must be one of any, gpu, cpu, not 1"),
        (8, "model must be the path of a model file"),
    ]
    _, issues = parse_schedules(table(batch_size="true", folders='["a", 3]'), tmp_path)
    assert [(i.line, i.message) for i in issues] == [
        (3, "folders must be a non-empty list of folder paths; item 2 is 3"),
        (5, "batch_size must be an integer from 1 to 1024, not true"),
    ]


def test_batch_size_range_is_the_contract_one(tmp_path: Path) -> None:
    for good in ("1", "1024"):
        schedules, issues = parse_schedules(table(batch_size=good), tmp_path)
        assert issues == [] and schedules[0].batch_size == int(good)
    for bad in ("0", "1025", "-3", "8.0"):
        _, issues = parse_schedules(table(batch_size=bad), tmp_path)
        assert [i.line for i in issues] == [5] and issues[0].message.startswith("batch_size must be")


def test_bad_timezone_is_reported_at_its_line(tmp_path: Path) -> None:
    _, issues = parse_schedules(table(timezone='"Mars/Olympus"'), tmp_path)
    assert issues == [
        ScheduleIssue(5, "unknown timezone 'Mars/Olympus'; expected an IANA name such as 'Europe/Paris'")
    ]
    _, issues = parse_schedules(table(cron='"61 * * * *"', timezone='"Nowhere"'), tmp_path)
    assert [(i.line, i.message.split(" ")[0]) for i in issues] == [(4, "cron"), (5, "unknown")]


def test_missing_keys_are_reported_at_the_header(tmp_path: Path) -> None:
    text = "# comment\n" + table(name="", cron="")
    _, issues = parse_schedules(text, tmp_path)
    assert issues == [
        ScheduleIssue(2, "schedule is missing 'name'"),
        ScheduleIssue(2, "schedule is missing 'cron'"),
    ]


def test_duplicate_names_are_reported_with_other_errors(tmp_path: Path) -> None:
    text = table(name='"a"') + table(name='"b"', pool='"tpu"') + table(name='"a"', batch_size="0")
    schedules, issues = parse_schedules(text, tmp_path)
    assert [s.name for s in schedules] == ["a"]
    assert [(i.line, i.message) for i in issues] == [
        (9, "pool must be one of any, gpu, cpu, not 'tpu'"),
        (11, "duplicate schedule name 'a' (first at line 1)"),
        (14, "batch_size must be an integer from 1 to 1024, not 0"),
    ]


def test_schedule_errors_are_detq_errors_with_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text('colour = "blue"\n' + table(pool='"tpu"'))
    with pytest.raises(ScheduleConfigError) as raised:
        load_schedules_file(path)
    assert isinstance(raised.value, DetqError) and isinstance(raised.value, ValueError)
    assert str(raised.value).splitlines() == [
        f"{path}:1: unknown key 'colour'; expected [[schedule]]",
        f"{path}:6: pool must be one of any, gpu, cpu, not 'tpu'",
    ]
    assert "pydantic" not in str(raised.value)


def test_pool_is_the_vocabulary_enum(tmp_path: Path) -> None:
    schedules, _ = parse_schedules(table(pool='"cpu"'), tmp_path)
    assert schedules[0].pool is JobPool.CPU
    schedules, _ = parse_schedules(table(), tmp_path)
    assert (schedules[0].pool, schedules[0].recursive, schedules[0].cron.timezone) == (
        JobPool.ANY,
        True,
        "UTC",
    )


def test_top_level_problems(tmp_path: Path) -> None:
    _, issues = parse_schedules("[schedule]\nname = 'a'\n", tmp_path)
    assert issues == [ScheduleIssue(1, "schedule must be [[schedule]]")]
    _, issues = parse_schedules("# nothing\n", tmp_path)
    assert issues == [ScheduleIssue(0, "no [[schedule]] table")]
    _, issues = parse_schedules(table() + "[extra]\nx = 1\n", tmp_path)
    assert issues == [ScheduleIssue(5, "unknown key 'extra'; expected [[schedule]]")]


def test_environment_errors_are_reported_together(tmp_path: Path) -> None:
    with pytest.raises(ScheduleConfigError) as raised:
        schedule_from_environment(
            name="bad name", folder=tmp_path, cron="0 2 *", timezone="Mars/Olympus", pool="tpu"
        )
    assert [i.message.split(":")[0] for i in raised.value.issues] == [
        "DETQ_SCHEDULE_NAME",
        "DETQ_SCHEDULE_TIMEZONE",
        "DETQ_SCHEDULE_CRON",
        "DETQ_SCHEDULE_POOL",
    ]
    schedule = schedule_from_environment(
        name="n", folder=tmp_path, cron="* * * * *", timezone="UTC", pool=JobPool.GPU
    )
    assert schedule is not None and schedule.pool is JobPool.GPU
