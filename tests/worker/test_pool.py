"""`detq worker`'s start in its main process: what it says before any pool process starts."""

from __future__ import annotations

from pathlib import Path

from detq.settings import Settings
from worker.pool import root_warning


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
