"""Run the detq CLI for a test: with DETQ_TEST_TORCH_MARK set, `import torch` is forbidden (an attempt
writes that file and fails).

Under libfaketime (DETQ_TEST_FAKED_CLOCK set) time.sleep waits on an event instead: libfaketime 0.9.10
breaks Python 3.11's sleep, an absolute CLOCK_MONOTONIC clock_nanosleep, with EINVAL when the monotonic
clock is left alone (https://github.com/wolfcw/libfaketime/issues/426); a relative wait is unaffected."""

from __future__ import annotations

import importlib.abc
import os
import sys
import threading
import time
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

MARK_VARIABLE = "DETQ_TEST_TORCH_MARK"  # read by this test wrapper only, not by detq
FAKED_CLOCK_VARIABLE = "DETQ_TEST_FAKED_CLOCK"  # likewise


class TorchBlocker(importlib.abc.MetaPathFinder):
    """Refuses torch and records who asked."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "torch" or fullname.startswith("torch."):
            with open(os.environ[MARK_VARIABLE], "a") as mark:
                mark.write(f"{fullname}\n")
            raise ImportError(f"{fullname} is forbidden in this process")
        return None


def relative_sleep(seconds: float) -> None:
    """time.sleep as a relative wait (libfaketime issue 426)."""
    threading.Event().wait(seconds)


if __name__ == "__main__":
    if os.environ.get(MARK_VARIABLE):
        sys.meta_path.insert(0, TorchBlocker())
    if os.environ.get(FAKED_CLOCK_VARIABLE):
        time.sleep = relative_sleep
    from cli.main import main

    sys.exit(main(sys.argv[1:]))
