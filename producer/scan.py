"""Walk folders as a stream and yield the image files in them, without loading the whole tree in memory."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"})


@dataclass(frozen=True)
class ScannedFile:
    """An image file found under one of the job's roots (index into the roots list)."""

    path: str
    size_bytes: int
    mtime: float
    root_index: int


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
                yield ScannedFile(path=entry.path, size_bytes=size, mtime=mtime, root_index=index)
            stack.extend(reversed(subfolders))
