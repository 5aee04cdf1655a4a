"""Text shown to a person on a terminal: control characters in file names and reasons made visible.

A file name may hold any byte but / and NUL: an escape sequence in one (CSI, OSC) would clear the screen or
retitle the terminal when printed as it is, a newline would forge a line of detq's own. Every line detq
builds from a name or a reason goes through `visible` before it is printed; data files (exports, JSON) keep
the names as they are.
"""

from __future__ import annotations

import logging

_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_ESCAPES.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})


def visible(text: str) -> str:
    """The text with each control character (C0, DEL, C1) written as its escape: ESC as \\x1b, a
    newline as \\n."""
    return text.translate(_ESCAPES)


class VisibleRecords(logging.Filter):
    """A log handler's filter: each record's message with its control characters escaped (a worker's log
    names files and carries reasons; a terminal that tails it is a terminal all the same)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keeps the record; rewrites its message where it held a control character."""
        message = record.getMessage()
        shown = visible(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True


def escape_handlers(logger: logging.Logger) -> None:
    """Give each of the logger's handlers the VisibleRecords filter (once)."""
    for handler in logger.handlers:
        if not any(isinstance(f, VisibleRecords) for f in handler.filters):
            handler.addFilter(VisibleRecords())
