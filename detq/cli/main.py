"""The `detq` command: the root group, every role's commands, and the process exit code."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import click

from detq import __version__
from detq.cli import admin, demos, fleet, jobs, lifecycle, pictures, run, schedules, workers
from detq.cli.base import EXIT_OK, DetqGroup

EXIT_INTERRUPTED = 130


@click.group(
    cls=DetqGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog="Run `detq COMMAND --help` for a command's options and examples. Configuration: DETQ_* variables "
    "or a .env file (README, Configuration).",
)
@click.version_option(__version__, "-V", "--version", prog_name="detq", message="%(prog)s %(version)s")
def cli() -> None:
    """Run a trained object detector over folders of images with Celery GPU and CPU pools."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


for command in (
    run.run,
    jobs.enqueue,
    jobs.status,
    jobs.jobs,
    jobs.export,
    jobs.requeue,
    lifecycle.cancel,
    lifecycle.delete,
    pictures.render,
    pictures.report,
    workers.worker,
    workers.model,
    fleet.workers,
    fleet.info,
    schedules.schedule,
    schedules.scheduler,
    schedules.runs,
    admin.db,
    admin.flower,
    admin.completion,
    demos.demo,
):
    cli.add_command(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `detq` console command; returns the exit code."""
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
