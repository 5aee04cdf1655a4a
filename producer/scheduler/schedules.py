"""Schedules from a TOML file or the environment, validated by pydantic, every error with its line."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, time
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from pydantic.functional_validators import field_validator
from pydantic_core import ErrorDetails
from pydantic_core.core_schema import ValidationInfo

from detq.contract import MAX_BATCH_SIZE, MIN_BATCH_SIZE
from detq.errors import DetqError
from detq.vocabulary import JobPool, choices
from producer.scheduler.cron import CronSpec
from producer.scheduler.toml_lines import TableLines, locate_tables, toml_error

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
KEYS = ("name", "folders", "cron", "timezone", "model", "pool", "batch_size", "recursive")
# What each key must be, for the messages of pydantic's type and constraint errors.
RULES = {
    "name": "name must be 1-100 letters, digits, '_', '.' or '-', starting with a letter or digit",
    "folders": "folders must be a non-empty list of folder paths",
    "cron": "cron must be a string such as '0 2 * * *'",
    "timezone": "timezone must be a string such as 'Europe/Paris'",
    "model": "model must be the path of a model file",
    "pool": f"pool must be one of {', '.join(choices(JobPool))}",
    "batch_size": f"batch_size must be an integer from {MIN_BATCH_SIZE} to {MAX_BATCH_SIZE}",
    "recursive": "recursive must be true or false",
}
ENV_NAMES = {key: f"DETQ_SCHEDULE_{key.upper()}" for key in ("name", "cron", "timezone", "pool")}
ENV_NAMES["folders"] = "DETQ_SCHEDULE_FOLDER"
ENV_TOGETHER = "DETQ_SCHEDULE_FOLDER and DETQ_SCHEDULE_CRON must be set together"

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]


@dataclass(frozen=True)
class Schedule:
    """A recurring incremental scan of folders with one model on one pool."""

    name: str
    folders: tuple[Path, ...]
    cron: CronSpec
    model: Path | None = None  # None: DETQ_MODEL when the run starts
    pool: JobPool = JobPool.ANY
    batch_size: int | None = None  # None: DETQ_BATCH_SIZE
    recursive: bool = True
    line: int = 0  # where the [[schedule]] table starts in its file; 0 for the environment
    folders_line: int = 0
    model_line: int = 0


@dataclass(frozen=True)
class ScheduleIssue:
    """One problem in a schedules file, at a 1-based line (0 when it has none)."""

    line: int
    message: str

    def render(self, source: str) -> str:
        """`file:line: message`, as compilers and linters print."""
        return f"{source}:{self.line}: {self.message}" if self.line else f"{source}: {self.message}"


class ScheduleConfigError(DetqError, ValueError):
    """A schedules configuration with errors; carries all of them."""

    def __init__(self, source: str, issues: Sequence[ScheduleIssue]) -> None:
        self.source = source
        self.issues = list(issues)
        super().__init__("\n".join(issue.render(source) for issue in self.issues))


class ScheduleTable(BaseModel):
    """One [[schedule]] table as written; timezone is declared before cron so cron is read in its zone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[StrictStr, Field(pattern=NAME_PATTERN)]
    folders: Annotated[list[NonEmptyStr], Field(min_length=1)]
    timezone: StrictStr = "UTC"
    cron: StrictStr
    model: NonEmptyStr | None = None
    pool: JobPool = JobPool.ANY
    batch_size: Annotated[StrictInt, Field(ge=MIN_BATCH_SIZE, le=MAX_BATCH_SIZE)] | None = None
    recursive: StrictBool = True

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise ValueError(
                f"unknown timezone {value!r}; expected an IANA name such as 'Europe/Paris'"
            ) from None
        return value

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str, info: ValidationInfo) -> str:
        # A timezone that failed its own check is absent here: the expression alone is checked, in UTC.
        CronSpec(value, info.data.get("timezone", "UTC"))  # CronError is a ValueError: pydantic reports it
        return value

    def to_schedule(self, lines: TableLines, base_dir: Path) -> Schedule:
        """The schedule of this table; relative paths are taken from base_dir."""
        return Schedule(
            name=self.name,
            folders=tuple(base_dir / Path(folder).expanduser() for folder in self.folders),
            cron=CronSpec(self.cron, self.timezone),
            model=base_dir / Path(self.model).expanduser() if self.model is not None else None,
            pool=self.pool,
            batch_size=self.batch_size,
            recursive=self.recursive,
            line=lines.header,
            folders_line=lines.of("folders"),
            model_line=lines.of("model"),
        )


def _shown(value: Any) -> str:
    """A value as a short phrase for a message: TOML's true/false, a quoted string, or its kind."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        text = repr(value)
        return text if len(text) <= 40 else f"{text[:36]}...{text[-1]}"
    kinds = ((list, "a list"), (dict, "a table"), (date, "a date"), (time, "a time"))
    return next((kind for cls, kind in kinds if isinstance(value, cls)), type(value).__name__)


def _message(error: ErrorDetails) -> tuple[str | None, str]:
    """The key a pydantic error is about (None: the table itself) and a one-line message naming it."""
    loc = error["loc"]
    key = str(loc[0]) if loc else None
    kind = error["type"]
    if key is None:
        return None, f"schedule must be a table, not {_shown(error['input'])}"
    if kind == "extra_forbidden":
        return key, f"unknown key {key!r}; expected {', '.join(KEYS)}"
    if kind == "missing":
        return None, f"schedule is missing {key!r}"
    if kind == "value_error" and "error" in error.get("ctx", {}):
        return key, str(error.get("ctx", {})["error"])
    rule = RULES.get(key, f"{key} is not valid")
    if len(loc) > 1 and isinstance(loc[1], int):
        return key, f"{rule}; item {loc[1] + 1} is {_shown(error['input'])}"
    if kind in ("too_short", "string_too_short"):
        return key, rule
    return key, f"{rule}, not {_shown(error['input'])}"


def _table_issues(exc: ValidationError, lines: TableLines) -> list[ScheduleIssue]:
    issues = (ScheduleIssue(lines.of(key), message) for key, message in map(_message, exc.errors()))
    return list(dict.fromkeys(issues))  # one issue per line and message, in pydantic's order


def _by_line(issues: Sequence[ScheduleIssue]) -> list[ScheduleIssue]:
    return sorted(issues, key=lambda issue: issue.line)


def parse_schedules(text: str, base_dir: Path) -> tuple[list[Schedule], list[ScheduleIssue]]:
    """The schedules of the tables that are valid, and every problem, by line; paths from base_dir."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line, message = toml_error(exc)
        return [], [ScheduleIssue(line, f"invalid TOML: {message}")]
    top, tables = locate_tables(text)
    issues = [
        ScheduleIssue(top.get(key, 0), f"unknown key {key!r}; expected [[schedule]]")
        for key in document
        if key != "schedule"
    ]
    raw = document.get("schedule", [])
    if not isinstance(raw, list):
        return [], _by_line([*issues, ScheduleIssue(top.get("schedule", 0), "schedule must be [[schedule]]")])
    if len(tables) != len(raw):  # an inline array of tables, or a header the scan missed
        tables = [TableLines(header=top.get("schedule", 0)) for _ in raw]
    schedules: list[Schedule] = []
    first_line: dict[str, int] = {}
    for table, lines in zip(raw, tables, strict=True):
        try:
            parsed = ScheduleTable.model_validate(table)
        except ValidationError as exc:
            issues.extend(_table_issues(exc, lines))
            parsed = None
        name = table.get("name") if isinstance(table, dict) else None
        if isinstance(name, str) and name in first_line:
            message = f"duplicate schedule name {name!r} (first at line {first_line[name]})"
            issues.append(ScheduleIssue(lines.of("name"), message))
            continue
        if isinstance(name, str):
            first_line[name] = lines.header
        if parsed is not None:
            schedules.append(parsed.to_schedule(lines, base_dir))
    if not raw and not issues:
        issues.append(ScheduleIssue(0, "no [[schedule]] table"))
    return schedules, _by_line(issues)


def check_paths(schedules: Sequence[Schedule]) -> list[ScheduleIssue]:
    """Folders and model files that do not exist on this machine (what validating adds to parsing)."""
    issues: list[ScheduleIssue] = []
    for schedule in schedules:
        for folder in schedule.folders:
            if not folder.is_dir():
                issues.append(
                    ScheduleIssue(schedule.folders_line, f"{schedule.name}: not a folder: {folder}")
                )
        if schedule.model is not None and not schedule.model.is_file():
            message = f"{schedule.name}: model file not found: {schedule.model}"
            issues.append(ScheduleIssue(schedule.model_line, message))
    return issues


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        issue = ScheduleIssue(0, f"cannot read: {exc.strerror or exc}")
        raise ScheduleConfigError(str(path), [issue]) from exc
    except UnicodeDecodeError as exc:
        issue = ScheduleIssue(0, f"cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})")
        raise ScheduleConfigError(str(path), [issue]) from exc


def load_schedules_file(path: Path) -> list[Schedule]:
    """The schedules of a TOML file; raises ScheduleConfigError listing every problem."""
    schedules, issues = parse_schedules(_read(path), path.expanduser().resolve().parent)
    if issues:
        raise ScheduleConfigError(str(path), issues)
    return schedules


def validate_schedules_file(path: Path) -> tuple[list[Schedule], list[ScheduleIssue]]:
    """The valid schedules and every problem by line, with missing folders and models of valid tables."""
    try:
        text = _read(path)
    except ScheduleConfigError as exc:
        return [], exc.issues
    schedules, issues = parse_schedules(text, path.expanduser().resolve().parent)
    return schedules, _by_line([*issues, *check_paths(schedules)])


def _env_issue(error: ErrorDetails) -> ScheduleIssue:
    if error["type"] == "missing":  # folders or cron, the other one being set
        return ScheduleIssue(0, ENV_TOGETHER)
    key, message = _message(error)
    return ScheduleIssue(0, f"{ENV_NAMES.get(key or '', 'DETQ_SCHEDULE_*')}: {message}")


def schedule_from_environment(
    *, name: str, folder: Path | None, cron: str | None, timezone: str, pool: JobPool | str
) -> Schedule | None:
    """The single-folder schedule of DETQ_SCHEDULE_*: None when neither folder nor cron is set."""
    if folder is None and not cron:
        return None
    raw: dict[str, Any] = {"name": name, "timezone": timezone, "pool": pool}
    if folder is not None:
        raw["folders"] = [str(folder.expanduser().resolve())]
    if cron:
        raw["cron"] = cron
    try:
        return ScheduleTable.model_validate(raw).to_schedule(TableLines(header=0), Path.cwd())
    except ValidationError as exc:
        issues = list(dict.fromkeys(map(_env_issue, exc.errors())))
        raise ScheduleConfigError("environment", issues) from None


def combine_schedules(file_schedules: Sequence[Schedule], env_schedule: Schedule | None) -> list[Schedule]:
    """The file's schedules plus the environment's; a name given twice is an error."""
    combined = list(file_schedules)
    if env_schedule is not None:
        if any(s.name == env_schedule.name for s in combined):
            message = f"schedule {env_schedule.name!r} is defined in the file and the environment"
            raise ScheduleConfigError("environment", [ScheduleIssue(0, message)])
        combined.append(env_schedule)
    return combined
