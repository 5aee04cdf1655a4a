"""Confine reads to a job's root and DETQ_ALLOWED_ROOTS, following symlinks before checking."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path


class PathRejected(Exception):
    """The path may not be read: it escapes its root, is not a regular file, or is not allowed."""


def resolve_confined(path: str, root: str, allowed_roots: Sequence[Path]) -> Path:
    """Resolve `path` (symlinks followed) and return it if it is a regular file inside root and allowed roots.

    Raises FileNotFoundError when the file is gone, PathRejected when policy forbids reading it.
    """
    resolved = Path(os.path.realpath(path))
    root_resolved = Path(os.path.realpath(root))
    if not resolved.is_relative_to(root_resolved):
        raise PathRejected(f"path resolves to {resolved}, outside the job root {root_resolved}")
    if allowed_roots and not any(resolved.is_relative_to(allowed) for allowed in allowed_roots):
        raise PathRejected(f"path {resolved} is outside DETQ_ALLOWED_ROOTS")
    mode = os.stat(resolved).st_mode
    if not stat.S_ISREG(mode):
        raise PathRejected(f"not a regular file: {resolved}")
    return resolved
