"""Line numbers in a TOML document that tomllib does not keep: keys, [[schedule]] tables, syntax errors."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field

_TABLE_HEADER = re.compile(r"^\s*\[\[\s*schedule\s*\]\]")
_ANY_HEADER = re.compile(r"^\s*\[\[?\s*\"?([A-Za-z0-9_-]+)?")
# `key =`, `"key" =` and the first part of a dotted key (`key.sub =`).
_KEY_LINE = re.compile(r"^\s*\"?([A-Za-z0-9_-]+)\"?\s*[.=]")
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column \d+\)")


@dataclass
class TableLines:
    """Line numbers of one [[schedule]] table and of the keys in it (first occurrence of each)."""

    header: int
    keys: dict[str, int] = field(default_factory=dict)

    def of(self, key: str | None) -> int:
        """The line of key in this table; the header's for a key it does not have (a missing key)."""
        return self.keys.get(key, self.header) if key is not None else self.header


def locate_tables(text: str) -> tuple[dict[str, int], list[TableLines]]:
    """Top-level key and table lines, and each [[schedule]] table's lines, by a light line scan."""
    top: dict[str, int] = {}
    tables: list[TableLines] = []
    current: TableLines | None = None
    in_other_table = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _TABLE_HEADER.match(line):
            current, in_other_table = TableLines(header=number), False
            tables.append(current)
            top.setdefault("schedule", number)
            continue
        header = _ANY_HEADER.match(line)
        if header is not None:
            current, in_other_table = None, True
            if header.group(1):
                top.setdefault(header.group(1), number)
            continue
        key = _KEY_LINE.match(line)
        if key is None:
            continue
        target = current.keys if current is not None else (None if in_other_table else top)
        if target is not None:
            target.setdefault(key.group(1), number)
    return top, tables


def toml_error(exc: tomllib.TOMLDecodeError) -> tuple[int, str]:
    """The line tomllib names in its message (0 if none) and the message without its position."""
    position = _TOML_POSITION.search(str(exc))
    return (int(position.group(1)) if position else 0), _TOML_POSITION.sub("", str(exc)).strip()
