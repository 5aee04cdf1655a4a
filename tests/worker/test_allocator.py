"""The pool process allocator: large buffers (a 12 MP photo is 36-48 MB, its float copies 144 MB) from the
heap, kept there while the process works, given back on request."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

MB = 1024 * 1024
MB64 = 64 * MB

# Probes run in a child: mallopt changes the whole process, and the test process should keep glibc's
# defaults. Each starts with glibc's malloc, free and statistics (mallinfo2) at hand.
_LIBC = textwrap.dedent(
    """
    import ctypes, sys
    from worker.allocator import give_back_free_memory, keep_large_buffers

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = MallInfo2
    """
)
_PROBE = _LIBC + textwrap.dedent(
    """
    applied = keep_large_buffers() if sys.argv[1] == "keep" else None
    before = libc.mallinfo2().hblkhd
    buffer = libc.malloc(64 * 1024 * 1024)
    mapped = libc.mallinfo2().hblkhd - before
    libc.free(buffer)
    print(applied, mapped, libc.mallinfo2().arena)
    """
)


def _probe(mode: str) -> tuple[str, int, int]:
    """Whether keep_large_buffers applied, bytes newly mapped for a 64 MB buffer, the heap after its free."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_a_large_buffer_comes_from_the_heap_and_stays_there_once_large_buffers_are_kept() -> None:
    applied, mapped, heap = _probe("default")
    assert applied == "None" and mapped >= MB64  # glibc's default: a fresh mapping, unmapped when freed
    assert heap < MB64
    applied, mapped, heap = _probe("keep")
    assert applied == "True" and mapped == 0  # from the heap ...
    assert heap >= MB64  # ... which keeps it for the next buffer, rather than trimming it


# Three buffers of 200 MB freed together leave 600 MB free at the top of the heap, as a 12 MP photo's float
# copies do (about 540 MB for a torchvision model); then the heap is given back. Nothing is touched, so
# nothing is faulted in: the heap's size is address space.
_TOP_PROBE = _LIBC + textwrap.dedent(
    """
    keep_large_buffers()
    before = libc.mallinfo2().hblkhd
    single = libc.malloc(300 * 1024 * 1024)  # a 24 MP photo's float copy is 288 MB
    mapped = libc.mallinfo2().hblkhd - before
    libc.free(single)
    buffers = [libc.malloc(200 * 1024 * 1024) for _ in range(3)]
    for buffer in reversed(buffers):
        libc.free(buffer)
    kept = libc.mallinfo2().arena
    returned = give_back_free_memory()
    print(mapped, kept, returned, libc.mallinfo2().arena)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_the_heap_keeps_a_photos_free_buffers_while_working_and_gives_them_back_on_request() -> None:
    out = subprocess.run([sys.executable, "-c", _TOP_PROBE], capture_output=True, text=True, check=True)
    mapped, kept, returned, after = out.stdout.split()
    assert int(mapped) == 0  # 300 MB from the heap, not a fresh mapping
    assert int(kept) >= 600 * MB  # the free top was not trimmed (a 512 MB keep trimmed it)
    assert returned == "True"
    assert int(after) < 64 * MB  # given back
