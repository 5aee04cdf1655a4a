"""Parse a detq command line the way `detq` would, without running it."""

from __future__ import annotations

from collections.abc import Sequence

import click

from cli.main import cli


def parse_command_line(args: Sequence[str]) -> click.Command:
    """The command a command line names, after click parsed every option of every level (raises if bad)."""
    ctx = cli.make_context("detq", list(args))
    command: click.Command = cli
    rest = [*ctx.protected_args, *ctx.args]
    while isinstance(command, click.Group):
        name, sub, rest = command.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        command, rest = sub, [*ctx.protected_args, *ctx.args]
    return command
