"""Facts about this host that producers and workers both need."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def usable_cores() -> int:
    """Cores this process may run on (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def usable_memory_bytes(cgroup: Path = Path("/sys/fs/cgroup/memory.max")) -> int:
    """Memory this process's processes may use: the machine's, or its cgroup's limit where lower (a
    container's, cgroup v2)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = cgroup.read_text().strip()
    except OSError:
        return int(physical)
    return int(min(physical, int(limit))) if limit.isdigit() else int(physical)


def python_command(*args: str) -> list[str]:
    """This interpreter running args (`-m module ...`, `-c code`) with the working directory kept off
    sys.path (-P, Python 3.11): `python -m` and `-c` otherwise put it first, and a user's own worker.py or
    db.py, or a clone's folder named detq/, beside them would shadow detq's packages in the child."""
    return [sys.executable, "-P", *args]
