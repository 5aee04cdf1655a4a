"""What every detq command shares: the group and command classes, settings loading, errors as one line."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import click

from detq.display import visible
from detq.errors import DetqError
from detq.setting_values import SettingsError
from detq.settings import Settings, get_settings

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class ConfigError(DetqError):
    """A DETQ_* variable or the .env file holds a value detq cannot use."""

    exit_code = EXIT_USAGE


class CommandError(click.ClickException):
    """A DetqError shown as `detq COMMAND: message` on standard error, with its exit code."""

    def __init__(self, command_path: str, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.command_path = command_path
        # click types exit_code as a class variable; an instance value is what its callers read.
        self.exit_code = code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        """One line per message line, each prefixed with the command, as compilers print errors."""
        for line in self.format_message().splitlines() or [""]:
            click.echo(f"{self.command_path}: {visible(line)}", err=True)


class DetqCommand(click.Command):
    """A command whose DetqErrors end it with their message and exit code instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command, turning DetqError into CommandError."""
        # What the imports made lives as long as the command: out of the collector's sight, the full
        # collections of a long command (an enqueue of 100,000 files) no longer walk it (0.15-0.25 s less).
        gc.freeze()
        try:
            return super().invoke(ctx)
        except DetqError as exc:
            raise CommandError(ctx.command_path, str(exc), getattr(exc, "exit_code", EXIT_ERROR)) from exc
        except Exception as exc:
            # A resource away (the ledger's disk full, the database down or locked past the retries, a
            # full disk under the embedded broker) is one line, as any error a user can act on. (Imported
            # here: a command that never meets one does not pay for the retry layer's imports.)
            from db.retry import unavailable_reason

            away = unavailable_reason(exc)
            if away is None:
                raise
            raise CommandError(
                ctx.command_path, f"{away}; nothing was lost: try again once it is back"
            ) from exc


class DetqGroup(click.Group):
    """A group whose commands are DetqCommands and whose subgroups are DetqGroups."""

    command_class = DetqCommand
    group_class = type

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Commands in the order they were added (by role), not alphabetically."""
        return list(self.commands)


def load_settings() -> Settings:
    """The process's settings; a bad DETQ_* value is a ConfigError naming each variable."""
    try:
        return get_settings()
    except SettingsError as exc:
        raise ConfigError(f"bad configuration: {exc}") from None


def as_saved_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """--as-saved: every speed-up off (detq.speedups), as DETQ_AS_SAVED=true."""
    return click.option(
        "--as-saved",
        is_flag=True,
        help="Every speed-up off: the model as its file has it, one image a forward (DETQ_AS_SAVED).",
    )(command)


def examples(*lines: str) -> str:
    """An epilog of example command lines, kept as written by click's help formatter."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def inference_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--conf, --classes, --imgsz and --force: the settings a job's results are made with, and a run of
    every file whatever earlier runs at the same settings did."""
    options = [
        click.option(
            "--conf",
            type=click.FloatRange(0.0, 1.0),
            help="Keep detections scoring at least this (default: DETQ_SCORE_THRESHOLD, else the model's).",
        ),
        click.option(
            "--classes",
            metavar="NAMES",
            help="Keep only these classes: names or label ids, comma-separated (default: DETQ_CLASSES, all).",
        ),
        click.option(
            "--imgsz",
            metavar="H,W",
            help="Input size of a fixed-input model, one number for a square (default: DETQ_INPUT_SIZE).",
        ),
        click.option(
            "--force",
            is_flag=True,
            help="Run every file again, even those done before by this model at these settings.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def with_inference_flags(
    settings: Settings, conf: float | None, classes: str | None, imgsz: str | None
) -> Settings:
    """The settings with the flags given folded in, each checked as its DETQ_* variable is."""
    updates: dict[str, Any] = {}
    if conf is not None:
        updates["score_threshold"] = conf
    if classes is not None:
        updates["classes"] = classes
    if imgsz is not None:
        updates["input_size"] = imgsz
    try:
        return settings.replace(**updates) if updates else settings
    except SettingsError as exc:
        message = str(exc).replace("DETQ_SCORE_THRESHOLD", "--conf").replace("DETQ_CLASSES", "--classes")
        raise click.UsageError(message.replace("DETQ_INPUT_SIZE", "--imgsz")) from None
