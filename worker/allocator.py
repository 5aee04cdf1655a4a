"""The C allocator of a pool process: large image buffers reused from the heap, given back when idle."""

from __future__ import annotations

import ctypes
import functools

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
LARGE_BUFFER_BYTES = 1024 * 1024 * 1024
KEEP_FREE_BYTES = 2**31 - 1  # the largest value mallopt takes: the heap is not trimmed while at work


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, where this process has it (mallopt and malloc_trim are glibc's)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_large_buffers(threshold_bytes: int = LARGE_BUFFER_BYTES) -> bool:
    """Serve allocations up to threshold_bytes from the heap and keep the heap's free memory (up to 2 GB)
    while the process works; False where the C library is not glibc or refuses either setting.

    glibc maps every allocation above its threshold (at most 32 MB by its own tuning) freshly with mmap and
    unmaps it when freed, and gives the free top of its heap back past 128 KB. A 12 MP photo's pixels (36 MB
    as an array, 48 MB in Pillow) and its float copies (144 MB each: ours and the normalisation of a
    torchvision model) are such buffers, so each image paid for faulting in new zeroed pages. Kept in the
    heap, the buffers of one photo are reused by the next. A smaller keep is not enough: a 12 MP photo
    leaves about 540 MB free at the top of the heap, and with 512 MB kept one of the two pool processes
    gave it back and faulted it in again photo after photo in five short jobs out of nine (on PostgreSQL;
    docs/benchmarks.md); 24 MP photos ran 2.5x as fast end to end with this keep. The cost, a process
    holds on to the memory of its largest photo, lasts while it works: give_back_free_memory returns it
    once the process idles (worker/idle_memory.py).
    """
    libc = _glibc()
    if libc is None:
        return False
    mapped = libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold_bytes))
    kept = libc.mallopt(ctypes.c_int(M_TRIM_THRESHOLD), ctypes.c_int(KEEP_FREE_BYTES))
    return bool(mapped) and bool(kept)


def give_back_free_memory() -> bool:
    """Return the heap's free pages to the system (glibc's malloc_trim); False where nothing was returned
    or the C library is not glibc."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(ctypes.c_size_t(0)))
