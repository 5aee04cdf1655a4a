"""Confine reads to a job's root and DETQ_ALLOWED_ROOTS: open once, then check what was opened."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

# O_NONBLOCK: opening a FIFO for reading must not wait for a writer; it is refused just below.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class PathRejected(Exception):
    """The path may not be read: it escapes its root, is not a regular file, or is not allowed."""


@dataclass
class ConfinedFile:
    """An open regular file inside the job root, with where it really is; decode from `handle` only."""

    handle: BinaryIO
    real_path: Path
    size: int

    def __enter__(self) -> ConfinedFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.handle.close()


def open_confined(path: str, root: str, allowed_roots: Sequence[Path]) -> ConfinedFile:
    """Open `path` (symlinks followed) and keep it only if what was opened is a regular file inside root
    and the allowed roots.

    The check is on the opened descriptor, not on the name, so swapping a folder for a symlink between
    a check and the open cannot lead outside. `root` was resolved when the job was made and is not
    resolved again: a root replaced by a symlink later does not move it. Raises FileNotFoundError when
    the file is gone, PathRejected when policy forbids reading it.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        real = _opened_path(fd, path, info)
        if not real.is_relative_to(root):
            raise PathRejected(f"path resolves to {real}, outside the job root {root}")
        if allowed_roots and not any(real.is_relative_to(allowed) for allowed in allowed_roots):
            raise PathRejected(f"path {real} is outside DETQ_ALLOWED_ROOTS")
        if not stat.S_ISREG(info.st_mode):
            raise PathRejected(f"not a regular file: {real}")
        return ConfinedFile(handle=os.fdopen(fd, "rb"), real_path=real, size=info.st_size)
    except BaseException:
        os.close(fd)
        raise


def _opened_path(fd: int, path: str, info: os.stat_result) -> Path:
    """Where the descriptor's file really is: from /proc on Linux, else the resolved name if it is the
    same file (device and inode) as the one opened."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # pragma: no cover - no procfs
        real = Path(os.path.realpath(path))
        now = os.stat(real)
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            raise PathRejected(f"{path} changed while it was being opened") from None
        return real
