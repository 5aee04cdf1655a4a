"""Files written whole or not at all: beside their final name, then renamed over it once complete."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, TypeVar

from detq.errors import DetqError

T = TypeVar("T")


def write_atomically(path: Path, write: Callable[[TextIO], T]) -> T:
    """Call write() on a temporary file beside path and rename it over path only when it returns; an
    earlier file at path is untouched by a failure. A missing folder is a DetqError."""
    if not path.parent.is_dir():
        raise DetqError(f"cannot write {path}: folder {path.parent} does not exist")
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with partial.open("w", encoding="utf-8", newline="") as handle:
            result = write(handle)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return result
