"""Operating commands: migrate the database, run Flower, print a shell-completion script."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess

import click
from click.shell_completion import get_completion_class

from cli.base import DetqCommand, DetqGroup, examples, load_settings
from cli.output import print_json
from db.ledger import open_ledger
from db.migrate import current_revision, head_revision, upgrade
from detq.host import python_command

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
    with open_ledger(load_settings(), check_schema=False) as led:
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
    with open_ledger(load_settings(), check_schema=False) as led:
        revision = current_revision(led.engine)
    head = head_revision()
    if as_json:
        print_json({"revision": revision, "head": head})
    else:
        click.echo(revision or "empty (run: detq db upgrade)")


@click.command(
    cls=DetqCommand,
    epilog=examples(
        "detq flower",
        "DETQ_FLOWER_BASIC_AUTH=ops:secret detq flower --address 0.0.0.0 --port 8080",
        "detq flower --no-auth   # no sign-in: anyone who reaches the port sees tasks and workers",
    ),
)
@click.option(
    "--port", type=click.IntRange(1, 65535), default=5555, show_default=True, help="Port to serve on."
)
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on.",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Serve without sign-in (its pages show task arguments and worker names to whoever reaches them).",
)
def flower(port: int, address: str, no_auth: bool) -> None:
    """Run Celery Flower on the configured broker, behind a sign-in.

    Needs the flower extra: pip install 'detq[flower]'. Listens on 127.0.0.1 unless told otherwise. Its
    sign-in is DETQ_FLOWER_BASIC_AUTH (user:password pairs); without one, a password is made for this run
    and printed once.
    """
    settings = load_settings()
    auth = None if no_auth else settings.flower_basic_auth
    if auth is None and not no_auth:
        password = secrets.token_urlsafe(18)
        auth = f"{GENERATED_USER}:{password}"
        click.echo(
            f"detq flower: sign in as {GENERATED_USER} with password {password} (made for this run, as"
            " DETQ_FLOWER_BASIC_AUTH is not set; set it to user:password to choose one)",
            err=True,
        )
    elif no_auth:
        click.echo(
            f"detq flower: --no-auth: whoever reaches {address}:{port} sees tasks and workers", err=True
        )
    argv, env = flower_command(address=address, port=port, auth=auth)
    raise SystemExit(run_until_stopped(argv, env))


GENERATED_USER = "detq"


def flower_command(*, address: str, port: int, auth: str | None) -> tuple[list[str], dict[str, str]]:
    """Flower's command line and environment: the broker URL and credentials travel in the environment
    (the child reads detq's settings from it, cli.flower_app), never on the command line, where any
    local user could read them (ps). auth: Flower's basic auth (user:password pairs); None: none."""
    env = dict(os.environ)
    env.pop("FLOWER_BASIC_AUTH", None)  # Flower's own variable, from the shell, is not a sign-in detq chose
    if auth:
        env["FLOWER_BASIC_AUTH"] = auth
    argv = python_command("-m", "cli.flower_app", f"--address={address}", f"--port={port}")
    return argv, env


def run_until_stopped(argv: list[str], env: dict[str, str]) -> int:
    """Run a child, passing SIGTERM and SIGINT on to it, so it never outlives this process."""
    child = subprocess.Popen(argv, env=env)

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
