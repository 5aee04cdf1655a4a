"""`detq worker`'s start in its main process: what it says before any pool process starts."""

from __future__ import annotations

from pathlib import Path

from detq.host import usable_memory_bytes
from detq.settings import Settings
from worker.pool import PEAK_BYTES_PER_PIXEL, memory_warning, root_warning


def test_a_worker_started_as_root_says_what_it_can_read_and_what_to_do(tmp_path: Path) -> None:
    bare = Settings(_env_file=None, data_dir=tmp_path)
    confined = Settings(_env_file=None, data_dir=tmp_path, allowed_roots=str(tmp_path))
    # As any other user, nothing to say
    assert root_warning(1000, bare) is None and root_warning(1000, confined) is None
    # As root: what it can read, and the two remedies
    said = root_warning(0, bare)
    assert said is not None and said.startswith("running as root: this worker can read any file root can")
    assert "run it as an unprivileged user" in said and "set DETQ_ALLOWED_ROOTS to the folders" in said
    # With DETQ_ALLOWED_ROOTS set, it names them
    said = root_warning(0, confined)
    assert said is not None and f"reads are confined to DETQ_ALLOWED_ROOTS ({tmp_path.resolve()})" in said


def test_a_worker_whose_processes_could_not_hold_the_largest_photo_says_what_limit_would_fit(
    tmp_path: Path,
) -> None:
    gib = 2**30
    # Where each process has room for a 100 MP photo's peak, nothing to say
    assert memory_warning(100_000_000, 2, 24 * gib) is None
    # Where 16 processes share 32 GiB (2 GiB each): how much it could take, and the limit that fits
    said = memory_warning(100_000_000, 16, 32 * gib)
    assert said is not None and "can take a pool process to about 4.5 GiB" in said
    assert "2.0 GiB for each of 16 processes" in said
    assert f"set DETQ_MAX_IMAGE_PIXELS={2 * gib // PEAK_BYTES_PER_PIXEL}" in said
    # And the memory read is the machine's, or a cgroup's limit where lower
    limit = tmp_path / "memory.max"
    limit.write_text("1073741824\n")
    assert usable_memory_bytes(limit) == gib
    limit.write_text("max\n")
    assert usable_memory_bytes(limit) == usable_memory_bytes(tmp_path / "none") > gib
