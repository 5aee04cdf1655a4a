"""Operating commands: migrate the database, run Flower, print a shell-completion script."""

from __future__ import annotations

import subprocess
import sys

import click
from click.shell_completion import get_completion_class

from db.ledger import ledger
from db.migrate import current_revision, head_revision, upgrade
from detq.cli.base import DetqCommand, DetqGroup, examples, load_settings
from detq.cli.output import print_json

SHELLS = ("bash", "zsh", "fish")


@click.group(cls=DetqGroup)
def db() -> None:
    """Migrate the database, or show its revision."""


@db.command(
    "upgrade", epilog=examples("detq db upgrade", "DETQ_DATABASE_URL=postgresql://... detq db upgrade")
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def db_upgrade(as_json: bool) -> None:
    """Migrate the database to the newest schema.

    Once per release, from any machine; the embedded SQLite default migrates itself.
    """
    with ledger(load_settings(), check_schema=False) as led:
        upgrade(led.engine)
        revision = current_revision(led.engine)
    if as_json:
        print_json({"revision": revision})
    else:
        click.echo(f"database at revision {revision}")


@db.command("current", epilog=examples("detq db current"))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def db_current(as_json: bool) -> None:
    """Print the database's schema revision."""
    with ledger(load_settings(), check_schema=False) as led:
        revision = current_revision(led.engine)
    head = head_revision()
    if as_json:
        print_json({"revision": revision, "head": head})
    else:
        click.echo(revision or "empty (run: detq db upgrade)")


@click.command(cls=DetqCommand, epilog=examples("detq flower", "detq flower --port 8080"))
@click.option(
    "--port", type=click.IntRange(1, 65535), default=5555, show_default=True, help="Port to serve on."
)
def flower(port: int) -> None:
    """Run Celery Flower on the configured broker.

    Needs the flower extra: pip install 'detq[flower]'.
    """
    settings = load_settings()
    command = [sys.executable, "-m", "celery", "--broker", settings.resolved_broker_url, "flower"]
    raise SystemExit(subprocess.call([*command, f"--port={port}"]))


@click.command(
    cls=DetqCommand,
    epilog=examples(
        'eval "$(detq completion bash)"      # in ~/.bashrc',
        'eval "$(detq completion zsh)"       # in ~/.zshrc',
        "detq completion fish > ~/.config/fish/completions/detq.fish",
    ),
)
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print a shell-completion script."""
    completer = get_completion_class(shell)
    if completer is None:  # pragma: no cover - every listed shell has a class in click
        raise click.BadParameter(shell)
    root = ctx.find_root().command
    click.echo(completer(root, {}, "detq", "_DETQ_COMPLETE").source())
