"""How commands print: one JSON object per call with --json, aligned tables with headers otherwise."""

from __future__ import annotations

import json
from collections.abc import Sequence

import click

from detq.display import visible


def print_json(obj: object) -> None:
    """One line of JSON on standard output (dates and paths as strings)."""
    click.echo(json.dumps(obj, default=str, ensure_ascii=False))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows under a header line, columns padded to their widest cell; numbers right-aligned."""
    cells = [[str(h).upper() for h in headers]]
    cells += [["" if c is None else visible(str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(isinstance(row[i], int | float) and not isinstance(row[i], bool) for row in rows) and bool(rows)
        for i in range(len(headers))
    ]
    lines = []
    for row in cells:
        padded = [
            cell.rjust(width) if is_number else cell.ljust(width)
            for cell, width, is_number in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)
