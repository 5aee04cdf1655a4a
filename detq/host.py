"""Facts about this host that producers and workers both need."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)
