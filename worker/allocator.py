"""The C allocator of a pool process: large image buffers reused from the heap instead of mapped anew."""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
LARGE_BUFFER_BYTES = 256 * 1024 * 1024


def keep_large_buffers(threshold_bytes: int = LARGE_BUFFER_BYTES) -> bool:
    """Serve allocations up to threshold_bytes from the heap and keep up to twice that of free heap;
    False where the C library is not glibc or refuses either setting.

    glibc maps every allocation above its threshold (at most 32 MB by its own tuning) freshly with mmap and
    unmaps it when freed, and gives the free top of its heap back past 128 KB. A 12 MP photo's pixels (36 MB
    as an array, 48 MB in Pillow) are such buffers, so each image paid for faulting in new zeroed pages:
    about half of its decode and letterbox time here. Kept in the heap, the buffers of one micro-batch are
    reused by the next. The cost: a process holds on to the memory of its largest micro-batch, which is its
    peak anyway and which its next large batch needs again.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mapped = mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold_bytes))
    trimmed = mallopt(ctypes.c_int(M_TRIM_THRESHOLD), ctypes.c_int(2 * threshold_bytes))
    return bool(mapped) and bool(trimmed)
