"""The `detq` command: the root group, every role's commands, and the process exit code."""

from __future__ import annotations

import gc
import importlib
import logging
import sys
from collections.abc import Sequence

import click

from cli.base import EXIT_OK, DetqGroup
from detq import __version__
from detq.speedups import COMMAND_GC_THRESHOLDS

EXIT_INTERRUPTED = 130

# Each command's module is imported only when that command runs (or `--help` lists them): a command
# starts without the database drivers, Celery, rich or Pillow that other commands need.
COMMANDS = {
    "run": "cli.run:run",
    "enqueue": "cli.jobs:enqueue",
    "status": "cli.jobs:status",
    "jobs": "cli.jobs:jobs",
    "export": "cli.jobs:export",
    "requeue": "cli.jobs:requeue",
    "cancel": "cli.lifecycle:cancel",
    "delete": "cli.lifecycle:delete",
    "render": "cli.pictures:render",
    "report": "cli.pictures:report",
    "worker": "cli.workers:worker",
    "model": "cli.workers:model",
    "workers": "cli.info:workers",
    "info": "cli.info:info",
    "schedule": "cli.schedules:schedule",
    "scheduler": "cli.schedules:scheduler",
    "runs": "cli.schedules:runs",
    "db": "cli.admin:db",
    "flower": "cli.admin:flower",
    "completion": "cli.admin:completion",
    "demo": "cli.demos:demo",
}


class RootGroup(DetqGroup):
    """The `detq` group: commands by role, each loaded from COMMANDS when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Commands in role order."""
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, its module imported now."""
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attribute = target.split(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """As click's, with did-you-mean over the commands not loaded yet."""
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            raise click.exceptions.NoSuchCommand(exc.command_name, possibilities=COMMANDS, ctx=ctx) from None


@click.group(
    cls=RootGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog="Run `detq COMMAND --help` for a command's options and examples. Configuration: DETQ_* variables "
    "or a .env file (docs/configuration.md).",
)
@click.version_option(__version__, "-V", "--version", prog_name="detq", message="%(prog)s %(version)s")
def cli() -> None:
    """Run a trained object detector over folders of images with Celery GPU and CPU pools."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `detq` console command; returns the exit code."""
    # A command's start-up is imports: some 300,000 objects that live as long as it does. At Python's
    # default thresholds the collector walked them about 200 times during a `detq enqueue`; at these, about
    # 13 times (detq.speedups, COMMAND_GC_THRESHOLDS). DetqCommand.invoke then freezes what the imports made.
    gc.set_threshold(*COMMAND_GC_THRESHOLDS)
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None, prog_name="detq", standalone_mode=False
        )
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        click.echo("", err=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `detq export ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return EXIT_OK
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_OK if exc.code is None else 1
    return result if isinstance(result, int) else EXIT_OK
