"""A command's start-up: its imports are not walked by the garbage collector over and over."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

COUNT_COLLECTIONS = """
import gc, runpy, sys
runs = [0]
gc.callbacks.append(lambda phase, info: runs.__setitem__(0, runs[0] + (phase == "start")))
sys.argv = ["detq", "jobs", "--json"]
try:
    runpy.run_module("cli", run_name="__main__")
finally:
    print(runs[0], file=sys.stderr)
"""


def test_a_command_that_opens_the_ledger_collects_garbage_a_few_times_not_hundreds(tmp_path: Path) -> None:
    # Given an empty embedded deployment
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETQ_")}
    env["DETQ_DATA_DIR"] = str(tmp_path / "data")
    # When `detq jobs` runs (the CLI, settings, SQLAlchemy and the ledger imported, the database created)
    done = subprocess.run(
        [sys.executable, "-c", COUNT_COLLECTIONS],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Then it lists no job, and the collector ran a few dozen times at most (at Python's default
    # thresholds: about 190)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    runs = int(done.stderr.strip().splitlines()[-1])
    assert runs < 40, runs
