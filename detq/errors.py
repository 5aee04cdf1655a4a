"""The base of errors a user can act on: the CLI prints their message on one line, never a traceback."""

from __future__ import annotations


class DetqError(Exception):
    """A problem with what the user asked for or configured, with a message that says what to do."""
