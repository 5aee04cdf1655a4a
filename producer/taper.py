"""Batch sizes that taper at a job's end, so its pool processes finish together instead of one by one."""

from __future__ import annotations

from math import ceil


def tapered_sizes(count: int, batch_size: int, processes: int) -> list[int]:
    """Sizes of batches for the last `count` images of a job served by `processes` pool processes.

    Full batches while more than 2 x processes x batch_size images remain; then each batch takes about
    the remainder / (2 x processes), down to an eighth of batch_size (at least 1). With full batches to
    the end, the process that takes the last one runs it alone while the others idle (up to a whole
    batch); guided self-scheduling like this bounds that to a small batch, for a few more tasks. With
    fewer than two processes there is nothing to even out: full batches throughout.
    """
    if count <= 0:
        return []
    if processes < 2:
        return [min(batch_size, count - start) for start in range(0, count, batch_size)]
    smallest = max(1, batch_size // 8)
    sizes: list[int] = []
    remaining = count
    while remaining > 0:
        size = min(remaining, batch_size, max(smallest, ceil(remaining / (2 * processes))))
        sizes.append(size)
        remaining -= size
    return sizes
