"""Walk folders as a stream and yield the image files in them, without loading the whole tree in memory."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
# A longer path would not fit PostgreSQL's unique index led by images.path (about 2.7 KB per entry).
MAX_PATH_BYTES = 2048


class ScannedFile(NamedTuple):
    """An image file found under one of the job's roots (index into the roots list); a named tuple, as
    one is made per file."""

    path: str
    size_bytes: int
    mtime: float
    root_index: int
    refused: str | None = None  # why it is recorded as rejected instead of queued


def check_name(path: str) -> tuple[str, str | None]:
    """The path as it can be stored, and why it is refused: a name that is not UTF-8, a path too long.

    os.scandir hands back undecodable bytes as surrogates, which no database text column takes: such a
    path is stored with the bytes shown as \\xNN escapes (readable, not openable) and refused.
    """
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return shown, "file name is not valid UTF-8; rename the file to process it"
    if size > MAX_PATH_BYTES:
        digest = hashlib.sha256(path.encode("utf-8")).hexdigest()[:16]  # keeps shortened paths distinct
        return f"{path[:200]}...{digest}", f"path is {size} bytes long, over the limit of {MAX_PATH_BYTES}"
    return path, None


def is_image_name(name: str) -> bool:
    """True for file names with a known image extension (case-insensitive)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def scan_roots(roots: Sequence[Path], *, recursive: bool = True) -> Iterator[ScannedFile]:
    """Yield image files under each root in a stable order; hidden entries and symlinked folders are skipped.

    Symlinked files are yielded as found: the worker resolves them and rejects any that leave the root.
    """
    for index, root in enumerate(roots):
        stack = [str(root)]
        while stack:
            folder = stack.pop()
            try:
                with os.scandir(folder) as entries:
                    listing = sorted(entries, key=lambda e: e.name)
            except OSError:
                continue
            subfolders = []
            for entry in listing:
                if entry.name.startswith("."):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if recursive:
                            subfolders.append(entry.path)
                        continue
                except OSError:
                    continue
                if not is_image_name(entry.name):
                    continue
                try:
                    info = entry.stat()
                    size, mtime = info.st_size, info.st_mtime
                except OSError:  # a dangling symlink: the worker records why it cannot be read
                    size, mtime = 0, 0.0
                stored, refused = check_name(entry.path)
                yield ScannedFile(stored, size, mtime, index, refused)
            stack.extend(reversed(subfolders))
