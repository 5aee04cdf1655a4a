"""Watch configuration: schedules from a TOML file or the environment, validated with line numbers."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from producer.cron import CronError, CronSpec

POOLS = ("any", "gpu", "cpu")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
REQUIRED_KEYS = ("name", "folders", "cron")
OPTIONAL_KEYS = ("timezone", "model", "pool", "batch_size", "recursive")
MAX_BATCH_SIZE = 1024

_TABLE_HEADER = re.compile(r"^\s*\[\[\s*schedule\s*\]\]")
_ANY_HEADER = re.compile(r"^\s*\[")
_KEY_LINE = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")
_TOML_POSITION = re.compile(r"\(at line (\d+), column \d+\)")


@dataclass(frozen=True)
class Schedule:
    """A recurring incremental scan of folders with one model on one pool."""

    name: str
    folders: tuple[Path, ...]
    cron: CronSpec
    model: Path | None = None  # None: DETQ_MODEL when the run starts
    pool: str = "any"
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


class ScheduleConfigError(ValueError):
    """A schedules configuration with errors; carries all of them."""

    def __init__(self, source: str, issues: Sequence[ScheduleIssue]) -> None:
        self.source = source
        self.issues = list(issues)
        super().__init__("\n".join(issue.render(source) for issue in self.issues))


@dataclass
class _TableLines:
    """Line numbers of one [[schedule]] table and of the keys in it."""

    header: int
    keys: dict[str, int] = field(default_factory=dict)


def _locate_tables(text: str) -> tuple[dict[str, int], list[_TableLines]]:
    """Top-level key lines and each [[schedule]] table's lines, by a light scan (tomllib keeps none)."""
    top: dict[str, int] = {}
    tables: list[_TableLines] = []
    current: _TableLines | None = None
    in_other_table = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _TABLE_HEADER.match(line):
            current = _TableLines(header=number)
            tables.append(current)
            in_other_table = False
            continue
        if _ANY_HEADER.match(line):
            current, in_other_table = None, True
            continue
        key = _KEY_LINE.match(line)
        if key is None:
            continue
        target = current.keys if current is not None else (None if in_other_table else top)
        if target is not None:
            target.setdefault(key.group(1), number)
    return top, tables


def parse_schedules(text: str, base_dir: Path) -> tuple[list[Schedule], list[ScheduleIssue]]:
    """Schedules of a TOML document and every problem found; relative folders are taken from base_dir."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        position = _TOML_POSITION.search(str(exc))
        message = _TOML_POSITION.sub("", str(exc)).strip()
        return [], [ScheduleIssue(int(position.group(1)) if position else 0, f"invalid TOML: {message}")]
    top_lines, tables = _locate_tables(text)
    issues: list[ScheduleIssue] = []
    for key in document:
        if key != "schedule":
            issues.append(ScheduleIssue(top_lines.get(key, 0), f"unknown key {key!r}; expected [[schedule]]"))
    raw = document.get("schedule", [])
    if not isinstance(raw, list):
        return [], [*issues, ScheduleIssue(top_lines.get("schedule", 0), "schedule must be [[schedule]]")]
    schedules: list[Schedule] = []
    seen: dict[str, int] = {}
    for index, table in enumerate(raw):
        lines = tables[index] if index < len(tables) else _TableLines(header=0)
        schedule, table_issues = _parse_table(table, lines, base_dir)
        issues.extend(table_issues)
        if schedule is None:
            continue
        if schedule.name in seen:
            issues.append(
                ScheduleIssue(
                    lines.keys.get("name", lines.header),
                    f"duplicate schedule name {schedule.name!r} (first at line {seen[schedule.name]})",
                )
            )
            continue
        seen[schedule.name] = schedule.line
        schedules.append(schedule)
    if not raw and not issues:
        issues.append(ScheduleIssue(0, "no [[schedule]] table"))
    return schedules, issues


def _parse_table(
    table: dict[str, Any], lines: _TableLines, base_dir: Path
) -> tuple[Schedule | None, list[ScheduleIssue]]:
    issues: list[ScheduleIssue] = []

    def problem(key: str | None, message: str) -> None:
        issues.append(ScheduleIssue(lines.keys.get(key, lines.header) if key else lines.header, message))

    for key in table:
        if key not in REQUIRED_KEYS and key not in OPTIONAL_KEYS:
            problem(key, f"unknown key {key!r}; expected {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}")
    for key in REQUIRED_KEYS:
        if key not in table:
            problem(None, f"schedule is missing {key!r}")
    name = table.get("name")
    if "name" in table and (not isinstance(name, str) or not NAME_PATTERN.match(name)):
        problem(
            "name", "name must be 1-100 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    folders = table.get("folders")
    paths: list[Path] = []
    if "folders" in table:
        if not isinstance(folders, list) or not folders or not all(isinstance(f, str) and f for f in folders):
            problem("folders", "folders must be a non-empty list of folder paths")
        else:
            paths = [(base_dir / Path(f).expanduser()) for f in folders]
    cron: CronSpec | None = None
    timezone = table.get("timezone", "UTC")
    if not isinstance(timezone, str):
        problem("timezone", "timezone must be a string such as 'Europe/Paris'")
        timezone = "UTC"
    if "cron" in table:
        if not isinstance(table["cron"], str):
            problem("cron", "cron must be a string such as '0 2 * * *'")
        else:
            try:
                cron = CronSpec(table["cron"], timezone)
            except CronError as exc:
                problem("timezone" if "time zone" in str(exc) else "cron", str(exc))
    model = table.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        problem("model", "model must be a path to a model file")
        model = None
    pool = table.get("pool", "any")
    if pool not in POOLS:
        problem("pool", f"pool must be one of {', '.join(POOLS)}, not {pool!r}")
    batch_size = table.get("batch_size")
    valid_batch = isinstance(batch_size, int) and not isinstance(batch_size, bool)
    if batch_size is not None and not (valid_batch and 1 <= batch_size <= MAX_BATCH_SIZE):
        problem("batch_size", f"batch_size must be an integer from 1 to {MAX_BATCH_SIZE}")
    recursive = table.get("recursive", True)
    if not isinstance(recursive, bool):
        problem("recursive", "recursive must be true or false")
    if issues or cron is None or not isinstance(name, str):
        return None, issues
    return (
        Schedule(
            name=name,
            folders=tuple(paths),
            cron=cron,
            model=(base_dir / Path(model).expanduser()) if isinstance(model, str) else None,
            pool=str(pool),
            batch_size=batch_size if isinstance(batch_size, int) else None,
            recursive=bool(recursive),
            line=lines.header,
            folders_line=lines.keys.get("folders", lines.header),
            model_line=lines.keys.get("model", lines.header),
        ),
        [],
    )


def check_paths(schedules: Sequence[Schedule]) -> list[ScheduleIssue]:
    """Folders and model files that do not exist on this machine (what `validate` adds to parsing)."""
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


def load_schedules_file(path: Path) -> list[Schedule]:
    """The schedules of a TOML file; raises ScheduleConfigError listing every problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScheduleConfigError(str(path), [ScheduleIssue(0, f"cannot read: {exc.strerror}")]) from exc
    schedules, issues = parse_schedules(text, path.expanduser().resolve().parent)
    if issues:
        raise ScheduleConfigError(str(path), issues)
    return schedules


def schedule_from_environment(
    *, name: str, folder: Path | None, cron: str | None, timezone: str, pool: str
) -> Schedule | None:
    """The single-folder schedule of DETQ_SCHEDULE_*: None when neither folder nor cron is set."""
    if folder is None and not cron:
        return None
    issues = []
    if folder is None or not cron:
        issues.append(ScheduleIssue(0, "DETQ_SCHEDULE_FOLDER and DETQ_SCHEDULE_CRON must be set together"))
    if not NAME_PATTERN.match(name):
        issues.append(ScheduleIssue(0, f"DETQ_SCHEDULE_NAME {name!r} is not a valid schedule name"))
    if pool not in POOLS:
        issues.append(ScheduleIssue(0, f"DETQ_SCHEDULE_POOL must be one of {', '.join(POOLS)}"))
    spec: CronSpec | None = None
    if cron:
        try:
            spec = CronSpec(cron, timezone)
        except CronError as exc:
            issues.append(ScheduleIssue(0, f"DETQ_SCHEDULE_CRON/TIMEZONE: {exc}"))
    if issues or folder is None or spec is None:
        raise ScheduleConfigError("environment", issues)
    return Schedule(name=name, folders=(folder.expanduser().resolve(),), cron=spec, pool=pool)


def combine_schedules(file_schedules: Sequence[Schedule], env_schedule: Schedule | None) -> list[Schedule]:
    """The file's schedules plus the environment's; a name given twice is an error."""
    combined = list(file_schedules)
    if env_schedule is not None:
        if any(s.name == env_schedule.name for s in combined):
            raise ScheduleConfigError(
                "environment",
                [
                    ScheduleIssue(
                        0, f"schedule {env_schedule.name!r} is defined in the file and the environment"
                    )
                ],
            )
        combined.append(env_schedule)
    return combined
